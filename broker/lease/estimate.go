package lease

import (
	"math"
	"time"
)

// never is the time a device comes free when no known time frees it: a
// lease whose holder has no limit (Holder.Limit) holds it, or it is
// drained.
const never = math.MaxInt64

// until is d after at (Unix nanoseconds), never where that passes an
// int64's range: ends chained on one device (a waiter of a century's
// limit after another's) add up.
func until(at int64, d time.Duration) int64 {
	if at == never || d > 0 && at > never-int64(d) {
		return never
	}
	return at + int64(d)
}

// Estimate reckons when each waiter of line, in service order, starts at
// the latest, as Slurm's backfill reckons a pending job's start from the
// time limits of the jobs that run and of those ahead of it: free[id] is
// when device id comes free (Unix ns: now for a free device, the end of
// its lease's limit for a leased one, never where no limit is known;
// it is used up), and each waiter takes, at the earliest time that many
// of its candidates are free, the ones that come free first, which then
// come free again its own limit later (never, without one). A waiter
// that blocked says does not start by the line's turn (held, its user
// at their cap, waiting for another allocator): its start is unknown and
// it takes nothing. It returns each waiter's start (Unix ns, never
// where unknown: something it waits for has no limit); a start in the
// past is now. The line's Plan keeps, for a request ahead, the devices
// it will take as they free up and backfills smaller requests only
// onto others, so no later waiter delays an earlier one: with every limit
// known, a waiter starts by its estimate, sooner where a holder ends
// before its limit.
func Estimate(now int64, free []int64, line []*Waiter, blocked func(*Waiter) bool) []int64 {
	starts := make([]int64, len(line))
	e := newEstimator(now, free)
	for i, w := range line {
		starts[i] = e.next(w, blocked != nil && blocked(w))
	}
	return starts
}

// freeTimesLocked is when each device comes free, for Estimate (by
// physical id; never where unknown or not managed).
func (t *Table) freeTimesLocked(now time.Time) []int64 {
	free := make([]int64, len(t.devs))
	n := now.UnixNano()
	for id, d := range t.devs {
		switch {
		case d == nil || d.drain != nil:
			free[id] = never
		case len(d.shares) > 0:
			// New shares may land on it until a whole request closes
			// it (Plan), and which one Plan closes is not the one
			// that comes free first: no known time frees it.
			free[id] = never
		case len(d.leases) > 0:
			end := n
			for _, l := range d.leases {
				if l.Limit <= 0 {
					end = never
					break
				}
				end = max(end, l.Since.Add(l.Limit).UnixNano())
			}
			free[id] = end
		case d.granting != nil:
			if lim := d.granting.W.Holder.Limit; lim > 0 {
				free[id] = n + int64(lim)
			} else {
				free[id] = never
			}
		default: // free, or out of service for a moment (a fresh lock file on its way)
			free[id] = n
		}
	}
	return free
}

// estimatesLocked is Estimate of the first n waiters of the line now
// (all of them where n is below 0 or beyond it): each one's start, in
// service order.
func (t *Table) estimatesLocked(now time.Time, n int) []int64 {
	drained := t.drainedLocked()
	line := t.q.Waiters()
	if n >= 0 && n < len(line) {
		line = line[:n]
	}
	return Estimate(now.UnixNano(), t.freeTimesLocked(now), line, func(w *Waiter) bool {
		// A share waits on packing, not on devices coming free.
		return w.Held || w.External || w.Mem > 0 || t.capped(w) || w.drainBlocked(drained)
	})
}

// Starts sets, for each waiter of want, when it starts at the latest
// (Place.Start; zero where unknown or not in line).
func (t *Table) Starts(want map[*Waiter]time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	// A waiter's start depends on those ahead of it alone: the line is
	// reckoned only as far as the last of want's, and each is found in it
	// by its place in service order (a listing asks this for each page).
	at := make(map[*Waiter]int, len(want))
	last := -1
	for w := range want {
		if i := t.q.index(w); i >= 0 {
			at[w] = i
			last = max(last, i)
		}
	}
	if last < 0 {
		return
	}
	starts := t.estimatesLocked(time.Now(), last+1)
	for w, i := range at {
		if starts[i] != never {
			want[w] = time.Unix(0, starts[i])
		}
	}
}
