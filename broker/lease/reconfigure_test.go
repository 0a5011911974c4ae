package lease

import (
	"errors"
	"slices"
	"testing"

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
