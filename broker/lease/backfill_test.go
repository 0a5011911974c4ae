package lease

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

const grace = 10 * time.Second // [tasks] kill_grace's default, in a task's Holder.Limit

// TestBackfillLines: hand-worked lines. Four devices, npu0 and npu1 free,
// npu2 and npu3 leased until +20 min; the head wants all four, so it
// reserves npu0 and npu1 and starts at +20 min (Estimate).
func TestBackfillLines(t *testing.T) {
	const m = int64(time.Minute)
	now := int64(1_000_000) * m
	all := []int{0, 1, 2, 3}
	freeAt := []int64{now, now, now + 20*m, now + 20*m}
	free := []bool{true, true, false, false}
	head := &Waiter{Holder: Holder{Kind: Task, Task: 118, Limit: time.Hour + grace}, N: 4, Cand: all}
	task := func(n int, limit time.Duration) *Waiter {
		h := Holder{Kind: Task, Task: 200, UID: 7}
		if limit > 0 {
			h.Limit = limit + grace
		}
		return &Waiter{Holder: h, N: n, Cand: all}
	}
	share := func(mem int64, limit time.Duration) *Waiter {
		return &Waiter{Holder: Holder{Kind: Inline, UID: 8, Limit: limit + grace}, N: 1, Mem: mem, Cand: all}
	}
	room := func(on bool) Room { return Room{Backfill: on, Now: now, FreeAt: freeAt} }
	shared := func(on bool) Room {
		r := room(on)
		r.Share = []int64{64 << 10, 64 << 10, -1, -1}
		return r
	}
	for _, tc := range []struct {
		name  string
		order []*Waiter
		room  Room
		want  [][]int // devices of each waiter behind the head (nil: waits)
	}{
		{"10 min before a start in 20: backfilled", []*Waiter{head, task(1, 10*time.Minute)}, room(true), [][]int{{0}}},
		{"30 min: not", []*Waiter{head, task(1, 30*time.Minute)}, room(true), [][]int{nil}},
		{"19:50 and the grace: not", []*Waiter{head, task(1, 19*time.Minute+50*time.Second)}, room(true), [][]int{nil}},
		{"no limit: never", []*Waiter{head, task(1, 0)}, room(true), [][]int{nil}},
		{"backfill = false", []*Waiter{head, task(1, 10*time.Minute)}, room(false), [][]int{nil}},
		{"two devices, then no more", []*Waiter{head, task(2, 5*time.Minute), task(1, 5*time.Minute)}, room(true), [][]int{{0, 1}, nil}},
		{"one each", []*Waiter{head, task(1, 5*time.Minute), task(1, 15*time.Minute), task(1, 1*time.Minute)}, room(true), [][]int{{0}, {1}, nil}},
		{"a share of 10 min", []*Waiter{head, share(8<<10, 10*time.Minute), share(8<<10, 10*time.Minute)}, shared(true), [][]int{{0}, {0}}},
		{"a share of 30 min: not", []*Waiter{head, share(8<<10, 30*time.Minute)}, shared(true), [][]int{nil}},
		{"shares fill the room, best fit", []*Waiter{head, share(40<<10, 10*time.Minute), share(40<<10, 10*time.Minute), share(20<<10, 10*time.Minute)}, shared(true), [][]int{{0}, {1}, {0}}},
		{"a whole device after a share", []*Waiter{head, share(8<<10, 10*time.Minute), task(2, 10*time.Minute)}, shared(true), [][]int{{0}, nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gs := Plan(tc.order, free, tc.room)
			for i, w := range tc.order[1:] {
				var got []int
				for _, g := range gs {
					if g.W == w {
						got = g.Devices
						if g.Before != head || g.BeforeAt != now+20*m {
							t.Errorf("waiter %d: backfilled before %v at %s, want the head at +20m", i+1, g.Before, rel(g.BeforeAt, now))
						}
					}
				}
				if !slices.Equal(got, tc.want[i]) {
					t.Errorf("waiter %d: devices %v, want %v", i+1, got, tc.want[i])
				}
			}
			for _, g := range gs {
				if g.W == head {
					t.Errorf("the head is served with %v", g.Devices)
				}
			}
		})
	}
}

// TestBackfillBeside: a head of 3 devices with npu0 and npu1 free and
// npu2 and npu3 leased until +20 min starts at +20 on one free device and
// the two that come free then: it does not need the other free one, which
// a request with a limit may take however long it runs (EASY's "extra"
// devices), one only; a request without a limit may not.
func TestBackfillBeside(t *testing.T) {
	const m = int64(time.Minute)
	now := int64(1_000_000) * m
	all := []int{0, 1, 2, 3}
	free := []bool{true, true, false, false}
	room := Room{Backfill: true, Now: now, FreeAt: []int64{now, now, now + 20*m, now + 20*m}}
	head := &Waiter{Holder: Holder{Kind: Task, Task: 118, Limit: time.Hour}, N: 3, Cand: all}
	long := func(limit time.Duration) *Waiter {
		return &Waiter{Holder: Holder{Kind: Task, Task: 200, Limit: limit}, N: 1, Cand: all}
	}
	a, b, c := long(3*time.Hour), long(3*time.Hour), long(0)
	gs := Plan([]*Waiter{head, c, a, b}, free, room)
	if len(gs) != 1 || gs[0].W != a || !slices.Equal(gs[0].Devices, []int{0}) || !gs[0].Beside || gs[0].Before != head || gs[0].BeforeAt != now+20*m {
		t.Errorf("grants %+v; want the first 3-hour request on npu0, beside the head", gs)
	}
}

// TestBackfillNeverLate: over 10,000 random lines run to their end in
// simulated time, each request running for no longer than its limit, no
// request whose reservation a backfill took starts later than its
// estimated start at the moment of that backfill. Seeded: a failure names
// the line's seed, which reproduces it.
func TestBackfillNeverLate(t *testing.T) {
	lines := 10000
	if testing.Short() {
		lines = 1000
	}
	backfilled := 0
	for seed := range uint64(lines) {
		n, err := simulateLine(seed)
		if err != nil {
			t.Fatalf("line %d: %v", seed, err)
		}
		backfilled += n
	}
	if backfilled < lines/10 {
		t.Errorf("only %d backfills in %d lines: the lines test little", backfilled, lines)
	}
	t.Logf("%d backfills in %d lines", backfilled, lines)
}

// simulateLine runs one random line from seed through Plan with backfill,
// returning how many grants were backfilled, or the first late start.
func simulateLine(seed uint64) (int, error) {
	const m = int64(time.Minute)
	r := rand.New(rand.NewPCG(seed, 31))
	devs := 2 + r.IntN(7)
	all := make([]int, devs)
	for i := range all {
		all[i] = i
	}
	type job struct {
		w          *Waiter
		run        int64
		start, end int64
		deadline   int64
	}
	limit := func() time.Duration {
		if r.IntN(6) == 0 {
			return 0 // no limit
		}
		return time.Duration(1+r.IntN(120)) * time.Minute
	}
	// Devices busy at the start: leases with or without a limit.
	end := make([]int64, devs)    // when the lease on it ends; 0: free
	endsBy := make([]int64, devs) // its limit's end; never: none
	for id := range devs {
		if r.IntN(2) == 0 {
			lim := limit()
			endsBy[id] = never
			run := int64(1+r.IntN(120)) * m
			if lim > 0 {
				endsBy[id] = int64(lim)
				run = min(run, int64(lim))
			}
			end[id] = run
		}
	}
	var jobs []*job
	var line []*Waiter
	for range 3 + r.IntN(12) {
		lim := limit()
		w := &Waiter{Holder: Holder{Limit: lim, UID: uint32(r.IntN(3))}, N: 1 + r.IntN(devs), Cand: all}
		if r.IntN(5) == 0 { // an explicit subset
			k := 1 + r.IntN(devs)
			w.Cand = slices.Sorted(slices.Values(r.Perm(devs)[:k]))
			w.N = min(w.N, k)
			w.Exact = r.IntN(2) == 0
			if w.Exact {
				w.N = k
			}
		}
		run := int64(1+r.IntN(120)) * m
		if lim > 0 {
			run = min(run, int64(float64(lim)*(0.2+0.8*r.Float64())))
		}
		j := &job{w: w, run: run, deadline: never}
		w.Ref = j
		jobs = append(jobs, j)
		line = append(line, w)
	}
	now := int64(0)
	backfills := 0
	for steps := 0; len(line) > 0; steps++ {
		if steps > 1000 {
			return backfills, fmt.Errorf("stuck")
		}
		free := make([]bool, devs)
		at := make([]int64, devs)
		for id := range devs {
			free[id] = end[id] <= now
			switch {
			case free[id]:
				at[id] = now
			default:
				at[id] = endsBy[id]
			}
		}
		for _, g := range Plan(line, free, Room{Backfill: true, Now: now, FreeAt: at}) {
			j := g.W.Ref.(*job)
			j.start, j.end = now, now+j.run
			if g.Before != nil {
				backfills++
				if g.W.Holder.Limit <= 0 || !g.Beside && now+int64(g.W.Holder.Limit) > g.BeforeAt {
					return backfills, fmt.Errorf("a backfill of limit %v at %s goes past %s", g.W.Holder.Limit, rel(now, 0), rel(g.BeforeAt, 0))
				}
				b := g.Before.Ref.(*job)
				b.deadline = min(b.deadline, g.BeforeAt)
			}
			for _, id := range g.Devices {
				if !free[id] {
					return backfills, fmt.Errorf("npu %d granted twice", id)
				}
				free[id] = false
				end[id] = j.end
				endsBy[id] = never
				if lim := g.W.Holder.Limit; lim > 0 {
					endsBy[id] = now + int64(lim)
				}
			}
			line = slices.DeleteFunc(line, func(w *Waiter) bool { return w == g.W })
		}
		next := int64(never)
		for _, e := range end {
			if e > now {
				next = min(next, e)
			}
		}
		if next == never {
			if len(line) > 0 {
				return backfills, fmt.Errorf("%d waiters left and nothing runs", len(line))
			}
			break
		}
		now = next
	}
	for i, j := range jobs {
		if j.start > j.deadline {
			return backfills, fmt.Errorf("request %d (%d devices) started at %s, after its estimate %s when a backfill took its devices", i, j.w.N, rel(j.start, 0), rel(j.deadline, 0))
		}
	}
	return backfills, nil
}

// TestUntilSaturates: an end a century's limit after another's, chained
// on one device, stays at never rather than wrap round to the past.
func TestUntilSaturates(t *testing.T) {
	now := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC).UnixNano()
	century := 100 * 365 * 24 * time.Hour
	if got := until(now, century); got != now+int64(century) {
		t.Errorf("until(now, a century) = %d", got)
	}
	if got := until(until(until(now, century), century), century); got != never {
		t.Errorf("three centuries chained = %d, want never", got)
	}
	if got := until(never, time.Second); got != never {
		t.Errorf("until(never, 1s) = %d, want never", got)
	}
}
