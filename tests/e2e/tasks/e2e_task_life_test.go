package tasks

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// TestTaskTimeLimitKillsTree: --time 1s ends a task whose command left a
// background grandchild; once wait has returned, the grandchild is gone
// too, and show names the time limit.
func TestTaskTimeLimitKillsTree(t *testing.T) {
	b := harness.StartBroker(t, harness.TaskConfig(1))
	dir := t.TempDir()
	pidfile := filepath.Join(dir, "pid")
	id := harness.SubmitTask(t, b, nil, dir, "--no-device", "--time", "1s", "--log", filepath.Join(dir, "log"),
		"--", "sh", "-c", `sleep 1000 & echo $! > "$1"; wait`, "sh", pidfile)
	r := harness.WaitTask(t, b, id)
	if r.Code == 0 {
		t.Fatalf("wait of a task killed at its time limit: %s", r)
	}
	ti := harness.ShowTask(t, b, id)
	if ti.State != wire.StateFailed || !strings.Contains(ti.Reason, "time limit") {
		t.Errorf("show: state %q reason %q, want failed with a time limit reason", ti.State, ti.Reason)
	}
	if got := ti.ExitStatus(); got != r.Code {
		t.Errorf("wait exited %d, show says %d", r.Code, got)
	}
	text := harness.RunTaskCmd(t, b.TaskSubmit("show", harness.IDStr(id)))
	if !strings.Contains(text.Stdout, "time limit") {
		t.Errorf("show does not name the time limit:\n%s", text.Stdout)
	}
	pid := harness.ReadInt(t, pidfile)
	if state, _ := harness.ProcState(pid); state != 0 && state != 'Z' && state != 'X' {
		// Dying may still be under way a moment after the report; it
		// must not take long.
		if !harness.ProcGone(t, pid, "sleep") {
			t.Fatalf("grandchild sleep (pid %d) outlived its task's time limit", pid)
		}
		t.Logf("grandchild %d was still dying when wait returned", pid)
	}
}

// TestTaskAfterChain: --after orders a chain of tasks that could
// otherwise run at once, and a task after a failed one fails, naming the
// dependency, without running.
func TestTaskAfterChain(t *testing.T) {
	b := harness.StartBroker(t, harness.TaskConfig(1))
	dir := t.TempDir()
	order := filepath.Join(dir, "order")
	gate := filepath.Join(dir, "gate")
	harness.MakeFIFO(t, gate)
	sub := func(tag string, extra ...string) uint64 {
		args := append([]string{"--no-device", "--log", filepath.Join(dir, tag+".log")}, extra...)
		return harness.SubmitTask(t, b, nil, dir, args...)
	}

	t.Run("order", func(t *testing.T) {
		// The first waits for the test; with four CPU slots the others
		// would run at once but for --after.
		t1 := sub("t1", "--", "sh", "-c", `read x < "$1"; echo 1 >> "$2"`, "sh", gate, order)
		w := harness.OpenFIFO(t, gate, os.O_WRONLY) // t1 runs
		t2 := sub("t2", "--after", harness.IDStr(t1), "--", "sh", "-c", `echo 2 >> "$1"`, "sh", order)
		t3 := sub("t3", "--after", harness.IDStr(t2), "--", "sh", "-c", `echo 3 >> "$1"`, "sh", order)
		for _, id := range []uint64{t2, t3} {
			if ti := harness.ShowTask(t, b, id); ti.State != wire.StateBlocked {
				t.Errorf("task %d is %s while its dependency runs, want blocked", id, ti.State)
			}
		}
		w.Write([]byte("go\n"))
		w.Close()
		if r := harness.WaitTask(t, b, t3); r.Code != 0 {
			t.Fatalf("wait %d: %s", t3, r)
		}
		data, _ := os.ReadFile(order)
		if string(data) != "1\n2\n3\n" {
			t.Errorf("order file %q, want 1, 2, 3", data)
		}
	})

	t.Run("failed dependency", func(t *testing.T) {
		f1 := sub("f1", "--", "sh", "-c", `read x < "$1"; exit 3`, "sh", gate)
		w := harness.OpenFIFO(t, gate, os.O_WRONLY) // f1 runs
		marker2, marker3 := filepath.Join(dir, "f2.ran"), filepath.Join(dir, "f3.ran")
		f2 := sub("f2", "--after", harness.IDStr(f1), "--", "touch", marker2)
		f3 := sub("f3", "--after", harness.IDStr(f2), "--", "touch", marker3)
		w.Write([]byte("go\n"))
		w.Close()
		if r := harness.WaitTask(t, b, f1); r.Code != 3 {
			t.Errorf("wait %d: %s, want exit 3", f1, r)
		}
		// Submitted after the dependency failed: fails at once, recorded,
		// and task-submit says so with status 1.
		marker4 := filepath.Join(dir, "f4.ran")
		r4 := harness.RunTaskCmd(t, b.TaskSubmit("--json", "--no-device", "--log", filepath.Join(dir, "f4.log"), "--after", harness.IDStr(f1), "--", "touch", marker4))
		var s4 struct {
			ID    uint64 `json:"id"`
			State string `json:"state"`
		}
		if err := json.Unmarshal([]byte(r4.Stdout), &s4); err != nil || r4.Code != 1 || s4.State != wire.StateFailed || !strings.Contains(r4.Stderr, "will not run") {
			t.Fatalf("submit --after a failed task: %s (%v); want exit 1, its id and state failed", r4, err)
		}
		f4 := s4.ID
		for _, c := range []struct {
			id, dep uint64
			marker  string
		}{{f2, f1, marker2}, {f3, f2, marker3}, {f4, f1, marker4}} {
			r := harness.WaitTask(t, b, c.id)
			if r.Code == 0 {
				t.Errorf("wait %d (after failed %d): %s", c.id, c.dep, r)
			}
			show := harness.RunTaskCmd(t, b.TaskSubmit("show", harness.IDStr(c.id)))
			if !strings.Contains(show.Stdout, "state: failed") || !strings.Contains(show.Stdout, "dependency "+harness.IDStr(c.dep)) {
				t.Errorf("show %d does not say it failed for dependency %d:\n%s", c.id, c.dep, show.Stdout)
			}
			if !strings.Contains(show.Stdout, "\nstarted: never: it ended without running\n") {
				t.Errorf("task %d does not say it never started:\n%s", c.id, show.Stdout)
			}
			if _, err := os.Stat(c.marker); err == nil {
				t.Errorf("task %d ran although its dependency %d failed", c.id, c.dep)
			}
		}
	})
}

// TestTaskSurvivesRestart: a running task goes on running across a broker
// restart (kill -9 and SIGTERM), keeps its device meanwhile, and its exit
// status reaches the new broker.
func TestTaskSurvivesRestart(t *testing.T) {
	for _, c := range []struct {
		name string
		stop func(*harness.Broker)
	}{
		{"kill -9", (*harness.Broker).Kill},
		{"SIGTERM", (*harness.Broker).Stop},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := harness.StartBroker(t, harness.TaskConfig(2))
			dir := t.TempDir()
			gate := filepath.Join(dir, "gate")
			harness.MakeFIFO(t, gate)
			id := harness.SubmitTask(t, b, nil, dir, "-n", "1", "--log", filepath.Join(dir, "log"),
				"--", "sh", "-c", `read x < "$1"; exit 7`, "sh", gate)
			w := harness.OpenFIFO(t, gate, os.O_WRONLY) // the task runs
			ti := harness.ShowTask(t, b, id)
			if ti.State != wire.StateRunning || len(ti.Devices) != 1 {
				t.Fatalf("task %d: state %s devices %v, want running on one device", id, ti.State, ti.Devices)
			}
			dev := strconv.Itoa(ti.Devices[0])

			c.stop(b)
			b.Start()

			got := harness.FindTask(harness.ListTasks(t, b, nil, false), id)
			if got == nil || got.State != wire.StateRunning {
				t.Errorf("after the restart, list has task %d as %+v, want running", id, got)
			}
			if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "-d", dev, "true")); code != 75 {
				t.Errorf("npurun --no-wait -d %s while the task holds it: exit %d, want 75; output:\n%s", dev, code, out)
			}
			w.Write([]byte("go\n"))
			w.Close()
			if r := harness.WaitTask(t, b, id); r.Code != 7 {
				t.Errorf("wait after the restart: %s, want exit 7", r)
			}
			ti = harness.ShowTask(t, b, id)
			if ti.Exit == nil || *ti.Exit != 7 || ti.State != wire.StateFailed {
				t.Errorf("show --json after the restart: state %s exit %v reason %q, want failed with exit 7", ti.State, ti.Exit, ti.Reason)
			}
			// Its device is free again.
			if code, out := harness.ExitCode(t, b.Npurun("-d", dev, "true")); code != 0 {
				t.Errorf("npurun -d %s after the task: exit %d; output:\n%s", dev, code, out)
			}
		})
	}
}

// TestTaskWaitAcrossRestart: a `task-submit wait` begun before the broker
// restarts goes on waiting (task-submit(1): "If the broker restarts
// meanwhile, task-submit connects again and goes on waiting") and exits
// with the task's status. The broker here is not socket-activated, so
// there is a moment with nobody listening.
func TestTaskWaitAcrossRestart(t *testing.T) {
	b := harness.StartBroker(t, harness.TaskConfig(1))
	dir := t.TempDir()
	// A pending task: what becomes of it across a restart does not depend
	// on the adoption of running tasks.
	h := harness.Hold(t, b, "holder")
	id := harness.SubmitTask(t, b, nil, dir, "--log", filepath.Join(dir, "log"), "--", "sh", "-c", "exit 5")
	waiter := harness.StartProc(t, "wait", b.TaskSubmit("wait", harness.IDStr(id)))
	// Kill the broker only once wait has connected: before that, a failed
	// first connection would be the expected "no broker" (69).
	waitConnected(t, waiter.Cmd.Process.Pid)
	b.Kill()
	b.Start()
	h.Release()
	if code, sig := waiter.Wait(); code != 5 || sig != 0 {
		t.Errorf("wait begun before the restart: exit %d signal %v, want 5; output:\n%s", code, sig, waiter.Output())
	}
	if r := harness.WaitTask(t, b, id); r.Code != 5 {
		t.Errorf("wait after the restart: %s, want exit 5", r)
	}
}

// waitConnected waits until process pid has a socket open. Nothing the
// process does can be awaited as an event here (wait prints nothing), so
// this polls, with a deadline.
func waitConnected(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(harness.EventTimeout)
	for tick := time.NewTicker(5 * time.Millisecond); ; <-tick.C {
		ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, e := range ents {
			if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name())); strings.HasPrefix(l, "socket:") {
				tick.Stop()
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d opened no socket within %s", pid, harness.EventTimeout)
		}
	}
}

// TestTaskCancel: a pending task that is cancelled leaves the line and
// never runs; a running task that traps SIGTERM is killed after the grace
// with its whole process group.
func TestTaskCancel(t *testing.T) {
	t.Run("pending", func(t *testing.T) {
		b := harness.StartBroker(t, harness.TaskConfig(1))
		dir := t.TempDir()
		h := harness.Hold(t, b, "holder")
		m1, m2 := filepath.Join(dir, "p1.ran"), filepath.Join(dir, "p2.ran")
		p1 := harness.SubmitTask(t, b, nil, dir, "--log", filepath.Join(dir, "p1.log"), "--", "touch", m1)
		p2 := harness.SubmitTask(t, b, nil, dir, "--log", filepath.Join(dir, "p2.log"), "--", "touch", m2)
		if ti := harness.ShowTask(t, b, p2); ti.State != wire.StatePending || ti.Position != 2 {
			t.Fatalf("task %d: %s at position %d, want pending second in line", p2, ti.State, ti.Position)
		}
		if r := harness.RunTaskCmd(t, b.TaskSubmit("cancel", harness.IDStr(p1))); r.Code != 0 {
			t.Fatalf("cancel %d: %s", p1, r)
		}
		if ti := harness.ShowTask(t, b, p1); ti.State != wire.StateCancelled {
			t.Errorf("task %d after cancel: %s, want cancelled", p1, ti.State)
		}
		if ti := harness.ShowTask(t, b, p2); ti.Position != 1 {
			t.Errorf("task %d after cancelling the one before it: position %d, want 1", p2, ti.Position)
		}
		h.Release()
		// Served in order, p1 would have run before p2 ended.
		if r := harness.WaitTask(t, b, p2); r.Code != 0 {
			t.Fatalf("wait %d: %s", p2, r)
		}
		if _, err := os.Stat(m2); err != nil {
			t.Errorf("the task after the cancelled one did not run: %v", err)
		}
		if _, err := os.Stat(m1); err == nil {
			t.Errorf("the cancelled task %d ran", p1)
		}
		if r := harness.WaitTask(t, b, p1); r.Code == 0 {
			t.Errorf("wait of the cancelled task: %s, want non-zero", r)
		}
	})

	t.Run("running", func(t *testing.T) {
		b := harness.StartBroker(t, harness.TaskConfig(1))
		dir := t.TempDir()
		ready, termed, pidfile := filepath.Join(dir, "ready"), filepath.Join(dir, "termed"), filepath.Join(dir, "pid")
		harness.MakeFIFO(t, ready)
		script := `trap 'echo TERM >> "$2"' TERM; echo $$ > "$3"; echo ready > "$1"; while :; do sleep 1000 & wait $!; done`
		id := harness.SubmitTask(t, b, nil, dir, "--no-device", "--log", filepath.Join(dir, "log"), "--", "sh", "-c", script, "sh", ready, termed, pidfile)
		rd := harness.OpenFIFO(t, ready, os.O_RDONLY)
		if line, err := bufio.NewReader(rd).ReadString('\n'); err != nil || line != "ready\n" {
			t.Fatalf("task said %q, %v", line, err)
		}
		pgid := harness.ReadInt(t, pidfile)
		if r := harness.RunTaskCmd(t, b.TaskSubmit("cancel", harness.IDStr(id))); r.Code != 0 {
			t.Fatalf("cancel %d: %s", id, r)
		}
		start := time.Now()
		r := harness.WaitTask(t, b, id)
		if r.Code == 0 {
			t.Errorf("wait of a cancelled task: %s", r)
		}
		ti := harness.ShowTask(t, b, id)
		if ti.State != wire.StateCancelled {
			t.Errorf("task %d after cancel: state %s signal %q reason %q, want cancelled", id, ti.State, ti.Signal, ti.Reason)
		}
		if data, _ := os.ReadFile(termed); !strings.Contains(string(data), "TERM") {
			t.Errorf("the task never saw SIGTERM (trap output %q)", data)
		}
		// SIGKILL was sent before the end was reported; a member may still
		// be dying, which must not take long.
		for _, pid := range harness.GroupMembers(pgid) {
			if !harness.ProcGone(t, pid, "") {
				t.Errorf("process %d of group %d lives on %s after the cancelled task ended", pid, pgid, time.Since(start))
			}
		}
	})
}

// TestTaskSharesQueueWithNpurun: a task and an inline npurun waiting for
// the same device are served in the order they asked, either way round.
func TestTaskSharesQueueWithNpurun(t *testing.T) {
	for _, taskFirst := range []bool{true, false} {
		name := "npurun first"
		if taskFirst {
			name = "task first"
		}
		t.Run(name, func(t *testing.T) {
			b := harness.StartBroker(t, harness.TaskConfig(1))
			w := harness.NewWorkload(t)
			dir := t.TempDir()
			h := harness.Hold(t, b, "holder")
			var id uint64
			var inline *harness.Proc
			submit := func() {
				args := append([]string{"--log", filepath.Join(dir, "log"), "--"}, w.Args(b, "task", 0)...)
				id = harness.SubmitTask(t, b, nil, dir, args...)
			}
			if taskFirst {
				submit()
				inline = harness.Queue(t, b, "inline", w.Args(b, "inline", 0)...)
			} else {
				inline = harness.Queue(t, b, "inline", w.Args(b, "inline", 0)...)
				submit()
			}
			h.Release()
			inline.MustSucceed()
			if r := harness.WaitTask(t, b, id); r.Code != 0 {
				t.Fatalf("wait %d: %s", id, r)
			}
			want := "inline task"
			if taskFirst {
				want = "task inline"
			}
			if got := strings.Join(harness.Tags(w.Runs(t)), " "); got != want {
				t.Errorf("runs in order %q, want %q", got, want)
			}
		})
	}
}

// TestTaskBadInput: refused submissions exit with the documented status
// and leave no task behind; a command that does not exist fails with 127.
func TestTaskBadInput(t *testing.T) {
	b := harness.StartBroker(t, harness.TaskConfig(2))
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	for _, c := range []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"unknown --after", []string{"--after", "999", "--", "true"}, 1, "999"},
		{"no such device", []string{"-d", "99", "--", "true"}, 2, "no npu 99"},
		{"more devices than the pool has", []string{"-n", "3", "--", "true"}, 77, "3 devices"},
		{"far more devices than there are", []string{"-n", "100", "--", "true"}, 77, ""},
		{"--run and --", []string{"--run", "true", "--", "true"}, 2, "exclude"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := harness.RunTaskCmd(t, harness.AsUser(b.TaskSubmit(append([]string{"--log", log}, c.args...)...), nil, dir))
			if r.Code != c.code || !strings.Contains(r.Stderr, c.msg) {
				t.Errorf("task-submit %q: %s; want exit %d and %q", c.args, r, c.code, c.msg)
			}
		})
	}
	if ts := harness.ListTasks(t, b, nil, true); len(ts) != 0 {
		t.Errorf("refused submissions left tasks: %+v", ts)
	}
	t.Run("command not found", func(t *testing.T) {
		id := harness.SubmitTask(t, b, nil, dir, "--no-device", "--log", log, "--", "npurun-no-such-command-x")
		r := harness.WaitTask(t, b, id)
		ti := harness.ShowTask(t, b, id)
		if ti.State != wire.StateFailed || ti.Exit == nil || *ti.Exit != 127 || r.Code != 127 {
			t.Errorf("task of a missing command: state %s exit %v reason %q, wait %s; want failed with 127", ti.State, ti.Exit, ti.Reason, r)
		}
		if show := harness.RunTaskCmd(t, b.TaskSubmit("show", harness.IDStr(id))); !strings.Contains(show.Stdout, "exit status: 127") {
			t.Errorf("show does not give exit status 127:\n%s", show.Stdout)
		}
	})
}
