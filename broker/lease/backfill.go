package lease

import (
	"slices"
	"time"
)

// Backfill. A request that cannot be served now reserves, in Plan, the
// free devices it could use (and closes shared ones to new shares), so
// that no later request delays it. With Room.Backfill, a later request
// whose time limit is known (Holder.Limit: a task's --time, npurun's
// --time, each with the kill's grace) may start on devices a request
// ahead of it reserved, if its lease ends, by that limit and
// BackfillSlack, before that request's estimated start (Estimate: the
// start the line shows for it, from the limits of the leases and the
// requests ahead): by then its devices are free again, so the request
// ahead starts no later than its estimate at the moment of the backfill
// (TestBackfillNeverLate). A request without a limit never backfills, nor
// onto a reservation whose start is unknown. Shares alike: a share with a
// limit may go on a reserved device, or on one a whole-device request
// closed to shares, where the room there holds it and it ends in time.
// This is EASY backfilling (Lifka 1995; Mu'alem and Feitelson 2001) with
// every reservation protected, not the head's alone, as Slurm's backfill
// does.

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
		end = start + int64(w.Holder.Limit)
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
// far in its walk, device by device.
type backfill struct {
	est    *estimator
	now    int64
	cur    int64     // the estimated start of the waiter Plan looks at
	by     []*Waiter // the waiter that reserved device id (or closed it to shares); nil: none
	at     []int64   // its estimated start; never: unknown
	free   []bool    // the device is free (reserved): a whole request may take it
	room   []int64   // the room for shares it had when reserved; -1: none
	whole  []bool    // a whole request backfilled onto it
	shared []bool    // a share backfilled onto it
	open   int       // reserved devices with a known start, not taken whole
	tests  int       // waiters looked at since every free device was reserved
}

func newBackfill(room Room, n int) *backfill {
	free := slices.Clone(room.FreeAt)
	for len(free) < n {
		free = append(free, never)
	}
	return &backfill{est: newEstimator(room.Now, free), now: room.Now,
		by: make([]*Waiter, n), at: make([]int64, n), free: make([]bool, n),
		room: make([]int64, n), whole: make([]bool, n), shared: make([]bool, n)}
}

// reserve notes that the current waiter w reserved device id (isFree: it
// was free; room: what it had for shares, -1 for none).
func (b *backfill) reserve(w *Waiter, id int, isFree bool, room int64) {
	if b.by[id] != nil {
		return
	}
	b.by[id], b.at[id], b.free[id], b.room[id] = w, b.cur, isFree, room
	if b.cur != never {
		b.open++
	}
}

// fits tells whether a request of limit lim ends before device id's
// reservation starts.
func (b *backfill) fits(id int, lim time.Duration) bool {
	return b.by[id] != nil && b.at[id] != never && b.now+int64(lim+BackfillSlack) <= b.at[id]
}

// fill completes got, what waiter w found free, with reserved devices it
// ends before the start of: whole devices, free and not backfilled yet,
// for a whole request; the room left on them, best fit, for a share. It
// returns the devices (nil where w still cannot be served), and the
// reservation it goes before that starts first.
func (b *backfill) fill(w *Waiter, got []int) ([]int, *Waiter, int64) {
	lim := w.Holder.Limit
	if lim <= 0 {
		return nil, nil, 0
	}
	out := slices.Clone(got)
	var extra []int
	ok := func(id int) bool {
		if id < 0 || id >= len(b.by) || slices.Contains(out, id) || !b.fits(id, lim) || b.whole[id] {
			return false
		}
		if w.Mem > 0 {
			return b.room[id] >= w.Mem
		}
		return b.free[id] && !b.shared[id]
	}
	if w.Exact {
		for _, id := range w.Cand {
			if slices.Contains(out, id) {
				continue
			}
			if !ok(id) {
				return nil, nil, 0
			}
			extra = append(extra, id)
			out = append(out, id)
		}
	} else {
		for len(out) < w.N {
			best := -1
			for _, id := range w.Cand {
				if !ok(id) {
					continue
				}
				if best < 0 || w.Mem > 0 && b.room[id] < b.room[best] {
					best = id
				}
			}
			if best < 0 {
				return nil, nil, 0
			}
			extra = append(extra, best)
			out = append(out, best)
		}
	}
	if len(extra) == 0 {
		return nil, nil, 0
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
	return out, before, at
}
