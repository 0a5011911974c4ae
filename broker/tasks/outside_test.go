package tasks

import (
	"errors"
	"io"
	"log"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
)

// slurmLike is an allocator outside the line, as the broker's Slurm room
// is one: npu 1 is its alone, and it has its say of every waiter.
type slurmLike struct{}

func (slurmLike) Refusal(devices []int) error {
	for _, id := range devices {
		if id == 1 {
			return &lease.Refusal{Err: lease.ErrNoDevice, Msg: "npu 1 is Slurm's"}
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
	defer os.NewFile(uintptr(hs[0].FDs()[0]), "lock").Close()

	dir := t.TempDir()
	rt := New(Config{Policy: &policy.Config{Tasks: policy.Tasks{MaxTasks: 100}}, Inventory: &npu.Inventory{Vendor: npu.Fake, IDs: []int{0, 1}},
		Table: table, Owner: owner, Accounts: &testAccounts{}, Log: log.New(io.Discard, "", 0),
		Runner: &testRunner{dir: dir, starts: make(chan testStart, 1)}, Claim: func(string) error { return nil }, Outside: slurmLike{}})
	owner.rt = rt
	if err := rt.Open(dir); err != nil {
		t.Fatal(err)
	}
	by := Submitter{UID: uid, Account: &Account{Name: "alice", Home: t.TempDir(), Shell: "/bin/sh", Known: true}}
	sub := func(devices []int) (*Submitted, error) {
		return rt.Submit(by, &client.Submission{Argv: []string{"train"}, Cwd: "/", N: len(devices), Devices: devices,
			Log: filepath.Join(t.TempDir(), "log")}, func() bool { return false })
	}
	if s, err := sub([]int{1}); !errors.Is(err, lease.ErrNoDevice) || !strings.Contains(err.Error(), "npu 1 is Slurm's") {
		t.Errorf("a task for npu 1, Slurm's: %+v, %v; want refused as Slurm's", s, err)
	}
	s, err := sub([]int{0})
	if err != nil {
		t.Fatal(err)
	}
	ti, err := rt.Show(uid, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ti.State != client.StatePending || !strings.HasPrefix(ti.Reason, "Slurm: Resources (") {
		t.Errorf("a task waiting for npu 0: %s, %q; want pending, with what Slurm says", ti.State, ti.Reason)
	}
}
