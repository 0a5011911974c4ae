package tasks

import (
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

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// deviceFree checks that device 0 can be leased now: the lease the task
// held ended with it. (The broker puts a fresh lock file in place when a
// lease ends, a moment after the release, so npurun may wait that moment;
// a process of the task still holding the lease would keep it 1000 s.)
func deviceFree(t *testing.T, b *harness.Broker, after string) {
	t.Helper()
	if code, out := harness.ExitCode(t, b.Npurun("-d", "0", "--timeout", harness.EventTimeout.String(), "true")); code != 0 {
		t.Errorf("npu 0 after %s: npurun exit %d: %s; the task's lease outlived it", after, code, out)
	}
}

// TestTaskContained: a task whose command starts a process that leaves its
// process group (setpgid) or its session (setsid after a double fork) and
// holds the task's lease: whether the task ends by itself, by its time
// limit or by a cancel, once task-submit wait has returned that process is
// gone and the device can be leased again; where tasks have control groups,
// the task's group is removed.
func TestTaskContained(t *testing.T) {
	u := harness.ContainUser(t)
	b := harness.StartBroker(t, harness.TaskConfig(1))
	cg := harness.ContainedBy(t, b)
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
			dir := harness.SharedDir(t)
			logDir := harness.UserDir(t, u, 0o755)
			pidFIFO, gate := filepath.Join(dir, "pid"), filepath.Join(dir, "gate")
			harness.MakeFIFO(t, pidFIFO)
			harness.MakeFIFO(t, gate)
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
			id := harness.SubmitTask(t, b, u, dir, args...)
			pid := harness.Escaped(t, pidFIFO)
			if harness.Gone(pid) {
				t.Fatalf("the escaped process %d is gone before the task ended", pid)
			}
			switch tc.end {
			case "exit":
				harness.OpenFIFO(t, gate, os.O_WRONLY).Close() // the leader reads EOF and exits 0
			case "cancel":
				if r := harness.RunTaskCmd(t, b.TaskSubmit("cancel", harness.IDStr(id))); r.Code != 0 {
					t.Fatalf("cancel: %s", r)
				}
			}
			r := harness.WaitTask(t, b, id)
			ti := harness.ShowTask(t, b, id)
			if ti.State != tc.wantState {
				t.Errorf("task %d ended %s (%s), want %s; wait: %s", id, ti.State, ti.Reason, tc.wantState, r)
			}
			if !harness.Gone(pid) {
				t.Errorf("the escaped process %d still runs after wait returned", pid)
			}
			deviceFree(t, b, "the task's end")
			if data, err := os.ReadFile(filepath.Join(logDir, "log")); err != nil || !strings.Contains(string(data), tc.wantLog) {
				t.Errorf("the task's log lacks %q (%v):\n%s", tc.wantLog, err, data)
			}
			if cg {
				harness.AwaitRemoved(t, filepath.Join(b.Cgroup, "task-"+harness.IDStr(id)))
			}
		})
	}
}

// findSupervisor is the pid of task id's supervisor, found in the task's
// control group under b (never another broker's task of the same id).
func findSupervisor(t *testing.T, b *harness.Broker, id uint64) int {
	t.Helper()
	procs := harness.CgroupProcs(filepath.Join(b.Cgroup, "task-"+harness.IDStr(id)))
	for _, p := range harness.Supervisors(b.Bin) {
		// Started for the task (its id on the command line), or idle and
		// given it: the only supervisor in the task's group.
		if slices.Contains(procs, strconv.Itoa(p.PID)) {
			return p.PID
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
	u := harness.ContainUser(t)
	b := harness.StartBroker(t, harness.TaskConfig(1))
	if !harness.ContainedBy(t, b) {
		t.Skip("no control groups for tasks on this machine (the fallback cannot reach an orphan in a session of its own once the supervisor is gone)")
	}
	dir := harness.SharedDir(t)
	pidFIFO := filepath.Join(dir, "pid")
	harness.MakeFIFO(t, pidFIFO)
	id := harness.SubmitTask(t, b, u, dir, "-d", "0", "--log", filepath.Join(harness.UserDir(t, u, 0o755), "log"), "--",
		"sh", "-c", `"$0" -escape daemon -pidfile "$1" -hold 1000s; exec sleep 1000`, b.Bin.Workload, pidFIFO)
	pid := harness.Escaped(t, pidFIFO)
	sup := findSupervisor(t, b, id)
	if err := unix.Kill(sup, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	r := harness.WaitTask(t, b, id)
	if ti := harness.ShowTask(t, b, id); ti.State != wire.StateLost {
		t.Errorf("task %d with its supervisor killed ended %s (%s), want lost; wait: %s", id, ti.State, ti.Reason, r)
	}
	if !harness.ProcGone(t, pid, "") {
		t.Fatalf("the orphan %d outlived its task's killed supervisor", pid)
	}
	deviceFree(t, b, "the supervisor was killed")
	harness.AwaitRemoved(t, filepath.Join(b.Cgroup, "task-"+harness.IDStr(id)))
}

// TestTaskCgroupRestart: a broker that restarts adopts a running task's
// control group (its processes run on, and its end still ends them all),
// and kills and removes the group of a task it does not know.
func TestTaskCgroupRestart(t *testing.T) {
	u := harness.ContainUser(t)
	b := harness.StartBroker(t, harness.TaskConfig(1))
	if !harness.ContainedBy(t, b) {
		t.Skip("no control groups for tasks on this machine")
	}
	dir := harness.SharedDir(t)
	pidFIFO := filepath.Join(dir, "pid")
	harness.MakeFIFO(t, pidFIFO)
	id := harness.SubmitTask(t, b, u, dir, "-d", "0", "--log", filepath.Join(harness.UserDir(t, u, 0o755), "log"), "--",
		"sh", "-c", `"$0" -escape daemon -pidfile "$1" -hold 1000s; exec sleep 1000`, b.Bin.Workload, pidFIFO)
	pid := harness.Escaped(t, pidFIFO)

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
	code, out := harness.ExitCode(t, exec.Command(b.Bin.Broker, "serve", "--config", b.Conf, "--run-dir", filepath.Join(b.Dir, "run2"),
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
	b.WaitLog(mark, "task "+harness.IDStr(id)+" is still running")
	select {
	case <-exited:
	case <-time.After(harness.EventTimeout):
		t.Fatalf("the process in an unknown task's control group still runs %s after the restart", harness.EventTimeout)
	}
	harness.AwaitRemoved(t, stray)
	if harness.Gone(pid) {
		t.Fatalf("the adopted task's process %d is gone after the restart", pid)
	}
	if r := harness.RunTaskCmd(t, b.TaskSubmit("cancel", harness.IDStr(id))); r.Code != 0 {
		t.Fatalf("cancel: %s", r)
	}
	harness.WaitTask(t, b, id)
	if !harness.Gone(pid) {
		t.Errorf("the escaped process %d of the adopted task still runs after wait returned", pid)
	}
	deviceFree(t, b, "the adopted task was cancelled")
	harness.AwaitRemoved(t, filepath.Join(b.Cgroup, "task-"+harness.IDStr(id)))
}

// TestTaskCgroupUsage: where tasks have control groups, show gives the CPU
// time a task used, measured by its group.
func TestTaskCgroupUsage(t *testing.T) {
	b := harness.StartBroker(t, harness.TaskConfig(1))
	if !harness.ContainedBy(t, b) {
		t.Skip("no control groups for tasks on this machine")
	}
	dir := t.TempDir()
	id := harness.SubmitTask(t, b, nil, dir, "--no-device", "--log", filepath.Join(dir, "log"), "--",
		"sh", "-c", `i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done`)
	if r := harness.WaitTask(t, b, id); r.Code != 0 {
		t.Fatalf("wait: %s", r)
	}
	ti := harness.ShowTask(t, b, id)
	if ti.CPUMs <= 0 {
		t.Errorf("show --json: cpu_ms %d for a task that counted to 200000, want > 0", ti.CPUMs)
	}
	if out := harness.RunTaskCmd(t, b.TaskSubmit("show", harness.IDStr(id))).Stdout; !strings.Contains(out, "cpu time: ") {
		t.Errorf("show does not give the CPU time:\n%s", out)
	}
}
