package lease

import (
	"slices"
	"time"
)

// Backfill. A request that cannot be served now reserves, in Plan, the
// free devices it could use (and closes shared ones to new shares), so
// that no later request delays it. With Room.Backfill, a later request
// whose time limit is known (Holder.Limit: a task's --time, npurun's
// --time, each with the kill's grace) may start on devices its pool's
// head reserved (the first request of the pool that waits, not blocked)
// if its lease ends, by that limit and BackfillSlack, before the head's
// estimated start (Estimate: the start the line shows for it, from the
// limits of the leases and the requests ahead); or, whenever it ends, on
// those of them the head will not need by then, where more devices come
// free by its start than it lacks (backfill.head; Grant.Beside). So the
// head starts no later than its estimate at the moment of the backfill
// (TestBackfillNeverLate). A request without a limit never backfills, nor
// onto a reservation whose start is unknown; the requests behind the head
// keep what they reserve. Shares alike: a share with a limit may go on a
// device the head reserved, or closed to shares, where the room there
// holds it and it ends in time. This is EASY backfilling (Lifka 1995;
// Mu'alem and Feitelson 2001); BenchmarkBackfill sets it beside a
// reference EASY.

// BackfillSlack is added to a backfilled request's limit: the lease is
// recorded a moment after Plan grants it (Commit), and a task's limit runs
// from its command's start, later still.
const BackfillSlack = 2 * time.Second

// MaxBackfillTests bounds how many requests Plan looks at for backfill
// once every free device is reserved: a line of thousands of requests is
// not walked whole at every release (Slurm's bf_max_job_test does the
// same).
const MaxBackfillTests = 1000

// estimator is Estimate's walk, one waiter at a time, so that Plan
// reckons only as far as it walks.
type estimator struct {
	now    int64
	free   []int64
	finite int
	c      []slot

	// byStart is, after next, how many of the waiter's candidates come
	// free by its start (0 where its start is unknown).
	byStart int
}

type slot struct {
	at int64
	id int
}

func newEstimator(now int64, free []int64) *estimator {
	e := &estimator{now: now, free: free}
	for _, at := range free {
		if at != never {
			e.finite++
		}
	}
	return e
}

// next is waiter w's start (never where unknown), w taking its devices
// from then on; blocked: it takes nothing.
func (e *estimator) next(w *Waiter, blocked bool) int64 {
	e.byStart = 0
	if e.finite == 0 || blocked || w.N <= 0 {
		return never
	}
	e.c = e.c[:0]
	for _, id := range w.Cand {
		if id >= 0 && id < len(e.free) {
			e.c = append(e.c, slot{max(e.free[id], e.now), id})
		}
	}
	if len(e.c) < w.N {
		return never
	}
	slices.SortFunc(e.c, func(a, b slot) int {
		if a.at != b.at {
			if a.at < b.at {
				return -1
			}
			return 1
		}
		return a.id - b.id
	})
	start, end := e.c[w.N-1].at, int64(never)
	if start != never && w.Holder.Limit > 0 {
		end = until(start, w.Holder.Limit)
	}
	if start != never {
		by := w.N
		for by < len(e.c) && e.c[by].at <= start {
			by++
		}
		e.byStart = by
	}
	for _, s := range e.c[:w.N] {
		if e.free[s.id] != never && end == never {
			e.finite--
		}
		e.free[s.id] = end
	}
	return start
}

// planBlocked tells whether Plan's estimate takes w as blocked, as the
// table's line does (estimatesLocked): held, external, a share (it waits
// on packing), its user at their cap, or waiting for a drained device.
func planBlocked(w *Waiter, room Room) bool {
	if w.Held || w.External || w.Mem > 0 || w.drainBlocked(room.Drained) {
		return true
	}
	r, ok := room.Devices[w.UID]
	return ok && r < w.N
}

// backfill is what Plan keeps for backfilling: the reservations made so
// far in its walk, device by device. Only a head's are backfilled onto:
// the first request of each pool that waits and that the line's estimate
// does not take as blocked (planBlocked). The requests behind a head keep
// what they reserve, as without backfill.
type backfill struct {
	est    *estimator
	now    int64
	cur    int64           // the estimated start of the waiter Plan looks at
	heads  map[string]bool // the pools whose head is found
	extra  map[*Waiter]int // a head's free devices it will not need by its start
	by     []*Waiter       // the waiter that reserved device id (or closed it to shares); nil: none
	at     []int64         // its estimated start, a head's; never: unknown, or not a head's
	free   []bool          // the device is free (reserved): a whole request may take it
	room   []int64         // the room for shares it had when reserved; -1: none
	whole  []bool          // a whole request backfilled onto it
	shared []bool          // a share backfilled onto it
	open   int             // reserved devices with a known start, not taken whole
	tests  int             // waiters looked at since every free device was reserved
}

func newBackfill(room Room, n int) *backfill {
	free := slices.Clone(room.FreeAt)
	for len(free) < n {
		free = append(free, never)
	}
	return &backfill{est: newEstimator(room.Now, free), now: room.Now, heads: map[string]bool{}, extra: map[*Waiter]int{},
		by: make([]*Waiter, n), at: make([]int64, n), free: make([]bool, n),
		room: make([]int64, n), whole: make([]bool, n), shared: make([]bool, n)}
}

// head tells whether waiter w, not served, is its pool's head, and if it
// is, notes how many of the free devices it reserves (have) it will not
// need by its start: those beyond what it lacks once the devices not free
// now that come free by then have (EASY's "extra" devices; avail: the
// devices free and not reserved before w).
func (b *backfill) head(w *Waiter, room Room, have int, avail []bool) bool {
	if b.heads[w.Pool] || planBlocked(w, room) {
		return false
	}
	b.heads[w.Pool] = true
	if b.cur == never || w.Mem > 0 {
		return true
	}
	free := 0
	for _, id := range w.Cand {
		if id >= 0 && id < len(avail) && avail[id] {
			free++
		}
	}
	later := b.est.byStart - free // not free now, free by its start
	b.extra[w] = max(0, have-max(0, w.N-later))
	return true
}

// reserve notes that the current waiter w reserved device id (isFree: it
// was free; room: what it had for shares, -1 for none); head: w is its
// pool's head, whose reservations may be backfilled onto.
func (b *backfill) reserve(w *Waiter, id int, head, isFree bool, room int64) {
	if b.by[id] != nil {
		return
	}
	at := int64(never)
	if head {
		at = b.cur
	}
	b.by[id], b.at[id], b.free[id], b.room[id] = w, at, isFree, room
	if at != never {
		b.open++
	}
}

// fits tells whether a request of limit lim ends before device id's
// reservation starts.
func (b *backfill) fits(id int, lim time.Duration) bool {
	return b.by[id] != nil && b.at[id] != never && b.now+int64(lim+BackfillSlack) <= b.at[id]
}

// fill completes got, what waiter w found free, with devices a head
// reserved: those it ends before the head's start on (whole devices, free
// and not backfilled yet, for a whole request; the room left on them,
// best fit, for a share), then, for a whole request, those the head will
// not need by its start (backfill.head), whenever w ends. It returns the
// devices (nil where w still cannot be served), the head it goes before
// that starts first, with that start, and whether it took devices the
// head will not need (then it may end after that start).
func (b *backfill) fill(w *Waiter, got []int) ([]int, *Waiter, int64, bool) {
	lim := w.Holder.Limit
	if lim <= 0 || b.open == 0 {
		// No limit, or no reserved device left that is not taken whole
		// (shares too need one): nothing to fill with, nothing allocated.
		return nil, nil, 0, false
	}
	out := slices.Clone(got)
	var extra []int
	var used map[*Waiter]int // of the heads' extra devices, made at the first
	usable := func(id int, beside bool) bool {
		if id < 0 || id >= len(b.by) || slices.Contains(out, id) || b.by[id] == nil || b.at[id] == never || b.whole[id] {
			return false
		}
		if w.Mem > 0 {
			return !beside && b.fits(id, lim) && b.room[id] >= w.Mem
		}
		if !b.free[id] || b.shared[id] {
			return false
		}
		if !beside {
			return b.fits(id, lim)
		}
		h := b.by[id]
		return b.extra[h]-used[h] > 0
	}
	pick := func(id int, beside bool) {
		extra = append(extra, id)
		out = append(out, id)
		if beside {
			if used == nil {
				used = map[*Waiter]int{}
			}
			used[b.by[id]]++
		}
	}
	if w.Exact {
		for _, id := range w.Cand {
			if slices.Contains(out, id) {
				continue
			}
			switch {
			case usable(id, false):
				pick(id, false)
			case usable(id, true):
				pick(id, true)
			default:
				return nil, nil, 0, false
			}
		}
	} else {
		for _, beside := range []bool{false, true} {
			for len(out) < w.N {
				best := -1
				for _, id := range w.Cand {
					if !usable(id, beside) {
						continue
					}
					if best < 0 || w.Mem > 0 && b.room[id] < b.room[best] {
						best = id
					}
				}
				if best < 0 {
					break
				}
				pick(best, beside)
			}
		}
		if len(out) < w.N {
			return nil, nil, 0, false
		}
	}
	if len(extra) == 0 {
		return nil, nil, 0, false
	}
	for h, n := range used {
		b.extra[h] -= n
	}
	var before *Waiter
	at := int64(never)
	for _, id := range extra {
		if w.Mem > 0 {
			b.room[id] -= w.Mem
			b.shared[id] = true
		} else {
			b.whole[id] = true
			b.open--
		}
		if b.at[id] < at {
			before, at = b.by[id], b.at[id]
		}
	}
	return out, before, at, len(used) > 0
}
