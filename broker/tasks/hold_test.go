package tasks

import (
	"errors"
	"log"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/wire"
)

// TestHoldOutlivesAPause: a task its owner holds stays held when task
// starts are paused and resumed (the pause holds every waiting task, and
// its end used to let every one go), and is not started when the device
// it waits for frees; released, it starts.
func TestHoldOutlivesAPause(t *testing.T) {
	locks := t.TempDir()
	owner := &lineOwner{}
	tableOwner := &freeOwner{line: owner, freed: make(chan struct{}, 4)}
	table, err := lease.Open(lease.Config{Dir: locks, IDs: []int{0}, Pools: []lease.Pool{{Name: "default"}}, DefaultPool: "default",
		Vendor: npu.Fake, Owner: tableOwner})
	if err != nil {
		t.Fatal(err)
	}
	table.Start(nil)
	dir := t.TempDir()
	run := &testRunner{dir: dir, starts: make(chan testStart, 2)}
	resumed := make(chan struct{}, 1)
	lg := log.New(logWatch{"task starts resume", resumed}, "", 0)
	room := New(Config{Policy: &policy.Config{Tasks: policy.Tasks{MaxTasks: 100}}, Inventory: &npu.Inventory{Vendor: npu.Fake, IDs: []int{0}},
		Table: table, Owner: owner, Accounts: &testAccounts{}, Socket: "/run/npurun/broker.sock", Log: lg, Runner: func(Host) Runner { return run },
		Claim: func(string) error { return nil }})
	owner.room = room
	if err := room.Open(dir); err != nil {
		t.Fatal(err)
	}
	uid := uint32(os.Geteuid())
	by := Submitter{UID: uid, Account: &Account{Name: "alice", Home: t.TempDir(), Shell: "/bin/sh", Known: true}}
	submit := func() *Submitted {
		sub, err := room.Submit(by, &wire.Submission{Argv: []string{"train"}, Cwd: "/", Log: filepath.Join(t.TempDir(), "log")}, func() bool { return false })
		if err != nil {
			t.Fatal(err)
		}
		return sub
	}
	started := func() testStart {
		select {
		case st := <-run.starts:
			return st
		case <-time.After(10 * time.Second):
			t.Fatal("no go-ahead")
		}
		return testStart{}
	}
	first := submit() // takes npu 0
	st := started()
	held := submit()
	if ti, err := room.Hold(uid, held.ID, true); err != nil || !ti.Held || ti.Position != 1 {
		t.Fatalf("hold task %d: %+v, %v; want held, 1st in line", held.ID, ti, err)
	}
	room.mu.Lock()
	room.pauseStartsLocked(errTestPause, false)
	room.mu.Unlock()
	select { // resumed by its timer: the journal is writable
	case <-resumed:
	case <-time.After(10 * time.Second):
		t.Fatal("task starts did not resume")
	}
	room.mu.Lock()
	stillHeld := room.jobs[held.ID].w.Held
	room.mu.Unlock()
	if !stillHeld {
		t.Errorf("task %d's waiter is not held after task starts resumed", held.ID)
	}
	// The first task ends and its device frees: the line is served (Freed)
	// and the held task is passed over.
	if err := room.Done(uid, int32(4000+first.ID), first.ID, &wire.Status{Exit: new(int)}); err != nil {
		t.Fatal(err)
	}
	for _, fd := range st.fds {
		unix.Close(fd)
	}
	<-tableOwner.freed
	if ti, err := room.Show(uid, held.ID); err != nil || ti.State != wire.StatePending || !ti.Held {
		t.Errorf("held task %d once npu 0 is free: %+v, %v; want pending, held", held.ID, ti, err)
	}
	if d := table.Snapshot().Devices[0]; d.State != lease.Free {
		t.Errorf("npu 0 with only a held task waiting: %+v, want free", d)
	}
	if _, err := room.Hold(uid, held.ID, false); err != nil {
		t.Fatal(err)
	}
	if st := started(); st.t.ID != held.ID {
		t.Errorf("after the release, task %d started, want %d", st.t.ID, held.ID)
	}
}

var errTestPause = errors.New("a test's pause")

// logWatch is a log that tells ch when a line holds what.
type logWatch struct {
	what string
	ch   chan struct{}
}

func (w logWatch) Write(p []byte) (int, error) {
	if strings.Contains(string(p), w.what) {
		select {
		case w.ch <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}
