package tasks

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/wire"
)

// A second way to run tasks, in process: the runner a test drives. It runs
// nothing; it hands each go-ahead to the test, which reports the task's end
// as its process would. It shows what a runner beside the local one (a
// Slurm batch runner) gets from the room, and in which order.
type testRunner struct {
	dir     string // the journal's directory
	mu      sync.Mutex
	events  []string
	starts  chan testStart
	notices chan struct{} // a notice run (Notice), where set
}

type testStart struct {
	t       *Task
	goAhead *wire.Spec
	fds     []int
	onDisk  bool // the start record was in the journal when the go-ahead came
}

type testProc struct{ pid int }

func (p testProc) Process() (int, uint64) { return p.pid, 1 }

func (r *testRunner) note(format string, args ...any) {
	r.mu.Lock()
	r.events = append(r.events, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

func (r *testRunner) Open(string) error                            { return nil }
func (r *testRunner) TakeUp([]*Task)                               {}
func (r *testRunner) Adopt(*Task) bool                             { return false }
func (r *testRunner) Warm(*Task, func() *wire.Spec) (func(), bool) { return nil, false }
func (r *testRunner) Warmed(*Task) (bool, bool)                    { return false, false }
func (r *testRunner) Unwarm(*Task)                                 {}
func (r *testRunner) Release(t *Task, _ Proc)                      { r.note("release %d", t.ID) }
func (r *testRunner) Gone(Proc) bool                               { return false }
func (r *testRunner) Unstarted(t *Task)                            { r.note("unstarted %d", t.ID) }
func (r *testRunner) Stop(t *Task)                                 { r.note("stop %d", t.ID) }
func (r *testRunner) Kill(t *Task)                                 { r.note("kill %d", t.ID) }
func (r *testRunner) Usage(*Task) (time.Duration, int64)           { return 0, 0 }
func (r *testRunner) Ended(t *Task)                                { r.note("ended %d", t.ID) }
func (r *testRunner) Notice(t *Task, s *wire.Spec) func() {
	return func() {
		r.note("notice %d %s %q", t.ID, s.Notice, s.Notify)
		if r.notices != nil {
			r.notices <- struct{}{}
		}
	}
}
func (r *testRunner) Close(time.Duration) {}

func (r *testRunner) Prepare(t *Task, spec func() *wire.Spec, _ bool) func() (Proc, error) {
	s := spec()
	r.note("prepare %d %v", t.ID, s.Argv)
	return func() (Proc, error) { return testProc{pid: 4000 + int(t.ID)}, nil }
}

func (r *testRunner) GoAhead(t *Task, _ Proc, goAhead *wire.Spec, fds []int) error {
	// Its own copies of the descriptors, as a process that inherits them
	// has: the room closes its own after.
	var mine []int
	for _, fd := range fds {
		d, err := unix.Dup(fd)
		if err != nil {
			return err
		}
		mine = append(mine, d)
	}
	r.starts <- testStart{t: t, goAhead: goAhead, fds: mine, onDisk: journalHas(r.dir, "start", t.ID)}
	return nil
}

// journalHas tells whether the journal in dir holds a record op of task
// id.
func journalHas(dir, op string, id uint64) bool {
	f, err := os.Open(filepath.Join(dir, "journal"))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if bytes.Contains(line, []byte(`"op":"`+op+`"`)) && bytes.Contains(line, fmt.Appendf(nil, `"id":%d,`, id)) {
			return true
		}
	}
	return false
}

// lineOwner serves the line as the broker does: under a lock of its own,
// by Schedule; it holds no request of its own.
type lineOwner struct {
	mu   sync.Mutex
	room *Room
}

func (o *lineOwner) Serve() {
	o.mu.Lock()
	defer o.mu.Unlock()
	sv := o.room.Schedule(false)
	for _, h := range sv.Others {
		panic(fmt.Sprintf("a grant for %v, which is not a task's", h.W.Holder))
	}
}

// freeOwner is the lease table's owner in these tests: it tells of each
// device that comes into service, and has the line served, as the broker
// does.
type freeOwner struct {
	line  *lineOwner
	freed chan struct{}
}

func (o *freeOwner) Released(*lease.Lease, int, time.Time, bool) {}
func (o *freeOwner) Freed() {
	o.line.Serve()
	o.freed <- struct{}{}
}

// endWatcher is told of tasks' ends.
type endWatcher chan wire.TaskInfo

func (w endWatcher) TaskEnded(ti wire.TaskInfo) { w <- ti }

// TestRunnerStart: a task submitted to a free device is granted, its
// process got ready (Prepare, with its Spec), its start recorded in the
// journal, and only then given its go-ahead with the device's variables
// and its locked lock file; its process's report ends it, the runner lets
// it go, a watcher hears of it, and the device is free again once the
// descriptors are closed. The room's own lock is let go whenever it
// calls its owner or the watcher (they take their own locks, as the
// broker's do).
func TestRunnerStart(t *testing.T) {
	locks := t.TempDir()
	owner := &lineOwner{}
	tableOwner := &freeOwner{line: owner, freed: make(chan struct{}, 1)}
	table, err := lease.Open(lease.Config{Dir: locks, IDs: []int{0}, Pools: []lease.Pool{{Name: "default"}}, DefaultPool: "default",
		Vendor: npu.Fake, Owner: tableOwner})
	if err != nil {
		t.Fatal(err)
	}
	table.Start(nil)
	dir := t.TempDir()
	run := &testRunner{dir: dir, starts: make(chan testStart, 1), notices: make(chan struct{}, 1)}
	room := New(Config{Policy: &policy.Config{Tasks: policy.Tasks{MaxTasks: 100}}, Inventory: &npu.Inventory{Vendor: npu.Fake, IDs: []int{0}},
		Table: table, Owner: owner, Accounts: &testAccounts{}, Socket: "/run/npurun/broker.sock", Log: log.New(io.Discard, "", 0), Runner: func(Host) Runner { return run },
		Claim: func(string) error { return nil }})
	owner.room = room
	if err := room.Open(dir); err != nil {
		t.Fatal(err)
	}
	uid := uint32(os.Geteuid())
	acct := &Account{Name: "alice", Home: t.TempDir(), Shell: "/bin/sh", Known: true}
	sub, err := room.Submit(Submitter{UID: uid, Account: acct},
		&wire.Submission{Argv: []string{"train"}, Cwd: "/", Log: filepath.Join(t.TempDir(), "log"), Notify: "notify-send x"}, func() bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	var st testStart
	select {
	case st = <-run.starts:
	case <-time.After(10 * time.Second):
		t.Fatalf("task %d (%+v): no go-ahead", sub.ID, sub)
	}
	if !st.onDisk {
		t.Errorf("task %d: its go-ahead came before its start record was in the journal", sub.ID)
	}
	if len(st.fds) != 1 || !slices.Equal(st.goAhead.Devices, []int{0}) || !slices.Equal(st.goAhead.Env, []string{"NPURUN_DEVICES=0", "ASCEND_RT_VISIBLE_DEVICES=0"}) {
		t.Errorf("go-ahead %+v with %d descriptors; want npu 0, its variables and its lock", st.goAhead, len(st.fds))
	}
	// The descriptor holds the lease: the device's lock file cannot be
	// taken.
	if fd, err := unix.Open(lease.LockPath(locks, 0), unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
		if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) == nil {
			t.Error("npu 0's lock file is not locked during the task's lease")
		}
		unix.Close(fd)
	}
	if sub.State != wire.StateRunning || sub.Reason != "starting on npu 0" {
		t.Errorf("submission answered %+v; want running, starting on npu 0", sub)
	}

	// The [idle] policy's notice reaches the running task's notify
	// command through its runner; an unknown task's is dropped.
	if !room.Notice(sub.ID, wire.NoticeIdle) || room.Notice(sub.ID+1, wire.NoticeIdle) {
		t.Errorf("notices: want one for running task %d, none for unknown task %d", sub.ID, sub.ID+1)
	}
	select {
	case <-run.notices:
	case <-time.After(10 * time.Second):
		t.Fatal("the runner ran no notice")
	}

	ended := make(endWatcher, 1)
	if ti, err := room.Wait(ended, uid, sub.ID); ti != nil || err != nil {
		t.Fatalf("wait for a running task: %+v, %v", ti, err)
	}
	pid, _ := testProc{pid: 4000 + int(sub.ID)}.Process()
	if err := room.Done(uid+1, int32(pid), sub.ID, &wire.Status{Exit: new(int)}); err == nil {
		t.Error("another uid's report of the task's end was taken")
	}
	if err := room.Done(uid, int32(pid), sub.ID, &wire.Status{Exit: new(int)}); err != nil {
		t.Fatal(err)
	}
	select {
	case ti := <-ended:
		if ti.ID != sub.ID || ti.State != wire.StateDone {
			t.Errorf("the watcher heard %+v; want task %d done", ti, sub.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher heard nothing of the task's end")
	}
	run.mu.Lock()
	events := fmt.Sprint(run.events)
	run.mu.Unlock()
	if want := fmt.Sprintf("[prepare %d [train] notice %d idle \"notify-send x\" ended %d]", sub.ID, sub.ID, sub.ID); events != want {
		t.Errorf("the runner was told %s; want %s", events, want)
	}
	for _, fd := range st.fds {
		unix.Close(fd) // the task's processes are gone
	}
	select {
	case <-tableOwner.freed:
	case <-time.After(10 * time.Second):
		t.Fatal("npu 0 not freed after the task's lease ended")
	}
	if d := table.Snapshot().Devices[0]; d.State != lease.Free {
		t.Errorf("npu 0 after the task's lease ended: %+v; want free", d)
	}
}
