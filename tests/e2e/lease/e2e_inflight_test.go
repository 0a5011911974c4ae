package lease

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// A lease ends when its holders end, whatever became of its descriptors:
// one sent over a Unix socket (SCM_RIGHTS) to a process that never reads
// it is held by the socket's queue alone, and keeps the lock file locked
// for as long as the socket lives. The broker ends such a lease all the
// same once its holders are gone (package leaseend): the device goes back
// to the line, a restricted account's access to it goes, and the
// descriptor, received later, holds nothing: a nested npurun that
// presents it is told that its lease has ended.

// inFlightReceiver starts, as u, a process outside any lease that listens
// on a Unix socket in dir and accepts a connection but reads nothing
// until told (workload -receive-later); then it takes the descriptor sent
// there and runs `npurun --no-wait -d 0 true` with NPURUN_LEASE naming it.
// It returns the process and the socket's path.
func inFlightReceiver(t *testing.T, b *harness.Broker, u harness.TestUser, dir string) (*harness.Proc, string) {
	t.Helper()
	sock := filepath.Join(dir, "pass.sock")
	cmd := u.As(exec.Command(b.Bin.Workload, "-receive-later", sock, "-lease-device", "0", "--", b.Bin.Npurun, "--no-wait", "-d", "0", "true"), dir)
	cmd.Env = b.Env()
	recv := harness.StartProc(t, "receiver", cmd)
	recv.WaitLine("listening")
	return recv, sock
}

// receiveLate has the receiver take the descriptor now, while other holds
// npu 0, and checks what the nested npurun it runs with it says: that
// its lease has ended, and that npu 0 is not its (it is other's).
func receiveLate(t *testing.T, recv *harness.Proc) {
	t.Helper()
	if _, err := recv.Stdin.Write([]byte("read\n")); err != nil {
		t.Fatal(err)
	}
	recv.WaitLine("received")
	code, _ := recv.Wait()
	out := recv.Output()
	if !strings.Contains(out, "npurun: the lease of device 0 that this command inherited (NPURUN_LEASE) has ended") {
		t.Errorf("a nested npurun with the ended lease's descriptor did not say it ended; output:\n%s", out)
	}
	if code == 0 {
		t.Errorf("a nested npurun with the ended lease's descriptor ran on npu 0 while another lease holds it; output:\n%s", out)
	}
}

// TestLeaseInFlightNpurun: a restricted account's npurun passes its lease's
// descriptor to a process of the same user outside the lease that never
// reads it, and ends. The lease ends with it: the account can no longer
// open the device, and another user's npurun gets the device, while the
// descriptor is still in flight; received afterwards, it is dead.
func TestLeaseInFlightNpurun(t *testing.T) {
	dev := harness.NewDevTree(t, 1)
	student, other := harness.NewUser(t), harness.NewUser(t)
	b := harness.StartBroker(t, dev.Config("0", fmt.Sprintf("[restrict]\nusers = [%q]\n", student.Name)))
	dir := harness.UserDir(t, &student, 0o755)
	recv, sock := inFlightReceiver(t, b, student, dir)

	pass := harness.StartProc(t, "npurun -pass", student.As(b.Npurun("-d", "0", "--", b.Bin.Workload, "-pass", sock), dir))
	pass.WaitLine("passed")
	pass.MustSucceed()
	recv.WaitLine("accepted")
	if recv.Exited() {
		t.Fatal("the receiver has exited: the test shows nothing")
	}

	// The lease's tree is gone, its descriptor in flight: the device
	// comes free (WaitFree: a new lease of it within 20 s), and with it
	// the account's access.
	h := harness.LeaseAs(t, b, other, "other", "--timeout", "20s", "-d", "0")
	b.WaitLog(0, "no process holds its lease of npu 0, whose lock is held still by a descriptor no process has")
	if harness.CanOpen(t, student, dev.Node("davinci0")) {
		t.Errorf("%s's lease has ended and %s can still open davinci0", student.Name, student.Name)
	}
	receiveLate(t, recv)
	h.Release()
	harness.WaitFree(t, b, 0)
}

// TestLeaseInFlightTask: a task passes its lease's descriptor to a process
// of its user outside the task that never reads it, and ends. The task's
// lease ends with it: the device is granted to the next request while the
// descriptor is in flight; received afterwards, it is dead.
func TestLeaseInFlightTask(t *testing.T) {
	dev := harness.NewDevTree(t, 1)
	student := harness.NewUser(t)
	b := harness.StartBroker(t, dev.Config("0", fmt.Sprintf("[restrict]\nusers = [%q]\n", student.Name)))
	dir := harness.UserDir(t, &student, 0o755)
	recv, sock := inFlightReceiver(t, b, student, dir)

	id := harness.SubmitTask(t, b, &student, dir, "-d", "0", "--log", filepath.Join(dir, "log"), "--", b.Bin.Workload, "-pass", sock)
	if r := harness.WaitTask(t, b, id); r.Code != 0 {
		t.Fatalf("task %d: %s", id, r)
	}
	recv.WaitLine("accepted")
	h := harness.Hold(t, b, "next", "--timeout", "20s", "-d", "0")
	b.WaitLog(0, fmt.Sprintf("task %d has ended: no process holds its lease of npu 0, whose lock is held still by a descriptor no process has", id))
	if harness.CanOpen(t, student, dev.Node("davinci0")) {
		t.Errorf("task %d has ended and %s can still open davinci0", id, student.Name)
	}
	receiveLate(t, recv)
	h.Release()
	harness.WaitFree(t, b, 0)
}

// TestLeaseInFlightRestart: the broker is killed while a lease's only
// descriptor is in flight, its npurun gone; the broker that starts next
// takes the lease up and ends it as the first would have: one code path.
func TestLeaseInFlightRestart(t *testing.T) {
	dev := harness.NewDevTree(t, 1)
	student := harness.NewUser(t)
	b := harness.StartBroker(t, dev.Config("0", ""))
	dir := harness.UserDir(t, &student, 0o755)
	recv, sock := inFlightReceiver(t, b, student, dir)

	// The lease is held by its npurun's command while the broker dies;
	// the command then sends its descriptor away and ends.
	pass := harness.StartProc(t, "npurun -pass", student.As(b.Npurun("-d", "0", "--", "sh", "-c", `echo held; read x; exec "$0" -pass "$1"`, b.Bin.Workload, sock), dir))
	pass.WaitLine("held")
	b.Kill()
	pass.Stdin.Write([]byte("go\n"))
	pass.WaitLine("passed")
	pass.MustSucceed()
	recv.WaitLine("accepted")
	b.Start()
	h := harness.Hold(t, b, "next", "--timeout", "20s", "-d", "0")
	b.WaitLog(0, "no process holds its lease of npu 0, whose lock is held still by a descriptor no process has")
	receiveLate(t, recv)
	h.Release()
}
