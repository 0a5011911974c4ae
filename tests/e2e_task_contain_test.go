package tests

import (
	"bufio"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/wire"
)

// containedBy tells which containment b's tasks have: their control groups
// (true) or the supervisor's and session's (false). As root under CI=true
// the control groups must be the one exercised: a machine without cgroup
// v2 fails the test rather than skipping what it is there for.
func containedBy(t *testing.T, b *Broker) bool {
	t.Helper()
	if b.Cgroup != "" {
		b.WaitLog(0, "each task runs in a control group of its own under "+b.Cgroup)
		return true
	}
	if os.Getenv("CI") == "true" && os.Geteuid() == 0 {
		t.Fatal("CI=true as root, and this machine has no cgroup v2 with cgroup.kill: tasks' control groups are not exercised")
	}
	b.WaitLog(0, "tasks have no control group of their own")
	t.Log("no control groups for tasks here: the supervisor's containment is exercised")
	return false
}

// containUser is the user the containment tests submit as: a test user as
// root, the test process otherwise.
func containUser(t *testing.T) *testUser {
	if os.Geteuid() != 0 {
		return nil
	}
	u := newUser(t)
	return &u
}

// escaped reads the pid an escaping workload writes to the FIFO at path.
func escaped(t *testing.T, path string) int {
	t.Helper()
	f := openFIFO(t, path, os.O_RDONLY)
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		t.Fatalf("read the escaped process's pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("escaped pid %q: %v", line, err)
	}
	return pid
}

// gone tells whether pid is gone (a zombie counts as gone).
func gone(pid int) bool {
	state, _ := procState(pid)
	return state == 0 || state == 'Z' || state == 'X'
}

// deviceFree checks that device 0 can be leased now: the lease the task
// held ended with it. (The broker puts a fresh lock file in place when a
// lease ends, a moment after the release, so npurun may wait that moment;
// a process of the task still holding the lease would keep it 1000 s.)
func deviceFree(t *testing.T, b *Broker, after string) {
	t.Helper()
	if code, out := exitCode(t, b.Npurun("-d", "0", "--timeout", eventTimeout.String(), "true")); code != 0 {
		t.Errorf("npu 0 after %s: npurun exit %d: %s; the task's lease outlived it", after, code, out)
	}
}

// awaitRemoved waits for the control group dir to be removed, woken by
// inotify on its parent; it fails the test if that does not happen within
// eventTimeout.
func awaitRemoved(t *testing.T, dir string) {
	t.Helper()
	ifd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ifd)
	if _, err := unix.InotifyAddWatch(ifd, filepath.Dir(dir), unix.IN_DELETE); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(eventTimeout)
	buf := make([]byte, 4096)
	for {
		if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
			return
		}
		ms := int(time.Until(deadline) / time.Millisecond)
		if ms <= 0 {
			t.Fatalf("control group %s still there %s after its task ended (processes: %v)", dir, eventTimeout, cgroupProcs(dir))
		}
		if n, _ := unix.Poll([]unix.PollFd{{Fd: int32(ifd), Events: unix.POLLIN}}, ms); n > 0 {
			unix.Read(ifd, buf)
		}
	}
}

// TestTaskContained: a task whose command starts a process that leaves its
// process group (setpgid) or its session (setsid after a double fork) and
// holds the task's lease: whether the task ends by itself, by its time
// limit or by a cancel, once task-submit wait has returned that process is
// gone and the device can be leased again; where tasks have control groups,
// the task's group is removed.
func TestTaskContained(t *testing.T) {
	u := containUser(t)
	b := StartBroker(t, taskConfig(1))
	cg := containedBy(t, b)
	cases := []struct {
		name, escape, end string
		wantState         string
		wantLog           string
	}{
		{"setpgid, leader exits", "setpgid", "exit", wire.StateDone, "leaving 1 process running; it was ended"},
		{"setsid and double fork, leader exits", "daemon", "exit", wire.StateDone, "leaving 1 process running; it was ended"},
		{"setpgid, time limit", "setpgid", "time", wire.StateFailed, "time limit 3s reached"},
		{"setsid and double fork, time limit", "daemon", "time", wire.StateFailed, "time limit 3s reached"},
		{"setpgid, cancel", "setpgid", "cancel", wire.StateCancelled, "(cancelled)"},
		{"setsid and double fork, cancel", "daemon", "cancel", wire.StateCancelled, "(cancelled)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := SharedDir(t)
			logDir := userDir(t, u, 0o755)
			pidFIFO, gate := filepath.Join(dir, "pid"), filepath.Join(dir, "gate")
			makeFIFO(t, pidFIFO)
			makeFIFO(t, gate)
			script := `"$0" -escape "$1" -pidfile "$2" -hold 1000s & read x < "$3"; exit 0`
			args := []string{"-d", "0", "--log", filepath.Join(logDir, "log")}
			switch tc.end {
			case "time":
				script = `"$0" -escape "$1" -pidfile "$2" -hold 1000s & exec sleep 1000`
				args = append(args, "--time", "3s")
			case "cancel":
				script = `"$0" -escape "$1" -pidfile "$2" -hold 1000s & exec sleep 1000`
			}
			args = append(args, "--", "sh", "-c", script, b.Bin.Workload, tc.escape, pidFIFO, gate)
			id := submitTask(t, b, u, dir, args...)
			pid := escaped(t, pidFIFO)
			if gone(pid) {
				t.Fatalf("the escaped process %d is gone before the task ended", pid)
			}
			switch tc.end {
			case "exit":
				openFIFO(t, gate, os.O_WRONLY).Close() // the leader reads EOF and exits 0
			case "cancel":
				if r := runTaskCmd(t, b.TaskSubmit("cancel", idStr(id))); r.code != 0 {
					t.Fatalf("cancel: %s", r)
				}
			}
			r := waitTask(t, b, id)
			ti := showTask(t, b, id)
			if ti.State != tc.wantState {
				t.Errorf("task %d ended %s (%s), want %s; wait: %s", id, ti.State, ti.Reason, tc.wantState, r)
			}
			if !gone(pid) {
				t.Errorf("the escaped process %d still runs after wait returned", pid)
			}
			deviceFree(t, b, "the task's end")
			if data, err := os.ReadFile(filepath.Join(logDir, "log")); err != nil || !strings.Contains(string(data), tc.wantLog) {
				t.Errorf("the task's log lacks %q (%v):\n%s", tc.wantLog, err, data)
			}
			if cg {
				awaitRemoved(t, filepath.Join(b.Cgroup, "task-"+idStr(id)))
			}
		})
	}
}

// findSupervisor is the pid of task id's supervisor, found in the task's
// control group under b (never another broker's task of the same id).
func findSupervisor(t *testing.T, b *Broker, id uint64) int {
	t.Helper()
	procs := cgroupProcs(filepath.Join(b.Cgroup, "task-"+idStr(id)))
	for _, p := range supervisors(b.Bin) {
		// Started for the task (its id on the command line), or idle and
		// given it: the only supervisor in the task's group.
		if slices.Contains(procs, strconv.Itoa(p.pid)) {
			return p.pid
		}
	}
	t.Fatalf("no supervisor of task %d in its control group", id)
	return 0
}

// TestTaskCgroupSupervisorKilled: with control groups, a task whose
// supervisor is killed (its user may do that: it runs as them) leaves
// nothing running, not even a process that left its session and was
// orphaned: the broker kills the task's group. (Without control groups
// that process escapes: the README's limits say so.)
func TestTaskCgroupSupervisorKilled(t *testing.T) {
	u := containUser(t)
	b := StartBroker(t, taskConfig(1))
	if !containedBy(t, b) {
		t.Skip("no control groups for tasks on this machine (the fallback cannot reach an orphan in a session of its own once the supervisor is gone)")
	}
	dir := SharedDir(t)
	pidFIFO := filepath.Join(dir, "pid")
	makeFIFO(t, pidFIFO)
	id := submitTask(t, b, u, dir, "-d", "0", "--log", filepath.Join(userDir(t, u, 0o755), "log"), "--",
		"sh", "-c", `"$0" -escape daemon -pidfile "$1" -hold 1000s; exec sleep 1000`, b.Bin.Workload, pidFIFO)
	pid := escaped(t, pidFIFO)
	sup := findSupervisor(t, b, id)
	if err := unix.Kill(sup, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	r := waitTask(t, b, id)
	if ti := showTask(t, b, id); ti.State != wire.StateLost {
		t.Errorf("task %d with its supervisor killed ended %s (%s), want lost; wait: %s", id, ti.State, ti.Reason, r)
	}
	if !procGone(t, pid, "") {
		t.Fatalf("the orphan %d outlived its task's killed supervisor", pid)
	}
	deviceFree(t, b, "the supervisor was killed")
	awaitRemoved(t, filepath.Join(b.Cgroup, "task-"+idStr(id)))
}

// TestTaskCgroupRestart: a broker that restarts adopts a running task's
// control group (its processes run on, and its end still ends them all),
// and kills and removes the group of a task it does not know.
func TestTaskCgroupRestart(t *testing.T) {
	u := containUser(t)
	b := StartBroker(t, taskConfig(1))
	if !containedBy(t, b) {
		t.Skip("no control groups for tasks on this machine")
	}
	dir := SharedDir(t)
	pidFIFO := filepath.Join(dir, "pid")
	makeFIFO(t, pidFIFO)
	id := submitTask(t, b, u, dir, "-d", "0", "--log", filepath.Join(userDir(t, u, 0o755), "log"), "--",
		"sh", "-c", `"$0" -escape daemon -pidfile "$1" -hold 1000s; exec sleep 1000`, b.Bin.Workload, pidFIFO)
	pid := escaped(t, pidFIFO)

	// A leftover: the group of a task no journal knows, with a process in it.
	stray := filepath.Join(b.Cgroup, "task-999999")
	if err := os.Mkdir(stray, 0o755); err != nil {
		t.Fatal(err)
	}
	sleeper := exec.Command("sleep", "1000")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })
	if err := os.WriteFile(filepath.Join(stray, "cgroup.procs"), []byte(strconv.Itoa(sleeper.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { sleeper.Wait(); close(exited) }()

	// A broker refused for another's spool touches no control group.
	other := filepath.Join(b.Cgroup, "other")
	code, out := exitCode(t, exec.Command(b.Bin.Broker, "serve", "--config", b.Conf, "--run-dir", filepath.Join(b.Dir, "run2"),
		"--socket", filepath.Join(b.Dir, "run2", "s.sock"), "--state-dir", b.StateDir, "--cgroup", other))
	if code != 1 || !strings.Contains(out, "another broker uses it") {
		t.Errorf("a second broker on the same spool: exit %d: %s", code, out)
	}
	if _, err := os.Stat(other); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a broker refused for another's spool made %s (%v)", other, err)
	}

	b.Kill()
	mark := b.LogLen()
	b.Start()
	b.WaitLog(mark, "task "+idStr(id)+" is still running")
	select {
	case <-exited:
	case <-time.After(eventTimeout):
		t.Fatalf("the process in an unknown task's control group still runs %s after the restart", eventTimeout)
	}
	awaitRemoved(t, stray)
	if gone(pid) {
		t.Fatalf("the adopted task's process %d is gone after the restart", pid)
	}
	if r := runTaskCmd(t, b.TaskSubmit("cancel", idStr(id))); r.code != 0 {
		t.Fatalf("cancel: %s", r)
	}
	waitTask(t, b, id)
	if !gone(pid) {
		t.Errorf("the escaped process %d of the adopted task still runs after wait returned", pid)
	}
	deviceFree(t, b, "the adopted task was cancelled")
	awaitRemoved(t, filepath.Join(b.Cgroup, "task-"+idStr(id)))
}

// TestTaskCgroupUsage: where tasks have control groups, show gives the CPU
// time a task used, measured by its group.
func TestTaskCgroupUsage(t *testing.T) {
	b := StartBroker(t, taskConfig(1))
	if !containedBy(t, b) {
		t.Skip("no control groups for tasks on this machine")
	}
	dir := t.TempDir()
	id := submitTask(t, b, nil, dir, "--no-device", "--log", filepath.Join(dir, "log"), "--",
		"sh", "-c", `i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done`)
	if r := waitTask(t, b, id); r.code != 0 {
		t.Fatalf("wait: %s", r)
	}
	ti := showTask(t, b, id)
	if ti.CPUMs <= 0 {
		t.Errorf("show --json: cpu_ms %d for a task that counted to 200000, want > 0", ti.CPUMs)
	}
	if out := runTaskCmd(t, b.TaskSubmit("show", idStr(id))).stdout; !strings.Contains(out, "cpu time: ") {
		t.Errorf("show does not give the CPU time:\n%s", out)
	}
}
