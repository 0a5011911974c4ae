package status

import (
	"fmt"
	"testing"
	"time"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/wire"
)

// TestLeaseHistory: one entry per device of each lease held at any time
// in the window, in the order of their starts; a lease carried into a
// fresh file ("open") counts once; one held now has no end, one whose end
// was lost is left out and counted; a kind change is the lease's kind;
// past the bound the newest starts are kept.
func TestLeaseHistory(t *testing.T) {
	util := 40.0
	old := []usageRec{
		startRec(1, 100, "alice", wire.KindInline, 0), endRec(1, 200, 0), // ended before the window
		startRec(2, 300, "bob", wire.KindTask, 0, 1), endRec(2, 400, 0),
		startRec(3, 350, "carol", wire.KindInline, 2), // its end lost
	}
	cur := []usageRec{
		{T: 300, Ev: "open", Lease: 2, Kind: wire.KindTask, User: "bob", Devices: []int{0, 1}},
		{T: 1000, Ev: "end", Lease: 2, Device: dev(1), How: endReclaimed, Util: &util, IdleMS: 500},
		startRec(4, 900, "dave", wire.KindInline, 3),                      // held now
		{T: 950, Ev: "kind", Lease: 4, Kind: wire.KindContainer},          // became a container's
		startRec(5, 2000, "erin", wire.KindInline, 4), endRec(5, 2100, 4), // after the window
	}
	name := func(d int) string { return fmt.Sprintf("npu%d", d) }
	live := func(id uint64) (bool, *float64, int64) { return id == 4, nil, 7 }
	rep := leaseHistory([][]usageRec{old, cur}, 250, 1500, 10, name, live)
	type got struct {
		lease      uint64
		dev        int
		start, end int64
		user, kind string
	}
	var gs []got
	for _, e := range rep.Entries {
		gs = append(gs, got{e.Lease, e.Device, e.Start, e.End, e.User, e.Kind})
	}
	want := []got{
		{2, 0, 300, 400, "bob", wire.KindTask},
		{2, 1, 300, 1000, "bob", wire.KindTask},
		{4, 3, 900, 0, "dave", wire.KindContainer},
	}
	if fmt.Sprint(gs) != fmt.Sprint(want) {
		t.Fatalf("entries %v, want %v", gs, want)
	}
	if e := rep.Entries[1]; e.How != endReclaimed || e.Util == nil || *e.Util != 40 || e.IdleMS != 500 || e.Name != "npu1" {
		t.Errorf("lease 2's npu1: %+v, want reclaimed, util 40, idle 500 ms", e)
	}
	if e := rep.Entries[2]; e.IdleMS != 7 {
		t.Errorf("lease 4, held now: idle %d ms, want the live figure 7", e.IdleMS)
	}
	if rep.Incomplete != 1 || rep.Cut {
		t.Errorf("incomplete %d cut %v, want 1 (carol's lost end), not cut", rep.Incomplete, rep.Cut)
	}
	rep = leaseHistory([][]usageRec{old, cur}, 250, 1500, 2, name, live)
	if len(rep.Entries) != 2 || rep.Entries[0].Device != 1 || rep.Entries[1].Lease != 4 || !rep.Cut {
		t.Errorf("at most 2: %+v cut %v, want lease 2's npu1 and lease 4, cut", rep.Entries, rep.Cut)
	}
}

// TestLeaseHistoryLive: the room's own history over a real accounting
// log: a lease ended and a lease held now, and a query's bounds (a start
// in the future refused, one more than the span back taken as the span).
func TestLeaseHistoryLive(t *testing.T) {
	r, _ := newRoom(t, 2, "")
	a, b := make(chan handed, 1), make(chan handed, 1)
	r.ask(t, lease.Inline, 1001, 1, a)
	ha := <-a
	r.ask(t, lease.Inline, 1002, 1, b)
	hb := <-b
	ha.release()
	r.awaitFreed(t)
	defer hb.release()
	// awaitFreed: the ledger was told of the end (Released), and
	// LeaseHistory flushes what is queued for the log.
	rep, err := r.g.LeaseHistory(&wire.HistoryQuery{SinceMS: time.Now().Add(-30 * 24 * time.Hour).UnixMilli()})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Entries) != 2 || rep.Entries[0].User != "u1001" || rep.Entries[0].End == 0 || rep.Entries[1].User != "u1002" || rep.Entries[1].End != 0 {
		t.Fatalf("history %+v, want u1001's lease ended and u1002's held", rep.Entries)
	}
	if span := time.Duration(rep.Until-rep.Since) * time.Millisecond; span > wire.MaxHistorySpan+time.Minute {
		t.Errorf("a query 30 days back spans %v, want at most %v", span, wire.MaxHistorySpan)
	}
	if _, err := r.g.LeaseHistory(&wire.HistoryQuery{SinceMS: time.Now().Add(time.Hour).UnixMilli()}); err != ErrBadQuery {
		t.Errorf("a start in the future: %v, want ErrBadQuery", err)
	}
}
