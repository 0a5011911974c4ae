package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestTaskSupervisorTermWhileReporting: a supervisor whose task ended
// while its broker is gone retries its report (a broker may be restarting)
// but ends at SIGTERM, as any process does, rather than for 24 hours
// ignoring it: so a stopped broker's supervisors can be ended (the tests'
// harness ends them so, where no control group does).
func TestTaskSupervisorTermWhileReporting(t *testing.T) {
	b := StartBroker(t, taskConfig(1))
	dir := SharedDir(t)
	proceed, log := filepath.Join(dir, "proceed"), filepath.Join(dir, "task.log")
	makeFIFO(t, proceed)
	id := submitTask(t, b, nil, dir, "--log", log, "--", "sh", "-c", "read x < "+proceed)
	awaitFileLine(t, log, fmt.Sprintf("task %d started", id))
	sup := 0
	for _, p := range supervisors(b.Bin) {
		// This broker's child: a previous test's broker ran a task of
		// the same id with the same program.
		if p.id == fmt.Sprint(id) && p.ppid == b.Pid() {
			sup = p.pid
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
	openFIFO(t, proceed, os.O_WRONLY).Close()
	awaitFileLine(t, log, fmt.Sprintf("task %d ended", id))
	// Now it reports to no broker, and retries: it must be there still
	// (one that had ended would have dropped its task's end).
	if err := unix.PidfdSendSignal(pidfd, unix.SIGTERM, nil, 0); err != nil {
		t.Fatalf("supervisor %d of task %d, reporting to a broker that is gone: SIGTERM: %v", sup, id, err)
	}
	if !awaitExit(pidfd, eventTimeout) {
		unix.Kill(sup, unix.SIGKILL)
		t.Fatalf("supervisor %d of task %d, reporting to a broker that is gone, outlived SIGTERM by %s", sup, id, eventTimeout)
	}
}

// awaitFileLine waits (inotify) until the file at path holds a line
// containing want, within eventTimeout.
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
	deadline := time.Now().Add(eventTimeout)
	buf := make([]byte, 4096)
	for {
		if data, _ := os.ReadFile(path); strings.Contains(string(data), want) {
			return
		}
		left := time.Until(deadline)
		if left <= 0 {
			data, _ := os.ReadFile(path)
			t.Fatalf("%s holds no %q within %s:\n%s", path, want, eventTimeout, data)
		}
		unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(left/time.Millisecond)+1)
		unix.Read(fd, buf) // drain; the file is read again above
	}
}

// awaitExit waits up to d for the process of pidfd to exit, and tells
// whether it did. (poll(2) is not restarted after a signal handler, and
// the Go runtime's preemption signal interrupts it.)
func awaitExit(pidfd int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left < 0 {
			return false
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}, int(left/time.Millisecond)+1)
		if err == nil && n == 1 {
			return true
		}
		if err != nil && err != unix.EINTR {
			return false
		}
	}
}
