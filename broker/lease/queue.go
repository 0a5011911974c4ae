package lease

import (
	"slices"
	"sort"
	"time"

	"github.com/npurun/npurun/policy"
)

// Waiter is one request waiting for devices: an npurun, a login session or
// a queued task alike, in one line. What the owner does with its grant is
// the owner's: Ref is the owner's handle on it, never looked at here.
type Waiter struct {
	Holder        // who asks: the grant's holder
	N      int    // devices wanted
	Mem    int64  // a share of each (share.go): the device memory it declares, in MiB; 0: whole devices
	Cand   []int  // devices it may take, ascending: its pool's, or the explicit ones
	Exact  bool   // it wants exactly Cand (npurun --device)
	Held   bool   // keeps its place but is skipped, reserving nothing (a task whose start must wait); in a Table, set by Hold
	Pool   string // the pool it waits in
	Limit  policy.Limit
	Queued time.Time
	Ref    any // the owner's: what the grant goes to (a connection, a task)

	// External: its pool's devices are picked outside the line
	// (Pool.External): Plan skips it, reserving nothing, and Table.Claim
	// serves it with the devices picked.
	External bool

	seq   uint64 // arrival order
	round uint64 // fairness round, see Queue
	place int    // its place in its pool's line, while its queue's placed holds

	// passed counts the requests behind it in line served while it, a
	// share, waited (Table.Schedule): at SharePatience it closes a
	// device for itself (Plan).
	passed int
}

// isTask tells whether w counts against its user's running tasks.
func (w *Waiter) isTask() bool { return w.Kind == Task }

// Queue holds the waiters in service order. Service is first come first
// served, interleaved across users: each waiter gets a round, one more than
// the previous waiter of the same user, and never below the round of the
// last waiter served. Waiters are ordered by (round, arrival). So a user
// with 100 waiting requests gets one turn per round, and a newcomer's first
// request waits behind at most one request of each user already waiting.
type Queue struct {
	order []*Waiter
	next  map[uint32]uint64       // a user's next round
	count map[uint32]int          // a user's waiters
	lim   map[uint32]policy.Limit // a waiting user's limit, as their last request found it
	tasks map[string]int          // waiting tasks (Kind Task) per pool
	round uint64                  // round of the last waiter served
	seq   uint64

	placed bool // each waiter's place is counted (Positions), and nothing moved since
}

// NewQueue returns an empty queue.
func NewQueue() *Queue {
	return &Queue{next: map[uint32]uint64{}, count: map[uint32]int{}, lim: map[uint32]policy.Limit{}, tasks: map[string]int{}}
}

// Limits calls f with each waiting user's limit: the broker works out what
// room each user has from these, at a cost in users waiting, not waiters.
func (q *Queue) Limits(f func(uid uint32, lim policy.Limit)) {
	for uid, lim := range q.lim {
		f(uid, lim)
	}
}

// SetLimit sets the limit waiting user uid is counted under (a reload's
// new policy), if they wait.
func (q *Queue) SetLimit(uid uint32, lim policy.Limit) {
	if _, ok := q.lim[uid]; ok {
		q.lim[uid] = lim
	}
}

// Len is the number of waiters.
func (q *Queue) Len() int { return len(q.order) }

// Waiters returns the waiters in service order; callers must not modify it.
func (q *Queue) Waiters() []*Waiter { return q.order }

// Positions sets, for each waiter of want, its place in its pool's line
// (left as it is where it is not in the queue). A listing asks this for
// each of its pages: the places of all the waiters are counted in one
// walk, kept in the waiters, and used until the queue changes, so the
// pages of a listing cost one walk of the line, not one each.
func (q *Queue) Positions(want map[*Waiter]int) {
	if !q.placed {
		n := map[string]int{}
		for _, w := range q.order {
			n[w.Pool]++
			w.place = n[w.Pool]
		}
		q.placed = true
	}
	for w := range want {
		if q.index(w) >= 0 {
			want[w] = w.place
		}
	}
}

// index is w's index in the service order; -1 if it is not in the queue.
func (q *Queue) index(w *Waiter) int {
	i := sort.Search(len(q.order), func(i int) bool { return !less(q.order[i], w) })
	if i >= len(q.order) || q.order[i] != w {
		return -1
	}
	return i
}

// UserCount is how many waiters user uid has.
func (q *Queue) UserCount(uid uint32) int { return q.count[uid] }

// TaskPools is how many pools have a task waiting.
func (q *Queue) TaskPools() int { return len(q.tasks) }

// Tasks is how many tasks wait in pool.
func (q *Queue) Tasks(pool string) int { return q.tasks[pool] }

// FirstTasks appends to out the first task waiting unheld in each pool,
// in line order. It stops once every pool with a task waiting has given
// one, so the waiters after those are never looked at.
func (q *Queue) FirstTasks(out []*Waiter) []*Waiter {
	want := len(q.tasks)
	if want == 0 {
		return out
	}
	var few [8]string
	seen := few[:0] // one a pool
	for _, w := range q.order {
		if !w.isTask() || w.Held || slices.Contains(seen, w.Pool) {
			continue
		}
		seen = append(seen, w.Pool)
		out = append(out, w)
		if len(seen) == want {
			break
		}
	}
	return out
}

// countTask notes that a waiter joined (d = 1) or left (-1) the queue.
func (q *Queue) countTask(w *Waiter, d int) {
	if !w.isTask() {
		return
	}
	if q.tasks[w.Pool] += d; q.tasks[w.Pool] <= 0 {
		delete(q.tasks, w.Pool)
	}
}

func less(a, b *Waiter) bool {
	if a.round != b.round {
		return a.round < b.round
	}
	return a.seq < b.seq
}

// Add enqueues w.
func (q *Queue) Add(w *Waiter) {
	q.placed = false
	q.seq++
	w.seq = q.seq
	w.round = max(q.next[w.UID], q.round)
	q.next[w.UID] = w.round + 1
	q.count[w.UID]++
	q.lim[w.UID] = w.Limit
	q.countTask(w, 1)
	i := sort.Search(len(q.order), func(i int) bool { return less(w, q.order[i]) })
	q.order = append(q.order, nil)
	copy(q.order[i+1:], q.order[i:])
	q.order[i] = w
}

// Remove takes w out of the queue (cancelled, or granted when served is
// true, which advances the current round). It reports whether w was there.
func (q *Queue) Remove(w *Waiter, served bool) bool {
	i := q.index(w)
	if i < 0 {
		return false
	}
	q.order = append(q.order[:i], q.order[i+1:]...)
	q.placed = false
	q.countTask(w, -1)
	if served {
		q.round = max(q.round, w.round)
	}
	if q.count[w.UID]--; q.count[w.UID] == 0 {
		delete(q.count, w.UID)
		delete(q.next, w.UID)
		delete(q.lim, w.UID)
	}
	return true
}

// Readd puts back a waiter that Remove took out, in the place it had: a
// task granted whose start could not be made. Its user is counted and
// limited again as Add does (Remove forgot the limit if this was the
// user's last waiter); a limit from a later request of theirs stays.
func (q *Queue) Readd(w *Waiter) {
	q.placed = false
	q.count[w.UID]++
	q.next[w.UID] = max(q.next[w.UID], w.round+1)
	q.countTask(w, 1)
	if _, ok := q.lim[w.UID]; !ok {
		q.lim[w.UID] = w.Limit
	}
	i := sort.Search(len(q.order), func(i int) bool { return less(w, q.order[i]) })
	q.order = slices.Insert(q.order, i, w)
}

// Grant is one waiter served with the devices it gets.
type Grant struct {
	W       *Waiter
	Devices []int

	// Before is, for a grant backfilled (Room.Backfill), the request
	// whose reserved devices it took that starts first, and BeforeAt its
	// estimated start (Unix ns), which the grant ends before; nil
	// otherwise.
	Before   *Waiter
	BeforeAt int64
	// Beside: it took devices Before will not need by its start (it has
	// others coming free by then), so it may end after that start.
	Beside bool
}

// Room is how much more each user may take, by uid; a user absent from a
// map has no limit there.
type Room struct {
	Devices map[uint32]int // devices they may still hold
	Tasks   map[uint32]int // tasks they may still run (counts only the waiters of tasks)

	// Drained[id] tells that device id is drained (Table.Drain): a
	// waiter whose devices not drained are fewer than it wants waits for
	// an undrain, and reserves nothing meanwhile. nil: none is.
	Drained []bool

	// Share[id] is the memory, in MiB, device id has left for a new
	// share; below 0 where it can take none now (not shared, leased
	// whole, drained, out of service). nil: no device is shared.
	Share []int64

	// Backfill lets a request with a time limit start on devices a
	// request ahead of it reserved, where it ends before that one's
	// estimated start (backfill.go). FreeAt is when each device comes
	// free (Estimate's free: Unix ns, never where unknown), Now the time
	// of the plan (Unix ns); without FreeAt nothing is backfilled.
	Backfill bool
	Now      int64
	FreeAt   []int64
}

// drainBlocked tells whether w waits for a drained device: fewer of its
// candidates than it wants are not drained.
func (w *Waiter) drainBlocked(drained []bool) bool {
	if drained == nil {
		return false
	}
	left := 0
	for _, id := range w.Cand {
		if id >= len(drained) || !drained[id] {
			left++
		}
	}
	return left < w.N
}

// Plan decides which waiters to serve now. order is the service order,
// free[id] tells whether device id is free, room what the limits leave each
// user. It modifies none of its inputs.
//
// Walking the order, a waiter that can be served is; one that cannot
// reserves the free devices it could use (up to what it wants), so a later,
// smaller request only backfills onto devices the earlier one cannot use
// yet. A waiter whose user has no room reserves nothing, nor does a held
// one, nor an external one (Table.Claim serves it), nor one that waits
// for a drained device (Room.Drained): it would keep the others' devices
// for as long as the drain lasts.
//
// A share (Waiter.Mem) goes where it fits best: on each of its devices,
// the candidate with the least room left that holds it, so that large
// free spaces stay whole; a free device is a candidate for shares too. A
// waiter that cannot be served closes devices to new shares as it
// reserves free ones: a whole-device waiter, beyond the free devices it
// reserves, as many of its devices with shares as it still lacks (those
// with the least declared: the first to empty); the first share in line
// that waits (the head: EASY backfilling; the shares behind it fill the
// rest), the device with most room of those it could use, once
// SharePatience requests behind it have started while it waited. So a
// stream of shares serves a whole-device waiter ahead of it within one
// round, and a share after at most SharePatience of them.
//
// With Room.Backfill, a waiter with a time limit that cannot be served
// from the devices left may take devices its pool's head reserved (or
// closed to shares), where it ends before the head's estimated start, or
// where the head will not need them by then (backfill.go); its Grant
// names the head (Before).
func Plan(order []*Waiter, free []bool, room Room) []Grant {
	avail := make([]bool, len(free))
	n := 0
	for id, f := range free {
		if f {
			avail[id] = true
			n++
		}
	}
	shareRoom := slices.Clone(room.Share)
	shares := 0 // devices that may take a share now
	for _, r := range shareRoom {
		if r >= 0 {
			shares++
		}
	}
	var used, started map[uint32]int
	var grants []Grant
	shareHeld := false // a share waiting keeps a device already
	var bf *backfill
	if room.Backfill && room.FreeAt != nil {
		bf = newBackfill(room, len(free))
	}
	for _, w := range order {
		if bf != nil {
			bf.cur = bf.est.next(w, planBlocked(w, room))
		}
		if n == 0 && shares == 0 {
			if bf == nil || bf.open == 0 || bf.tests >= MaxBackfillTests {
				break
			}
			bf.tests++
		}
		if w.Held || w.External || w.drainBlocked(room.Drained) {
			continue
		}
		if r, ok := room.Devices[w.UID]; ok && r-used[w.UID] < w.N {
			continue
		}
		if r, ok := room.Tasks[w.UID]; ok && w.isTask() && r-started[w.UID] < 1 {
			continue
		}
		var got []int
		if w.Mem > 0 {
			got = placeShares(w, shareRoom)
		} else {
			for _, id := range w.Cand {
				if id < len(avail) && avail[id] {
					got = append(got, id)
					if len(got) == w.N && !w.Exact {
						break
					}
				}
			}
		}
		ok := len(got) == w.N && (!w.Exact || len(got) == len(w.Cand))
		var before *Waiter
		var beforeAt int64
		beside := false
		if !ok && bf != nil {
			if all, b, at, bs := bf.fill(w, got); all != nil {
				got, ok, before, beforeAt, beside = all, true, b, at, bs
			}
		}
		head := false
		if bf != nil && !ok {
			head = bf.head(w, room, len(got), avail)
		}
		for _, id := range got {
			wasFree := avail[id]
			if avail[id] {
				avail[id] = false // taken, or reserved by a waiter ahead
				n--
			}
			if bf != nil && !ok {
				r := int64(-1)
				if shareRoom != nil {
					r = shareRoom[id]
				}
				bf.reserve(w, id, head, wasFree, r)
			}
			switch {
			case shareRoom == nil || shareRoom[id] < 0:
			case ok && w.Mem > 0:
				shareRoom[id] -= w.Mem
			default: // leased whole, or reserved: closed to shares
				shareRoom[id] = -1
				shares--
			}
		}
		if !ok && shareRoom != nil && (w.Mem == 0 || !shareHeld && w.passed >= SharePatience) {
			// A whole-device waiter keeps what it waits for, as any; of
			// the shares, the first that waits only (the head: EASY
			// backfilling), so that the shares behind it fill the rest,
			// and only once it has let SharePatience of them pass: a
			// device closed empties of all its shares, room that the
			// ones behind would have used meanwhile.
			var mark func(id int, wasFree bool, room int64)
			if bf != nil {
				mark = func(id int, wasFree bool, room int64) { bf.reserve(w, id, head, wasFree, room) }
			}
			shares -= closeToShares(w, len(got), shareRoom, avail, &n, mark)
			shareHeld = shareHeld || w.Mem > 0
		}
		if ok {
			grants = append(grants, Grant{W: w, Devices: got, Before: before, BeforeAt: beforeAt, Beside: beside})
			if _, limited := room.Devices[w.UID]; limited {
				if used == nil {
					used = map[uint32]int{}
				}
				used[w.UID] += w.N
			}
			if _, limited := room.Tasks[w.UID]; limited && w.isTask() {
				if started == nil {
					started = map[uint32]int{}
				}
				started[w.UID]++
			}
		}
	}
	return grants
}

// SharePatience is how many requests behind a waiting share may start
// before it closes a device to new shares for itself (Plan). Closing one
// at once keeps the line strictly in order but leaves that device to
// empty while smaller shares behind could fill it: on a mixed load of 40
// shares of 2 to 60 GiB on 4 devices, the makespan with patience 4 is 8%
// shorter with log-uniform sizes and 3% with uniform ones in simulation
// over Plan (BenchmarkPlanMakespan), 7% and 1% in BenchmarkShares. It
// bounds how
// long a share can be passed over: by SharePatience starts, then the
// shares on the device it closes.
const SharePatience = 4

// placeShares picks, for share waiter w, a device for each share it
// wants by best fit: of its candidates that can take a share of w.Mem,
// the one with the least room; of the same room, the lowest id. An exact
// request takes all its candidates or none.
func placeShares(w *Waiter, shareRoom []int64) []int {
	if w.Exact {
		for _, id := range w.Cand {
			if id >= len(shareRoom) || shareRoom[id] < w.Mem {
				return nil
			}
		}
		return slices.Clone(w.Cand)
	}
	var got []int
	for len(got) < w.N {
		best := -1
		for _, id := range w.Cand {
			if id >= len(shareRoom) || shareRoom[id] < w.Mem || slices.Contains(got, id) {
				continue
			}
			if best < 0 || shareRoom[id] < shareRoom[best] {
				best = id
			}
		}
		if best < 0 {
			break
		}
		got = append(got, best)
	}
	return got
}

// closeToShares closes to new shares the devices waiter w, not served,
// would take first beyond the have it took or reserved: for a share,
// those with most room; for a whole-device waiter, those with shares
// whose declarations leave most room (they empty first). Free ones among
// them are reserved (avail, n). It returns how many it closed.
func closeToShares(w *Waiter, have int, shareRoom []int64, avail []bool, n *int, mark func(id int, wasFree bool, room int64)) int {
	closed := 0
	for ; have < w.N; have++ {
		best := -1
		for _, id := range w.Cand {
			if id >= len(shareRoom) || shareRoom[id] < 0 {
				continue
			}
			if best < 0 || shareRoom[id] > shareRoom[best] {
				best = id
			}
		}
		if best < 0 {
			break
		}
		if mark != nil {
			mark(best, avail[best], shareRoom[best])
		}
		shareRoom[best] = -1
		closed++
		if avail[best] {
			avail[best] = false
			*n--
		}
	}
	return closed
}
