package tasks

import (
	"errors"
	"io"
	"log"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/refusal"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/wire"
)

// slurmLike is an allocator outside the line, as the broker's Slurm room
// is one: npu 1 is its alone, and it has its say of every waiter.
type slurmLike struct{}

func (slurmLike) Refusal(devices []int) error {
	for _, id := range devices {
		if id == 1 {
			return &refusal.Refusal{Err: lease.ErrNoDevice, Msg: "npu 1 is Slurm's"}
		}
	}
	return nil
}

func (slurmLike) Why(w *lease.Waiter, why string) string {
	return "Slurm: Resources (" + why + ")"
}

// TestOutside: a task's request goes by the allocator outside the line
// (Config.Outside) as an npurun's does: one that names a device of its is
// refused with its refusal, and a waiting task's reason is what it says.
func TestOutside(t *testing.T) {
	owner := &lineOwner{}
	table, err := lease.Open(lease.Config{Dir: t.TempDir(), IDs: []int{0, 1}, Pools: []lease.Pool{{Name: "default", IDs: []int{0}}}, DefaultPool: "default",
		Vendor: npu.Fake, Owner: &freeOwner{line: owner, freed: make(chan struct{}, 8)}})
	if err != nil {
		t.Fatal(err)
	}
	table.Start(nil)
	uid := uint32(os.Geteuid())
	// npu 0 is held by an npurun: a task for it waits.
	w, err := table.Admit(lease.Request{Holder: lease.Holder{Kind: lease.Inline, UID: uid, User: "alice"}, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	table.Add(w)
	hs := table.Schedule(nil)
	if len(hs) != 1 {
		t.Fatalf("%d grants for one request on a free device", len(hs))
	}
	table.Commit(hs[0])
	// Its descriptor (hs[0].FDs()) stays open to the test's end: let go,
	// the device would go to the task, its lock file renewed while the
	// test's directories are removed.

	dir := t.TempDir()
	room := New(Config{Policy: &policy.Config{Tasks: policy.Tasks{MaxTasks: 100}}, Inventory: &npu.Inventory{Vendor: npu.Fake, IDs: []int{0, 1}},
		Table: table, Owner: owner, Accounts: &testAccounts{}, Log: log.New(io.Discard, "", 0),
		Runner: func(Host) Runner { return &testRunner{dir: dir, starts: make(chan testStart, 1)} }, Claim: func(string) error { return nil }, Outside: slurmLike{}})
	owner.room = room
	if err := room.Open(dir); err != nil {
		t.Fatal(err)
	}
	by := Submitter{UID: uid, Account: &Account{Name: "alice", Home: t.TempDir(), Shell: "/bin/sh", Known: true}}
	sub := func(devices []int) (*Submitted, error) {
		return room.Submit(by, &wire.Submission{Argv: []string{"train"}, Cwd: "/", N: len(devices), Devices: devices,
			Log: filepath.Join(t.TempDir(), "log")}, func() bool { return false })
	}
	if s, err := sub([]int{1}); !errors.Is(err, lease.ErrNoDevice) || !strings.Contains(err.Error(), "npu 1 is Slurm's") {
		t.Errorf("a task for npu 1, Slurm's: %+v, %v; want refused as Slurm's", s, err)
	}
	s, err := sub([]int{0})
	if err != nil {
		t.Fatal(err)
	}
	ti, err := room.Show(uid, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ti.State != wire.StatePending || !strings.HasPrefix(ti.Reason, "Slurm: Resources (") {
		t.Errorf("a task waiting for npu 0: %s, %q; want pending, with what Slurm says", ti.State, ti.Reason)
	}
}

// awaitFree lets go of the lease f holds and waits until its device is
// free again, its lock file renewed: the test's directories may go then.
func awaitFree(t *testing.T, table *lease.Table, f *os.File, freed chan struct{}) {
	t.Helper()
	f.Close()
	for table.Snapshot().Devices[0].State != lease.Free {
		select {
		case <-freed:
		case <-time.After(10 * time.Second):
			t.Fatal("npu 0 not freed after its lease's holder let go")
		}
	}
}

// idleOwner serves no line, as the room's owner and as the table's
// (it tells of each device freed): the test hands out the devices.
type idleOwner struct{ freed chan struct{} }

func (idleOwner) Serve()                                      {}
func (idleOwner) Released(*lease.Lease, int, time.Time, bool) {}
func (o idleOwner) Freed() {
	select {
	case o.freed <- struct{}{}:
	default:
	}
}

// TestOutsideDeliver: a task granted devices outside the line's own pass
// (Deliver: a Slurm placeholder's devices) starts as one the line granted,
// its start record before its go-ahead; a task whose request the
// allocator refused (Refuse) fails, not started, and leaves the line; a
// waiting task's time limit is its --time (TimeLimit, its placeholder's);
// the request of another holder is neither's.
func TestOutsideDeliver(t *testing.T) {
	freed := make(chan struct{}, 1)
	table, err := lease.Open(lease.Config{Dir: t.TempDir(), IDs: []int{0}, Pools: []lease.Pool{{Name: "default"}}, DefaultPool: "default",
		Vendor: npu.Fake, Owner: idleOwner{freed: freed}})
	if err != nil {
		t.Fatal(err)
	}
	table.Start(nil)
	dir := t.TempDir()
	run := &testRunner{dir: dir, starts: make(chan testStart, 1)}
	room := New(Config{Policy: &policy.Config{Tasks: policy.Tasks{MaxTasks: 100, KeepEnded: 10, KeepEndedPer: 10}}, Inventory: &npu.Inventory{Vendor: npu.Fake, IDs: []int{0}},
		Table: table, Owner: idleOwner{}, Accounts: &testAccounts{}, Log: log.New(io.Discard, "", 0), Runner: func(Host) Runner { return run },
		Claim: func(string) error { return nil }, Outside: slurmLike{}})
	if err := room.Open(dir); err != nil {
		t.Fatal(err)
	}
	uid := uint32(os.Geteuid())
	by := Submitter{UID: uid, Account: &Account{Name: "alice", Home: t.TempDir(), Shell: "/bin/sh", Known: true}}
	submit := func(limit int64) *Submitted {
		s, err := room.Submit(by, &wire.Submission{Argv: []string{"train"}, Cwd: "/", N: 1, Log: filepath.Join(t.TempDir(), "log"), TimeSec: limit},
			func() bool { return false })
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	first, second := submit(0), submit(90)

	hs := table.Schedule(nil)
	if len(hs) != 1 || taskOf(hs[0].W) == nil || taskOf(hs[0].W).ID != first.ID {
		t.Fatalf("the line's grants: %+v; want task %d's", hs, first.ID)
	}
	sv, mine := room.Deliver(hs[0])
	if !mine || sv.Again || len(sv.Begun) != 1 || sv.Begun[0].Lease.Task != first.ID {
		t.Fatalf("Deliver(task %d's grant) = %+v, %v; want its lease begun", first.ID, sv, mine)
	}
	select {
	case st := <-run.starts:
		if st.t.ID != first.ID || !st.onDisk || len(st.fds) != 1 {
			t.Errorf("go-ahead of task %d (start record on disk: %v, %d descriptors); want task %d's, after its start record, with its lock",
				st.t.ID, st.onDisk, len(st.fds), first.ID)
		}
		defer awaitFree(t, table, os.NewFile(uintptr(st.fds[0]), "lock"), freed)
	case <-time.After(10 * time.Second):
		t.Fatalf("task %d delivered: no go-ahead", first.ID)
	}

	var few [4]*lease.Waiter
	waiting := table.FirstTasks(few[:0])
	if len(waiting) != 1 || taskOf(waiting[0]).ID != second.ID {
		t.Fatalf("waiting in line: %v; want task %d", waiting, second.ID)
	}
	other := &lease.Waiter{Holder: lease.Holder{Kind: lease.Inline, UID: uid, User: "alice"}, N: 1}
	if got := room.TimeLimit(waiting[0]); got != 90*time.Second {
		t.Errorf("task %d's time limit for its placeholder: %v; want its --time, 1m30s", second.ID, got)
	}
	if got := room.TimeLimit(other); got != 0 {
		t.Errorf("an npurun's request's time limit: %v; want none", got)
	}
	if room.Refuse(other, "no") {
		t.Error("an npurun's request was refused as a task's")
	}
	if !room.Refuse(waiting[0], "Slurm ended the placeholder") {
		t.Fatalf("task %d's request not refused", second.ID)
	}
	ti, err := room.Show(uid, second.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ti.State != wire.StateFailed || ti.Reason != "not started: Slurm ended the placeholder" {
		t.Errorf("task %d refused: %s, %q; want failed, not started, saying why", second.ID, ti.State, ti.Reason)
	}
	if left := table.FirstTasks(few[:0]); len(left) != 0 {
		t.Errorf("waiting in line after the refusal: %v", left)
	}
	if room.Refuse(waiting[0], "again") {
		t.Error("a task refused twice")
	}
}
