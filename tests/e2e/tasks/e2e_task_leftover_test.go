package tasks

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
)

// TestTaskSupervisorTermWhileReporting: a supervisor whose task ended
// while its broker is gone retries its report (a broker may be restarting)
// but ends at SIGTERM, as any process does, rather than for 24 hours
// ignoring it: so a stopped broker's supervisors can be ended (the tests'
// harness ends them so, where no control group does).
func TestTaskSupervisorTermWhileReporting(t *testing.T) {
	b := harness.StartBroker(t, harness.TaskConfig(1))
	dir := harness.SharedDir(t)
	proceed, log := filepath.Join(dir, "proceed"), filepath.Join(dir, "task.log")
	harness.MakeFIFO(t, proceed)
	id := harness.SubmitTask(t, b, nil, dir, "--log", log, "--", "sh", "-c", "read x < "+proceed)
	awaitFileLine(t, log, fmt.Sprintf("task %d started", id))
	sup := 0
	for _, p := range harness.Supervisors(b.Bin) {
		// This broker's child: a previous test's broker ran a task of
		// the same id with the same program.
		if p.ID == fmt.Sprint(id) && p.PPID == b.Pid() {
			sup = p.PID
		}
	}
	if sup == 0 {
		t.Fatalf("no supervisor of task %d", id)
	}
	pidfd, err := unix.PidfdOpen(sup, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	b.Stop() // the task goes on without it
	harness.OpenFIFO(t, proceed, os.O_WRONLY).Close()
	awaitFileLine(t, log, fmt.Sprintf("task %d ended", id))
	// Now it reports to no broker, and retries: it must be there still
	// (one that had ended would have dropped its task's end).
	if err := unix.PidfdSendSignal(pidfd, unix.SIGTERM, nil, 0); err != nil {
		t.Fatalf("supervisor %d of task %d, reporting to a broker that is gone: SIGTERM: %v", sup, id, err)
	}
	if !harness.AwaitExit(pidfd, harness.EventTimeout) {
		unix.Kill(sup, unix.SIGKILL)
		t.Fatalf("supervisor %d of task %d, reporting to a broker that is gone, outlived SIGTERM by %s", sup, id, harness.EventTimeout)
	}
}

// awaitFileLine waits (inotify) until the file at path holds a line
// containing want, within EventTimeout.
func awaitFileLine(t testing.TB, path, want string) {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	// The directory: the file may not exist yet.
	if _, err := unix.InotifyAddWatch(fd, filepath.Dir(path), unix.IN_CREATE|unix.IN_MODIFY|unix.IN_CLOSE_WRITE); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(harness.EventTimeout)
	buf := make([]byte, 4096)
	for {
		if data, _ := os.ReadFile(path); strings.Contains(string(data), want) {
			return
		}
		left := time.Until(deadline)
		if left <= 0 {
			data, _ := os.ReadFile(path)
			t.Fatalf("%s holds no %q within %s:\n%s", path, want, harness.EventTimeout, data)
		}
		unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(left/time.Millisecond)+1)
		unix.Read(fd, buf) // drain; the file is read again above
	}
}
