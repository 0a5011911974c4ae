package lease

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
)

func shareWaiter(name string, uid uint32, mem int64, n int, cand ...int) *Waiter {
	return &Waiter{Pool: name, Holder: Holder{Kind: Inline, UID: uid}, N: n, Cand: cand, Mem: mem}
}

// granted writes Plan's grants as "name:devices".
func granted(gs []Grant) []string {
	var out []string
	for _, g := range gs {
		out = append(out, fmt.Sprintf("%s:%v", g.W.Pool, g.Devices))
	}
	return out
}

// TestPlanShares: shares go by best fit (the device with least room that
// holds them, so large free spaces stay whole), never over the room
// left, and several fit on one device.
func TestPlanShares(t *testing.T) {
	for _, tc := range []struct {
		name  string
		order []*Waiter
		free  []bool
		room  []int64
		want  []string
	}{
		{
			name:  "best fit keeps the free device whole",
			order: []*Waiter{shareWaiter("a", 1, 10, 1, 0, 1, 2)},
			free:  freeSet(3, 2),
			room:  []int64{30, 12, 63},
			want:  []string{"a:[1]"},
		},
		{
			name:  "packing several on one device, never over",
			order: []*Waiter{shareWaiter("a", 1, 20, 1, 0), shareWaiter("b", 2, 20, 1, 0), shareWaiter("c", 3, 20, 1, 0), shareWaiter("d", 4, 10, 1, 0)},
			free:  freeSet(1, 0),
			room:  []int64{63},
			want:  []string{"a:[0]", "b:[0]", "c:[0]"},
		},
		{
			name:  "a share of each of two devices",
			order: []*Waiter{shareWaiter("a", 1, 8, 2, 0, 1, 2)},
			free:  freeSet(3),
			room:  []int64{10, 50, 9},
			want:  []string{"a:[2 0]"},
		},
		{
			name:  "a device leased whole or not shared takes none",
			order: []*Waiter{shareWaiter("a", 1, 1, 1, 0, 1)},
			free:  freeSet(2),
			room:  []int64{-1, -1},
			want:  nil,
		},
		{
			name: "a whole-device waiter closes the device with shares to more",
			order: []*Waiter{
				waiter("whole", 1, 1, 0, 1),
				shareWaiter("s1", 2, 4, 1, 0, 1),
				shareWaiter("s2", 3, 4, 1, 0, 1),
			},
			free: freeSet(2),
			room: []int64{40, 50},
			// Device 1 has the most room, least declared: closed for
			// the whole waiter; the shares go on device 0.
			want: []string{"s1:[0]", "s2:[0]"},
		},
		{
			name: "a whole-device waiter takes a free device and shares keep off it",
			order: []*Waiter{
				waiter("whole", 1, 1, 0, 1),
				shareWaiter("s1", 2, 4, 1, 0, 1),
			},
			free: freeSet(2, 1),
			room: []int64{40, 63},
			want: []string{"whole:[1]", "s1:[0]"},
		},
		{
			name: "a large share that does not fit closes the roomiest device",
			order: []*Waiter{
				patient(shareWaiter("big", 1, 60, 1, 0, 1)),
				shareWaiter("small", 2, 4, 1, 0, 1),
			},
			free: freeSet(2),
			room: []int64{3, 50},
			want: nil,
		},
		{
			name: "until SharePatience requests have passed it, it closes none",
			order: []*Waiter{
				passedBy(shareWaiter("big", 1, 60, 1, 0, 1), SharePatience-1),
				shareWaiter("small", 2, 4, 1, 0, 1),
			},
			free: freeSet(2),
			room: []int64{3, 50},
			want: []string{"small:[1]"},
		},
		{
			name: "only the first share that waits closes a device",
			order: []*Waiter{
				patient(shareWaiter("big1", 1, 60, 1, 0, 1, 2)),
				patient(shareWaiter("big2", 2, 60, 1, 0, 1, 2)),
				shareWaiter("small", 3, 35, 1, 0, 1, 2),
			},
			free: freeSet(3),
			room: []int64{40, 50, 30},
			// big1 closes npu 1; big2 closes none (were it to, npu 0);
			// small fits npu 0 alone.
			want: []string{"small:[0]"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := granted(Plan(tc.order, tc.free, Room{Share: tc.room}))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Plan = %v, want %v", got, tc.want)
			}
		})
	}
}

// passedBy is w as if n requests behind it had started while it waited.
func passedBy(w *Waiter, n int) *Waiter {
	w.passed = n
	return w
}

// patient is w once it has let SharePatience requests pass: it closes a
// device for itself.
func patient(w *Waiter) *Waiter { return passedBy(w, SharePatience) }

// TestCountPassed: Schedule counts, for each share not served, the
// requests served behind it, and only for shares.
func TestCountPassed(t *testing.T) {
	a, b, c, d, e := shareWaiter("a", 1, 60, 1, 0), waiter("b", 2, 1, 0), shareWaiter("c", 3, 60, 1, 0), shareWaiter("d", 4, 4, 1, 0), waiter("e", 5, 1, 0)
	countPassed([]*Waiter{a, b, c, d, e}, []Grant{{W: b}, {W: d}})
	for _, tc := range []struct {
		w    *Waiter
		want int
	}{{a, 2}, {b, 0}, {c, 1}, {d, 0}, {e, 0}} {
		if tc.w.passed != tc.want {
			t.Errorf("%s passed by %d, want %d", tc.w.Pool, tc.w.passed, tc.want)
		}
	}
}

// shareRounds serves q round by round on devices with room left and the
// shares declared on each (oldest first): each round, Plan serves what
// it can, as Table.Schedule does (countPassed too), then the oldest share
// on each device ends. It returns the round in which the waiter of pool
// target was served, -1 if none of rounds served it.
func shareRounds(q *Queue, room []int64, declared map[int][]int64, rounds int, target string) int {
	for round := 0; round < rounds; round++ {
		free := freeSet(len(room))
		for id := range room {
			free[id] = len(declared[id]) == 0
		}
		order := q.Waiters()
		gs := Plan(order, free, Room{Share: slices.Clone(room)})
		countPassed(order, gs)
		for _, g := range gs {
			q.Remove(g.W, true)
			if g.W.Pool == target {
				return round
			}
			for _, id := range g.Devices {
				declared[id] = append(declared[id], g.W.Mem)
				room[id] -= g.W.Mem
			}
		}
		for id := range room {
			if len(declared[id]) > 0 {
				room[id] += declared[id][0]
				declared[id] = declared[id][1:]
			}
		}
	}
	return -1
}

// TestPlanSharesHeadServed: a large share in front of a stream of small
// ones is served once SharePatience of them have passed it and the
// device it then closes has emptied: shares never starve a share.
func TestPlanSharesHeadServed(t *testing.T) {
	const capacity, small = 63, 8
	q := NewQueue()
	q.Add(shareWaiter("big", 1, 60, 1, 0, 1))
	for i := range 200 {
		q.Add(shareWaiter(fmt.Sprintf("s%d", i), uint32(10+i), small, 1, 0, 1))
	}
	// Patience spent, a device holds at most capacity/small shares,
	// which end one a round: then it has room for big.
	within := SharePatience + capacity/small + 1
	// A share of 13 on each device at first: big fits neither.
	room, declared := []int64{capacity - 13, capacity - 13}, map[int][]int64{0: {13}, 1: {13}}
	if round := shareRounds(q, room, declared, within+1, "big"); round < 0 {
		t.Fatalf("the large share was not served within %d rounds of a stream of small ones", within)
	}
}

// TestPlanSharesWholeServed: with shares coming and going on every
// device, a whole-device waiter is served as soon as the shares that were
// there when it came have ended: none lands on the devices it closed.
func TestPlanSharesWholeServed(t *testing.T) {
	const capacity = 63
	q := NewQueue()
	q.Add(waiter("whole", 1, 1, 0, 1))
	for i := range 20 {
		q.Add(shareWaiter(fmt.Sprintf("s%d", i), uint32(10+i), 8, 1, 0, 1))
	}
	room, declared := []int64{capacity - 8, capacity - 8}, map[int][]int64{0: {8}, 1: {8}}
	switch round := shareRounds(q, room, declared, 10, "whole"); {
	case round < 0:
		t.Fatal("the whole-device waiter was never served")
	case round > 1:
		t.Fatalf("the whole-device waiter was served in round %d, want 1 at the latest", round)
	}
}

// newShareTable is newTable of one device of capacity MiB for shares.
func newShareTable(t *testing.T, capacity int64) (*owner, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "locks")
	o := &owner{running: map[uint32]int{}, events: make(chan string, 1024)}
	tbl, err := Open(Config{Dir: dir, IDs: ids(1), Pools: []Pool{{Name: "default"}}, DefaultPool: "default", Vendor: npu.Fake, Owner: o, Capacity: map[int]int64{0: capacity}})
	if err != nil {
		t.Fatal(err)
	}
	o.tbl = tbl
	tbl.Start(nil)
	t.Cleanup(func() { o.quiet(t) })
	return o, dir
}

// askShare queues a share of mem MiB for uid and serves the line.
func (o *owner) askShare(t *testing.T, uid uint32, mem int64) chan grant {
	t.Helper()
	_, ch := o.request(t, Request{Holder: Holder{Kind: Inline, UID: uid, User: fmt.Sprintf("u%d", uid)}, Mem: mem})
	return ch
}

// request queues req and serves the line: its waiter, and where its grant
// goes.
func (o *owner) request(t *testing.T, req Request) (*Waiter, chan grant) {
	t.Helper()
	ch := make(chan grant, 1)
	w, err := o.tbl.Admit(req)
	if err != nil {
		t.Fatalf("admit %+v: %v", req, err)
	}
	w.Ref = ch
	o.mu.Lock()
	o.tbl.Add(w)
	o.serveLocked()
	o.mu.Unlock()
	return w, ch
}

// TestShareFiles: each share is on a lock file of its own, made for it
// with its declaration inside, and removed at its end; a share's holder
// that keeps its descriptor and locks it again takes its own old file,
// never a later share's; the device's own lock file is a whole lease's
// once the last share has ended, and not before.
func TestShareFiles(t *testing.T) {
	o, dir := newShareTable(t, 16<<10)
	a := got(t, o.askShare(t, 1, 4<<10), "share a")
	b := got(t, o.askShare(t, 2, 4<<10), "share b")
	if a.l.Mem != 4<<10 || a.l.Files[0] == b.l.Files[0] {
		t.Fatalf("shares a and b: %+v, %+v: want each its own file", a.l, b.l)
	}
	for _, g := range []grant{a, b} {
		if f := fdFile(t, g.fds[0]); f != g.l.Files[0] {
			t.Errorf("share %d's descriptor is on %v, its record says %v", g.l.ID, f, g.l.Files[0])
		}
	}
	data, err := os.ReadFile(SharePath(dir, 0, 0))
	if err != nil || string(data) != "4096\n" {
		t.Fatalf("share a's file: %q, %v; want its declaration", data, err)
	}
	whole := make(chan grant, 1)
	o.askTo(t, whole, 3, 1, "", nil, policy.Limit{})
	none(t, o, whole, "a whole lease beside shares")

	// a keeps its descriptor: unlocked, its share ends, and its file goes.
	if err := unix.Flock(a.fds[0], unix.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	awaitEvent(t, o, fmt.Sprintf("released %d", a.l.ID))
	awaitEvent(t, o, "freed")
	if _, err := os.Lstat(SharePath(dir, 0, 0)); !os.IsNotExist(err) {
		t.Fatalf("an ended share's file is still there: %v", err)
	}
	// The whole request waits for b; b's end gives it the device.
	none(t, o, whole, "a whole lease beside one share")
	b.release()
	w := got(t, whole, "the whole lease after the last share")
	if f := fdFile(t, w.fds[0]); f != pathFile(t, LockPath(dir, 0)) {
		t.Fatalf("the whole lease is on %v, not the device's file", f)
	}
	// a's old descriptor locks its own old file at once: it reaches
	// neither the whole lease's file nor any share's.
	if err := unix.Flock(a.fds[0], unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatalf("a's kept descriptor: %v; want its own old, unlinked file, free", err)
	}
	unix.Close(a.fds[0])
	w.release()
}

// TestEstimateShares: the line's estimates leave devices with shares out:
// a share waits on packing, not on a device coming free, and a device
// holding shares takes new ones until a whole request closes it (Plan),
// so neither a share nor a whole request waiting on such a device has a
// known start, even with every limit known.
func TestEstimateShares(t *testing.T) {
	o, _ := newShareTable(t, 16<<10)
	limited := Holder{Kind: Inline, UID: 1, User: "u1", Limit: time.Hour}
	ask := func(req Request) (*Waiter, chan grant) { return o.request(t, req) }
	_, ach := ask(Request{Holder: limited, Mem: 12 << 10})
	a := got(t, ach, "a share with a limit")
	share, sch := ask(Request{Holder: limited, Mem: 8 << 10})
	whole, wch := ask(Request{Holder: limited, N: 1})
	none(t, o, sch, "a share that does not fit")
	none(t, o, wch, "a whole request behind shares")
	want := map[*Waiter]time.Time{share: {}, whole: {}}
	o.tbl.Starts(want)
	for w, at := range want {
		if !at.IsZero() {
			t.Errorf("waiter (mem %d MiB) estimated to start at %v, want unknown", w.Mem, at)
		}
	}
	a.release()
	got(t, sch, "the share, once a has ended").release()
	got(t, wch, "the whole request, once the shares have ended").release()
}

// TestShareCapacityLater: a device shared by the configuration whose
// memory is not known yet (Config.Unknown) admits share requests, which
// wait saying why, and wakes its owner to ask again (Config.Ask); once
// SetCapacity says its memory, the shares that fit are granted, and one
// that it turns out too small for is taken out of line, refused.
func TestShareCapacityLater(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "locks")
	o := &owner{running: map[uint32]int{}, events: make(chan string, 1024)}
	ask := make(chan struct{}, 1)
	tbl, err := Open(Config{Dir: dir, IDs: ids(1), Pools: []Pool{{Name: "default"}}, DefaultPool: "default", Vendor: npu.Fake, Owner: o,
		Unknown: map[int]string{0: "run npu-smi info: exit status 1"}, Ask: ask})
	if err != nil {
		t.Fatal(err)
	}
	o.tbl = tbl
	tbl.Start(nil)
	t.Cleanup(func() { o.quiet(t) })

	small, sch := o.request(t, Request{Holder: Holder{Kind: Inline, UID: 1, User: "u1"}, Mem: 4 << 10})
	big, bch := o.request(t, Request{Holder: Holder{Kind: Inline, UID: 2, User: "u2"}, Devices: []int{0}, Mem: 20 << 10})
	select {
	case <-ask:
	default:
		t.Error("a share request for a device whose memory is unknown did not ask for it again")
	}
	none(t, o, sch, "a share of a device whose memory is unknown")
	none(t, o, bch, "a share of a device whose memory is unknown")
	if why, want := tbl.Reason(small), "npu 0 takes no share until its memory is known (run npu-smi info: exit status 1)"; !strings.HasPrefix(why, want) {
		t.Errorf("the share waits for %q, want %q", why, want)
	}
	if got := tbl.Unknown(); !slices.Equal(got, []int{0}) {
		t.Errorf("Unknown = %v, want [0]", got)
	}

	refused := tbl.SetCapacity(0, 16<<10)
	if len(refused) != 1 || refused[0].W != big || !strings.Contains(refused[0].Why.Msg, "holds 16G for shares at most") {
		t.Fatalf("SetCapacity refused %+v; want the 20G share, too large for the 16G known now", refused)
	}
	if got := tbl.Unknown(); len(got) != 0 {
		t.Errorf("Unknown = %v once known, want none", got)
	}
	o.Freed()
	got(t, sch, "the 4G share, the device's memory known").release()
}
