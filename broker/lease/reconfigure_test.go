package lease

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
)

// TestReconfigure: a new policy's pools and limits apply to the waiters
// in line; a waiter the new policy refuses leaves the line with Admit's
// words, a lease it would not grant runs on, and a pool that names a
// device not managed changes nothing.
func TestReconfigure(t *testing.T) {
	o, _ := newTable(t, 4, nil, Pool{Name: "a", IDs: []int{0, 1}}, Pool{Name: "b", IDs: []int{2, 3}})
	_, chHeld := o.ask(t, 9, 2, "a", nil, policy.Limit{})
	held := got(t, chHeld, "u9's two devices of a")
	wWide, chWide := o.ask(t, 1, 2, "a", nil, policy.Limit{})                // waits for a; fits a wider "a"
	wGone, _ := o.ask(t, 2, 1, "a", nil, policy.Limit{Pools: []string{"a"}}) // "a" is closed to u2 by the new limits
	wBig, _ := o.ask(t, 3, 2, "a", nil, policy.Limit{})                      // 2 devices, past u3's new max_devices
	_, chOne := o.ask(t, 4, 1, "a", nil, policy.Limit{})                     // waits on, behind u1
	none(t, o, chWide, "u1 behind u9")

	// A pool naming a device not managed: refused, nothing changes.
	if _, err := o.tbl.Reconfigure([]Pool{{Name: "a", IDs: []int{0, 7}}}, "a", nil); err == nil {
		t.Fatal("a pool of npu 7, not managed, was taken")
	}
	if p := o.tbl.PoolOf(2); p != "b" {
		t.Fatalf("after a refused reconfigure, npu 2 is in pool %q, want b", p)
	}

	limits := map[uint32]policy.Limit{
		2: {Pools: []string{"b"}, Source: "user u2"},
		3: {MaxDevices: 1, Source: "user u3"},
	}
	limitOf := func(uid uint32, _ string) (policy.Limit, bool) { l, ok := limits[uid]; return l, ok }
	o.mu.Lock()
	refused, err := o.tbl.Reconfigure([]Pool{{Name: "a", IDs: []int{0, 1, 2}}, {Name: "b", IDs: []int{3}}}, "b", limitOf)
	if err != nil {
		o.mu.Unlock()
		t.Fatal(err)
	}
	o.serveLocked()
	o.mu.Unlock()
	if len(refused) != 2 || refused[0].W != wGone || !errors.Is(refused[0].Why, ErrDenied) ||
		refused[0].Why.Msg != `pool "a" is not open to u2 (user u2)` ||
		refused[1].W != wBig || refused[1].Why.Msg != "2 devices asked, the limit for u3 is 1 held at once (user u3)" {
		for _, r := range refused {
			t.Logf("refused u%d: %s", r.W.UID, r.Why.Msg)
		}
		t.Fatalf("refused %d, want u2's request for pool a and u3's for 2 devices, denied", len(refused))
	}
	// u1 waits for 2 of a, which now has npu 2 free: one short of two
	// while u9 holds 0 and 1, so npu 2 is kept for it and u4 waits.
	line := o.tbl.Line(nil)
	if len(line) != 2 || line[0].W != wWide || line[1].W.UID != 4 {
		t.Fatalf("line %+v, want u1 then u4", line)
	}
	none(t, o, chOne, "u4 behind u1's reservation")
	if !slices.Equal(wWide.Cand, []int{0, 1, 2}) {
		t.Errorf("u1's candidates %v, want pool a's new devices 0-2", wWide.Cand)
	}
	if o.tbl.PoolName("") != "b" || o.tbl.PoolOf(2) != "a" {
		t.Errorf("default pool %q, npu 2 in %q; want b, a", o.tbl.PoolName(""), o.tbl.PoolOf(2))
	}
	// The lease u9 holds on a runs on: released, its devices go to u1.
	held.release()
	g := got(t, chWide, "u1's two devices of the new pool a")
	got(t, chOne, "u4's device after u1").release()
	g.release()
	// A new request is admitted against the new pools and limits.
	if _, err := o.tbl.Admit(Request{Holder: Holder{UID: 2, User: "u2"}, Pool: "a", Limit: limits[2]}); !errors.Is(err, ErrDenied) {
		t.Errorf("u2 asking for a after the reconfigure: %v, want denied", err)
	}
	if _, err := o.tbl.Admit(Request{Holder: Holder{UID: 5, User: "u5"}, N: 2, Pool: "b"}); !errors.Is(err, ErrDenied) {
		t.Errorf("2 devices of the new b (1 device): %v, want denied", err)
	}
}

// TestReconfigureShare: a share waiting in line is checked again at a
// reload with its memory: its candidates stay the devices that can hold
// it, where the re-check without it made them the whole pool, a device
// too small for it and one not shared among them. Npu 0 holds 8G for
// shares, npu 1 none (not shared), npu 2 16G; a share of 12G waits for
// npu 2, held whole; after the reload it still waits for npu 2, and gets
// it once the whole lease ends.
func TestReconfigureShare(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "locks")
	o := &owner{running: map[uint32]int{}, events: make(chan string, 1024)}
	pools := []Pool{{Name: "default"}}
	tbl, err := Open(Config{Dir: dir, IDs: ids(3), Pools: pools, DefaultPool: "default", Vendor: npu.Fake, Owner: o, Capacity: map[int]int64{0: 8 << 10, 2: 16 << 10}})
	if err != nil {
		t.Fatal(err)
	}
	o.tbl = tbl
	tbl.Start(nil)
	t.Cleanup(func() { o.quiet(t) })

	whole := got(t, func() chan grant { _, ch := o.ask(t, 9, 1, "", []int{2}, policy.Limit{}); return ch }(), "u9's whole npu 2")
	w, ch := o.request(t, Request{Holder: Holder{Kind: Inline, UID: 1, User: "u1"}, Mem: 12 << 10})
	none(t, o, ch, "the 12G share while npu 2 is held whole")
	if !slices.Equal(w.Cand, []int{2}) {
		t.Fatalf("the 12G share's candidates %v, want npu 2 alone", w.Cand)
	}

	o.mu.Lock()
	refused, err := o.tbl.Reconfigure(pools, "default", func(uint32, string) (policy.Limit, bool) { return policy.Limit{}, false })
	if err == nil {
		o.serveLocked()
	}
	o.mu.Unlock()
	if err != nil || len(refused) != 0 {
		t.Fatalf("reconfigure: refused %+v, %v; want the share waiting on", refused, err)
	}
	none(t, o, ch, "the 12G share after the reload, npu 2 still held whole")
	if !slices.Equal(w.Cand, []int{2}) || w.Mem != 12<<10 {
		t.Errorf("after the reload, the share's candidates %v of %d MiB, want npu 2 alone, 12288 MiB", w.Cand, w.Mem)
	}
	whole.release()
	g := got(t, ch, "the 12G share once npu 2 is free")
	if !slices.Equal(g.l.Devices, []int{2}) || g.l.Mem != 12<<10 {
		t.Errorf("the 12G share got npu %v of %d MiB, want npu 2, 12288 MiB", g.l.Devices, g.l.Mem)
	}
	g.release()
}
