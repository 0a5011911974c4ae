package status

import (
	"errors"
	"testing"
	"time"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
)

// TestSampledIdle: samples joined to leases, in process over a real lease
// table. A lease is idle from the first of a run of samples that found
// all its devices under [idle] below: one busy device of two keeps it
// busy; an unknown device ends its run (unknown is never idle) and its
// now; its held mean is of the samples known; a run's start stays while
// it lasts.
func TestSampledIdle(t *testing.T) {
	r, _ := newRoom(t, 3, "fake_util = \"/nonexistent\"\n[status]\nutil_interval = \"1s\"\n")
	ch := make(chan handed, 2)
	r.ask(t, lease.Inline, 1001, 2, ch) // npu0 and npu1
	r.ask(t, lease.Inline, 1002, 1, ch) // npu2
	var got []handed
	for range 2 {
		select {
		case h := <-ch:
			got = append(got, h)
			defer h.release()
		case <-time.After(wait):
			t.Fatal("no grant")
		}
	}
	leaseOf := func(id int) *wire.LeaseInfo {
		t.Helper()
		b, _ := r.g.Board(0)
		for _, d := range b.Devices {
			if d.ID == id && d.Lease != nil {
				return d.Lease
			}
		}
		t.Fatalf("no lease on npu%d", id)
		return nil
	}
	pct := func(p *float64) float64 {
		if p == nil {
			return -1
		}
		return *p
	}
	u := func(ps ...float64) map[int]npu.Util {
		m := map[int]npu.Util{}
		for id, p := range ps {
			if p >= 0 {
				m[id] = npu.Util{Percent: p, MemUsed: -1, MemTotal: -1}
			}
		}
		return m
	}
	t0 := time.Now().Truncate(time.Millisecond)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }

	r.g.sampled(at(0), u(90, 2, 1), nil)
	if a, b := leaseOf(0), leaseOf(2); pct(a.Util) != 46 || a.IdleSince != 0 || b.IdleSince != at(0).UnixMilli() {
		t.Errorf("sample 0: npu0+1 now %v idle %d (want 46, not idle); npu2 idle %d (want %d)", pct(a.Util), a.IdleSince, b.IdleSince, at(0).UnixMilli())
	}
	r.g.sampled(at(1), u(0, 2, 1), nil)
	if a, b := leaseOf(0), leaseOf(2); a.IdleSince != at(1).UnixMilli() || b.IdleSince != at(0).UnixMilli() {
		t.Errorf("sample 1: npu0+1 idle %d (want %d); npu2 idle %d (want still %d)", a.IdleSince, at(1).UnixMilli(), b.IdleSince, at(0).UnixMilli())
	}
	r.g.sampled(at(2), u(0, -1, 50), map[int]error{1: errors.New("hung")})
	if a, b := leaseOf(0), leaseOf(2); a.Util != nil || a.IdleSince != 0 || b.IdleSince != 0 || pct(b.Util) != 50 {
		t.Errorf("sample 2: npu0+1 (npu1 unknown) now %v idle %d, want unknown, not idle; npu2 (50%%) idle %d", pct(a.Util), a.IdleSince, b.IdleSince)
	}
	if b, _ := r.g.Board(0); b.Devices[1].Util != nil || b.Devices[1].UtilUnknown != "hung" {
		t.Errorf("sample 2: npu1 %v, unknown %q; want unknown for \"hung\"", pct(b.Devices[1].Util), b.Devices[1].UtilUnknown)
	}
	r.g.sampled(at(3), u(0, 0, 0), nil)
	a := leaseOf(0)
	if want := (46.0 + 1 + 0) / 3; a.IdleSince != at(3).UnixMilli() || pct(a.UtilHeld) != want { // the unknown sample left out
		t.Errorf("sample 3: npu0+1 idle %d (want %d), held %v (want %v)", a.IdleSince, at(3).UnixMilli(), pct(a.UtilHeld), want)
	}
	// The tool gone: nothing known, nothing idle, no sampling on the board.
	r.g.sampled(at(4), nil, nil)
	if b, _ := r.g.Board(0); b.Util != nil || b.Devices[0].Util != nil || b.Devices[0].Lease.IdleSince != 0 {
		t.Errorf("no tool: board %+v, npu0 %v, idle %d", b.Util, pct(b.Devices[0].Util), b.Devices[0].Lease.IdleSince)
	}
}
