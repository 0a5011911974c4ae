package tasks

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/tests/harness"
)

// TestTaskEndEndsPassedLease: a task of a restricted account passes its
// lease's descriptor over a Unix socket (SCM_RIGHTS) to a process of the
// same user outside the task, which ignores SIGTERM, and runs on until its
// time limit ends it. At the task's end the account's ACL entry on the
// device is gone at once; the process holding the descriptor is sent
// SIGTERM, then SIGKILL after kill_grace, and the device comes free.
func TestTaskEndEndsPassedLease(t *testing.T) {
	dev := harness.NewDevTree(t, 1)
	student := harness.NewUser(t)
	b := harness.StartBroker(t, dev.Config("0", fmt.Sprintf("[restrict]\nusers = [%q]\n\n[tasks]\nkill_grace = \"1s\"\n", student.Name)))
	dir := harness.UserDir(t, &student, 0o755)
	sock := filepath.Join(dir, "pass.sock")
	recv := harness.StartProc(t, "receiver", student.As(exec.Command(b.Bin.Workload, "-receive", sock, "-ignore-term"), dir))
	recv.WaitLine("listening")

	id := harness.SubmitTask(t, b, &student, dir, "-n", "1", "--time", "3s", "--log", filepath.Join(dir, "log"),
		"--", "sh", "-c", `"$0" -pass "$1" && exec sleep 600`, b.Bin.Workload, sock)
	recv.WaitLine("received")
	if !harness.CanOpen(t, student, dev.Node("davinci0")) {
		t.Fatal("during the task its user cannot open davinci0: the test shows nothing")
	}

	r := harness.WaitTask(t, b, id)
	if !strings.Contains(r.Stdout+r.Stderr, "time limit") {
		t.Fatalf("task %d did not end at its time limit: %s", id, r)
	}
	if recv.Exited() {
		t.Fatal("the receiver exited with the task: the test shows nothing")
	}
	// At once: the wait is answered after the lease's entries are gone.
	if harness.CanOpen(t, student, dev.Node("davinci0")) {
		t.Errorf("task %d has ended and %s can still open davinci0", id, student.Name)
	}
	pid := recv.Cmd.Process.Pid
	b.WaitLog(0, fmt.Sprintf("task %d has ended: pid %d (%s: %s -receive %s -ignore-term) still holds its lease of npu 0: sent SIGTERM", id, pid, student.Name, b.Bin.Workload, sock))
	if _, sig := recv.Wait(); sig != syscall.SIGKILL {
		t.Errorf("the receiver ended by %v, want SIGKILL", sig)
	}
	b.WaitLog(0, fmt.Sprintf("pid %d (%s: %s -receive %s -ignore-term) still holds its lease of npu 0: sent SIGKILL", pid, student.Name, b.Bin.Workload, sock))
	harness.WaitFree(t, b, 0)
}

// TestTaskEndSweepPastBudget: the sweep at a task's end sees every holder
// of its lock whatever the background scan's per-user budget: a user
// process holding more descriptors than that budget (8,192), started
// before the process that holds the task's lock (so read first), does not
// hide it. The holder, which ignores SIGTERM, is signalled and killed, and
// the device is not granted while it holds the lock.
func TestTaskEndSweepPastBudget(t *testing.T) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	// More than two budgets' worth (procscan.DefaultUserBudget), as many
	// as the hard limit allows.
	dups := min(3*procscan.DefaultUserBudget, int(lim.Max)-200)
	if dups <= procscan.DefaultUserBudget {
		t.Fatalf("the descriptor limit is %d: too few for this test", lim.Max)
	}
	dev := harness.NewDevTree(t, 1)
	student := harness.NewUser(t)
	b := harness.StartBroker(t, dev.Config("0", fmt.Sprintf("[restrict]\nusers = [%q]\n\n[tasks]\nkill_grace = \"2s\"\n", student.Name)))
	dir := harness.UserDir(t, &student, 0o755)
	// Its standard input is /dev/null, not StartProc's pipe: the pipe
	// would keep it waiting for a reader.
	many := harness.StartProc(t, "dups", student.As(exec.Command("sh", "-c", `exec "$1" -dups "$2" </dev/null`, "sh", b.Bin.Workload, strconv.Itoa(dups)), dir))
	many.WaitLine("duped")
	sock := filepath.Join(dir, "pass.sock")
	recv := harness.StartProc(t, "receiver", student.As(exec.Command(b.Bin.Workload, "-receive", sock, "-ignore-term"), dir))
	recv.WaitLine("listening")
	if recv.Cmd.Process.Pid < many.Cmd.Process.Pid {
		t.Skip("pids wrapped between the two processes: the holder would be read first")
	}

	id := harness.SubmitTask(t, b, &student, dir, "-d", "0", "--log", filepath.Join(dir, "log"), "--", b.Bin.Workload, "-pass", sock)
	recv.WaitLine("received")
	if r := harness.WaitTask(t, b, id); r.Code != 0 {
		t.Fatalf("task %d: %s", id, r)
	}
	pid := recv.Cmd.Process.Pid
	b.WaitLog(0, fmt.Sprintf("task %d has ended: pid %d (%s: %s -receive %s -ignore-term) still holds its lease of npu 0: sent SIGTERM", id, pid, student.Name, b.Bin.Workload, sock))
	// It ignores SIGTERM and holds the lock until SIGKILL: no grant
	// meanwhile.
	if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "-d", "0", "true")); code == 0 {
		t.Errorf("npu 0 was granted while pid %d holds the ended task's lock: %s", pid, out)
	}
	if _, sig := recv.Wait(); sig != syscall.SIGKILL {
		t.Errorf("the receiver ended by %v, want SIGKILL", sig)
	}
	harness.WaitFree(t, b, 0)
}
