package tasks

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// Faults found by injection (issue 15): relative paths, a clean stop's
// idle groups, kills between a task's start record and its go-ahead,
// cancels as a task starts, descriptor shortages, ambiguous submissions.

// TestBrokerRelativePaths: a broker started with relative --run-dir,
// --state-dir and --socket makes them absolute at its start, so that its
// tasks' supervisors, which run in "/", reach it to report: the task ends
// done, and the socket it says it serves is absolute.
func TestBrokerRelativePaths(t *testing.T) {
	dir := harness.SharedDir(t)
	conf := filepath.Join(dir, "npurun.conf")
	if err := os.WriteFile(conf, []byte(harness.TaskConfig(1)), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := harness.Bins(t)
	cmd := exec.Command(bin.Broker, "serve", "--config", "npurun.conf", "--run-dir", "run", "--state-dir", "state",
		"--socket", "run/broker.sock", "--cgroup", "off")
	cmd.Dir = dir
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	serving := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "serving") {
				serving <- sc.Text()
			}
		}
	}()
	socket := filepath.Join(dir, "run", "broker.sock")
	select {
	case line := <-serving:
		if !strings.HasSuffix(line, " on "+socket) {
			t.Errorf("the broker says %q, want it to serve on %s", line, socket)
		}
	case <-time.After(harness.EventTimeout):
		t.Fatalf("the broker did not serve within %s", harness.EventTimeout)
	}
	b := &harness.Broker{T: t, Bin: bin, Socket: socket}
	work := harness.SharedDir(t)
	id := harness.SubmitTask(t, b, nil, work, "--no-device", "--log", filepath.Join(work, "log"), "--", "true")
	if r := harness.WaitTask(t, b, id); r.Code != 0 {
		t.Errorf("wait for task %d: %s", id, r)
	}
	if ti := harness.ShowTask(t, b, id); ti.State != "done" {
		t.Errorf("task %d: %s (%s), want done", id, ti.State, ti.Reason)
	}
	if _, err := os.Stat(filepath.Join(dir, "state", "journal")); err != nil {
		t.Errorf("the journal is not in the state directory given, relative to where the broker started: %v", err)
	}
}

// TestTaskDefaultLogNewJournal: a new journal numbers its tasks from 1
// again; its task 1 writes its default log beside the older task 1's, not
// into it, and `logs` shows its own output alone (issue 14.9).
func TestTaskDefaultLogNewJournal(t *testing.T) {
	u := harness.NewUser(t)
	home := harness.UserDir(t, &u, 0o755)
	if out, err := exec.Command("usermod", "--home", home, u.Name).CombinedOutput(); err != nil {
		t.Fatalf("usermod --home: %v: %s", err, out)
	}
	run := func(word string) (wire.TaskInfo, *harness.Broker) {
		b := harness.StartBroker(t, harness.TaskConfig(1)) // a state directory of its own: a new journal
		id := harness.SubmitTask(t, b, &u, home, "--no-device", "--", "echo", word)
		if r := harness.WaitTask(t, b, id); r.Code != 0 {
			t.Fatalf("wait for task %d: %s", id, r)
		}
		return harness.ShowTask(t, b, id), b
	}
	first, b := run("first")
	b.Stop()
	second, b := run("second")
	if first.ID != second.ID {
		t.Fatalf("the new journal's task is %d, the older one's %d: ids should start again", second.ID, first.ID)
	}
	if first.Log == second.Log || !strings.HasPrefix(second.Log, filepath.Join(home, ".local/state/npurun/tasks")+"/") {
		t.Errorf("default logs %s and %s: want two files under %s", first.Log, second.Log, filepath.Join(home, ".local/state/npurun/tasks"))
	}
	r := harness.RunTaskCmd(t, harness.AsUser(b.TaskSubmit("logs", strconv.FormatUint(second.ID, 10)), &u, home))
	if r.Code != 0 || !strings.Contains(r.Stdout, "second") || strings.Contains(r.Stdout, "first") {
		t.Errorf("logs %d of the new journal: %s; want its own output alone", second.ID, r)
	}
}

// TestTaskSubmitLookupShortage: a submission whose account the broker
// cannot look up for a passing reason (here: no descriptor left for NSS
// once the connection is accepted) is refused with status 75 and recorded
// nowhere, rather than recorded as "uid N" with its log under "/" and
// failed at its start; once descriptors are back, it goes through and runs
// (issue 15.3).
func TestTaskSubmitLookupShortage(t *testing.T) {
	u := harness.NewUser(t)
	b := harness.StartBroker(t, harness.TaskConfig(1))
	dir := harness.UserDir(t, &u, 0o755)
	args := []string{"--no-device", "--log", filepath.Join(dir, "log"), "--", "true"}
	restore := starveBroker(t, b)
	r := harness.RunTaskCmd(t, harness.AsUser(b.TaskSubmit(args...), &u, dir))
	restore()
	if r.Code != 75 || !strings.Contains(r.Stderr, "the user database cannot be read now, so the task was not submitted") {
		t.Errorf("task-submit while the broker cannot look its user up: %s; want exit 75 saying it was not submitted", r)
	}
	if ts := harness.ListTasks(t, b, &u, false); len(ts) != 0 {
		t.Errorf("a submission refused was recorded: %+v", ts)
	}
	// As a script would: the failed lookup is kept for a second, against
	// hammering a name service that is down.
	var id uint64
	for deadline := time.Now().Add(harness.EventTimeout); id == 0; {
		r := harness.RunTaskCmd(t, harness.AsUser(b.TaskSubmit(append([]string{"--json"}, args...)...), &u, dir))
		switch {
		case r.Code == 0:
			var s struct{ ID uint64 }
			if err := json.Unmarshal([]byte(r.Stdout), &s); err != nil || s.ID == 0 {
				t.Fatalf("task-submit --json printed %q: %v", r.Stdout, err)
			}
			id = s.ID
		case r.Code != 75 || time.Now().After(deadline):
			t.Fatalf("task-submit once descriptors were back: %s", r)
		default:
			time.Sleep(200 * time.Millisecond)
		}
	}
	if r := harness.WaitTask(t, b, id); r.Code != 0 {
		t.Errorf("wait for task %d, submitted once descriptors were back: %s", id, r)
	}
	if ti := harness.ShowTask(t, b, id); ti.State != "done" || ti.User != u.Name {
		t.Errorf("task %d: %s (%s), user %q; want done, %s's", id, ti.State, ti.Reason, ti.User, u.Name)
	}
}

// starveBroker leaves b's process one descriptor to open (the next
// connection it accepts) and returns what gives it its limit back.
func starveBroker(t *testing.T, b *harness.Broker) func() {
	t.Helper()
	pid := b.Pid()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	open := map[int]bool{}
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			open[n] = true
		}
	}
	free := 0
	for open[free] {
		free++
	}
	var old unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: uint64(free + 1), Max: math.MaxUint64}, &old); err != nil {
		// The hard limit is kept as it was.
		if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &old); err != nil {
			t.Fatal(err)
		}
		if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: uint64(free + 1), Max: old.Max}, nil); err != nil {
			t.Fatal(err)
		}
	}
	return func() {
		if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &old, nil); err != nil {
			t.Errorf("give the broker its descriptor limit back: %v", err)
		}
	}
}

// slowSupervisorBinaries are the binaries with a broker whose supervisor
// is slow to start (the workload's slowSupervisor in front of the real
// one): for half a second after its start, SIGTERM ends it.
func slowSupervisorBinaries(t *testing.T) *harness.Binaries {
	t.Helper()
	bin := privateBinaries(t)
	if err := os.Rename(bin.Supervisor, bin.Supervisor+".real"); err != nil {
		t.Fatal(err)
	}
	harness.CopyFile(t, bin.Workload, bin.Supervisor, 0o755)
	return bin
}

// TestTaskCancelAsItStarts: a cancel that comes while a task's supervisor
// is still starting (before it can catch SIGTERM) ends the task cancelled,
// not lost: the broker signals a supervisor only once it has heard from
// it (issue 15.5).
func TestTaskCancelAsItStarts(t *testing.T) {
	b := harness.NewBroker(t, harness.TaskConfig(1))
	b.Bin = slowSupervisorBinaries(t)
	b.Start()
	dir := harness.SharedDir(t)
	// Submitted to an empty line, it is granted at once, and its
	// supervisor started then, not ahead.
	id := harness.SubmitTask(t, b, nil, dir, "--no-device", "--log", filepath.Join(dir, "log"), "--", "sleep", "30")
	if r := harness.RunTaskCmd(t, b.TaskSubmit("cancel", strconv.FormatUint(id, 10))); r.Code != 0 {
		t.Fatalf("cancel %d: %s", id, r)
	}
	r := harness.WaitTask(t, b, id)
	if ti := harness.ShowTask(t, b, id); ti.State != "cancelled" {
		t.Errorf("task %d, cancelled as it started: %s (%s); wait: %s; want cancelled", id, ti.State, ti.Reason, r)
	}
}

// TestTaskKilledBeforeGoAhead: a broker killed with -9 after a task's
// start record and before its go-ahead (stopped there by a test hook)
// loses no task: the supervisor, which never got the go-ahead, tells the
// next broker so, and the task, back in line, runs exactly once. A
// supervisor killed meanwhile leaves its task lost, as nobody can tell
// whether it ran (issue 15.1).
func TestTaskKilledBeforeGoAhead(t *testing.T) {
	for _, c := range []struct {
		name    string
		args    []string
		killSup bool
	}{
		{"device", []string{"-n", "1"}, false},
		{"no device", []string{"--no-device"}, false},
		{"supervisor killed too", []string{"--no-device"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := harness.NewBroker(t, harness.TaskConfig(1), "NPUBROKER_TEST_HOOK=before-go-ahead")
			b.Start()
			dir := harness.SharedDir(t)
			mark := filepath.Join(dir, "ran")
			args := append(c.args, "--log", filepath.Join(dir, "log"), "--", "sh", "-c", `echo ran >> "$1"`, "sh", mark)
			id := harness.SubmitTask(t, b, nil, dir, args...)
			b.WaitLog(0, fmt.Sprintf("test hook before-go-ahead: task %d stops here", id))
			// This broker's child: another test's broker (or this
			// test's previous one, its supervisor exiting) may run a
			// task of the same id with the same program.
			sup := 0
			for _, p := range harness.Supervisors(b.Bin) {
				if p.ID == strconv.FormatUint(id, 10) && p.PPID == b.Pid() {
					sup = p.PID
				}
			}
			if sup == 0 {
				t.Fatalf("no supervisor of task %d while its go-ahead is held back", id)
			}
			if c.killSup {
				unix.Kill(sup, unix.SIGKILL)
				if !harness.ProcGone(t, sup, "") {
					t.Fatalf("supervisor %d still there after SIGKILL", sup)
				}
			}
			b.Kill()
			b.ExtraEnv = harness.WithoutHook(b.ExtraEnv) // the next broker stops nowhere
			at := b.LogLen()
			b.Start()
			r := harness.WaitTask(t, b, id)
			ti := harness.ShowTask(t, b, id)
			data, _ := os.ReadFile(mark)
			runs := strings.Count(string(data), "ran\n")
			switch {
			case c.killSup && (ti.State != "lost" || runs != 0):
				t.Errorf("task %d, its supervisor killed before its go-ahead: %s (%s), ran %d times; want lost, never run", id, ti.State, ti.Reason, runs)
			case !c.killSup && (ti.State != "done" || r.Code != 0 || runs != 1):
				t.Errorf("task %d, its broker killed between its start record and its go-ahead: %s (%s), ran %d times; wait: %s; want done, run once", id, ti.State, ti.Reason, runs, r)
			case !c.killSup:
				b.WaitLog(at, fmt.Sprintf("task %d never got its go-ahead (its supervisor %d says so)", id, sup))
			}
		})
	}
}

// TestTaskSubmitAnswerLost: a broker killed with -9 after it recorded a
// submission and before it answered (stopped there by a test hook) leaves
// task-submit unsure; it asks the next broker again with the submission's
// token, hears that the task was recorded, and exits 0 with its id: one
// task, run once. Without the answer, a script that retried on failure ran
// the task twice (issue 15.2).
func TestTaskSubmitAnswerLost(t *testing.T) {
	b := harness.NewBroker(t, harness.TaskConfig(1), "NPUBROKER_TEST_HOOK=before-submit-reply")
	b.Start()
	dir := harness.SharedDir(t)
	mark := filepath.Join(dir, "ran")
	cmd := b.TaskSubmit("--json", "--no-device", "--log", filepath.Join(dir, "log"), "--", "sh", "-c", `echo ran >> "$1"`, "sh", mark)
	cmd.Dir = dir
	done := make(chan harness.TaskResult, 1)
	go func() { done <- harness.RunTaskCmd(t, cmd) }()
	b.WaitLog(0, "test hook before-submit-reply: task 1 stops here")
	b.Kill()
	b.ExtraEnv = harness.WithoutHook(b.ExtraEnv)
	b.Start()
	r := <-done
	var s struct {
		ID       uint64 `json:"id"`
		Existing bool   `json:"existing"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &s); r.Code != 0 || err != nil || s.ID != 1 || !s.Existing ||
		!strings.Contains(r.Stderr, "the broker had recorded it before its answer was lost") {
		t.Fatalf("task-submit whose answer was lost to a broker's kill: %s; want exit 0, task 1, existing", r)
	}
	if ts := harness.ListTasks(t, b, nil, false); len(ts) != 1 {
		t.Errorf("%d tasks recorded, want 1: %+v", len(ts), ts)
	}
	if r := harness.WaitTask(t, b, 1); r.Code != 0 {
		t.Errorf("wait for task 1: %s", r)
	}
	if data, _ := os.ReadFile(mark); string(data) != "ran\n" {
		t.Errorf("task 1 wrote %q, want it run once", data)
	}
}

// TestTaskSubmitterGone: a submission read only after its submitter has
// closed the connection (here: sent while the broker was stopped) is not
// recorded: nobody hears its id, and a submitter that gave up may be
// asking again with its token on another connection.
func TestTaskSubmitterGone(t *testing.T) {
	b := harness.StartBroker(t, harness.TaskConfig(1))
	dir := harness.SharedDir(t)
	syscall.Kill(b.Pid(), syscall.SIGSTOP)
	c := b.Dial()
	err := c.Send(&wire.Request{Op: wire.OpSubmit, Task: &wire.Submission{
		Argv: []string{"true"}, Cwd: dir, Log: filepath.Join(dir, "log"), NoDevice: true, Token: "gone-1"}})
	c.Close()
	syscall.Kill(b.Pid(), syscall.SIGCONT)
	if err != nil {
		t.Fatal(err)
	}
	b.WaitLog(0, "its submitter left before it was recorded; not recorded")
	if ts := harness.ListTasks(t, b, nil, false); len(ts) != 0 {
		t.Errorf("a submission whose submitter had left was recorded: %+v", ts)
	}
}

// TestKillUnderBurst is a short BenchmarkKillUnderBurst: a handful of
// kills with -9 under bursts of submissions from several users and npurun
// clients; every acknowledged task runs, none twice, none refused runs,
// task-submit can always tell, and no device is granted twice, as the
// tasks' own O_EXCL marks count it (issue 15).
//
// NPURUN_TEST_KILLS=N makes it N kills (6 by default): a longer run, to
// look for a rarer loss.
func TestKillUnderBurst(t *testing.T) {
	kills := 6
	if n, err := strconv.Atoi(os.Getenv("NPURUN_TEST_KILLS")); err == nil && n > 0 {
		kills = n
	}
	r := harness.KillUnderBurst(t, harness.Burst{Round: 400 * time.Millisecond, PerRound: 8, Npurun: 2,
		KillEvery: [2]time.Duration{700 * time.Millisecond, 1500 * time.Millisecond}, Kills: kills})
	t.Log(r)
	if r.Acked == 0 || r.NeverRan != 0 || r.RanTwice != 0 || r.RefusedRan != 0 || r.Unknown != 0 || r.DoubleGrants != 0 {
		t.Errorf("%s; want every acknowledged task run once, nothing run twice or refused and run, nothing unknown, no double grant", r)
	}
}

// TestTaskStartTimeUnreadable: a supervisor whose start time the broker
// cannot read from /proc (here made to fail once by a test hook; out of
// descriptors, in earnest) is let go, and the task starts under another,
// whose start record names it by pid and start time: the broker killed
// with -9 before the go-ahead (a second hook), the next one adopts that
// supervisor, hears that the task never started, and runs it, once. The
// start was recorded with no start time, and the next broker took the
// task for lost: acknowledged, it never ran (issue 27.10).
func TestTaskStartTimeUnreadable(t *testing.T) {
	b := harness.NewBroker(t, harness.TaskConfig(1), "NPUBROKER_TEST_HOOK=no-start-time,before-go-ahead")
	b.Start()
	dir := harness.SharedDir(t)
	mark := filepath.Join(dir, "ran")
	id := harness.SubmitTask(t, b, nil, dir, "--no-device", "--log", filepath.Join(dir, "log"), "--", "sh", "-c", `echo ran >> "$1"`, "sh", mark)
	b.WaitLog(0, fmt.Sprintf("test hook before-go-ahead: task %d stops here", id))
	b.Kill()
	b.ExtraEnv = harness.WithoutHook(b.ExtraEnv)
	b.Start()
	r := harness.WaitTask(t, b, id)
	ti := harness.ShowTask(t, b, id)
	data, _ := os.ReadFile(mark)
	if ti.State != "done" || r.Code != 0 || string(data) != "ran\n" {
		t.Errorf("task %d, its first supervisor's start time unreadable, its broker killed before the go-ahead: %s (%s), ran %d times; wait: %s; want done, run once",
			id, ti.State, ti.Reason, strings.Count(string(data), "ran\n"), r)
	}
}

// TestTaskAdoptedThroughShortage: a broker that takes up a running task
// while /proc cannot be read for a moment, and while it is out of
// descriptors as it opens the pidfd that watches the task's supervisor
// (test hooks make each happen once), adopts it all the same: the task
// runs on and ends done. A passing failure was taken for the supervisor's
// exit: the task was lost, and killed (issue 27.10).
func TestTaskAdoptedThroughShortage(t *testing.T) {
	for _, hook := range []string{"adopt-unreadable", "no-pidfd"} {
		t.Run(hook, func(t *testing.T) {
			b := harness.StartBroker(t, harness.TaskConfig(1))
			dir := harness.SharedDir(t)
			goFIFO, mark := filepath.Join(dir, "go"), filepath.Join(dir, "ran")
			harness.MakeFIFO(t, goFIFO)
			id := harness.SubmitTask(t, b, nil, dir, "--no-device", "--log", filepath.Join(dir, "log"), "--",
				"sh", "-c", `read x < "$1"; echo ran >> "$2"`, "sh", goFIFO, mark)
			f := harness.OpenFIFO(t, goFIFO, os.O_WRONLY) // the task runs, and waits
			b.Kill()
			b.ExtraEnv = append(b.ExtraEnv, "NPUBROKER_TEST_HOOK="+hook)
			at := b.LogLen()
			b.Start()
			b.WaitLog(at, fmt.Sprintf("task %d is still running", id))
			f.Close()
			r := harness.WaitTask(t, b, id)
			ti := harness.ShowTask(t, b, id)
			data, _ := os.ReadFile(mark)
			if ti.State != "done" || r.Code != 0 || string(data) != "ran\n" {
				t.Errorf("task %d, taken up through a passing shortage: %s (%s), ran %d times; wait: %s; want done, run once",
					id, ti.State, ti.Reason, strings.Count(string(data), "ran\n"), r)
			}
		})
	}
}
