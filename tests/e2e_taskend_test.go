package tests

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestTaskEndEndsPassedLease: a task of a restricted account passes its
// lease's descriptor over a Unix socket (SCM_RIGHTS) to a process of the
// same user outside the task, which ignores SIGTERM, and runs on until its
// time limit ends it. At the task's end the account's ACL entry on the
// device is gone at once; the process holding the descriptor is sent
// SIGTERM, then SIGKILL after kill_grace, and the device comes free.
func TestTaskEndEndsPassedLease(t *testing.T) {
	dev := newDevTree(t, 1)
	student := newUser(t)
	b := StartBroker(t, dev.config("0", fmt.Sprintf("[restrict]\nusers = [%q]\n\n[tasks]\nkill_grace = \"1s\"\n", student.Name)))
	dir := userDir(t, &student, 0o755)
	sock := filepath.Join(dir, "pass.sock")
	recv := startProc(t, "receiver", student.as(exec.Command(b.Bin.Workload, "-receive", sock, "-ignore-term"), dir))
	recv.waitLine("listening")

	id := submitTask(t, b, &student, dir, "-n", "1", "--time", "3s", "--log", filepath.Join(dir, "log"),
		"--", "sh", "-c", `"$0" -pass "$1" && exec sleep 600`, b.Bin.Workload, sock)
	recv.waitLine("received")
	if !canOpen(t, student, dev.node("davinci0")) {
		t.Fatal("during the task its user cannot open davinci0: the test shows nothing")
	}

	r := waitTask(t, b, id)
	if !strings.Contains(r.stdout+r.stderr, "time limit") {
		t.Fatalf("task %d did not end at its time limit: %s", id, r)
	}
	if recv.exited() {
		t.Fatal("the receiver exited with the task: the test shows nothing")
	}
	// At once: the wait is answered after the lease's entries are gone.
	if canOpen(t, student, dev.node("davinci0")) {
		t.Errorf("task %d has ended and %s can still open davinci0", id, student.Name)
	}
	pid := recv.cmd.Process.Pid
	b.WaitLog(0, fmt.Sprintf("task %d has ended: pid %d (%s: %s -receive %s -ignore-term) still holds its lease of npu 0: sent SIGTERM", id, pid, student.Name, b.Bin.Workload, sock))
	if _, sig := recv.wait(); sig != syscall.SIGKILL {
		t.Errorf("the receiver ended by %v, want SIGKILL", sig)
	}
	b.WaitLog(0, fmt.Sprintf("pid %d (%s: %s -receive %s -ignore-term) still holds its lease of npu 0: sent SIGKILL", pid, student.Name, b.Bin.Workload, sock))
	waitFree(t, b, 0)
}
