package lease

import (
	"fmt"
	"slices"
	"strings"

	"github.com/npurun/npurun/broker/refusal"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
)

// poolSet is the table's pools: made by Open and by Reconfigure, never
// changed once stored (Table.pc), so Admit reads it without the lock.
type poolSet struct {
	pools       []Pool // in the configuration's order, IDs filled in
	poolIDs     map[string][]int
	poolOf      map[int]string
	external    map[string]string // pool -> Pool.External, for the external pools
	defaultPool string
}

// newPoolSet checks pools against the devices ids and indexes them.
func newPoolSet(ids []int, pools []Pool, defaultPool string) (*poolSet, error) {
	pc := &poolSet{pools: slices.Clone(pools), poolIDs: map[string][]int{}, poolOf: map[int]string{},
		external: map[string]string{}, defaultPool: defaultPool}
	for i, p := range pools {
		pids := p.IDs
		if pids == nil {
			pids = ids
		}
		for _, id := range pids {
			if !slices.Contains(ids, id) {
				return nil, fmt.Errorf("pool %q names npu %d, which is not among the devices managed (%s)", p.Name, id, npu.FormatIDs(ids))
			}
		}
		pc.pools[i].IDs = pids
		pc.poolIDs[p.Name] = pids
		if p.External != "" {
			pc.external[p.Name] = p.External
		}
		for _, id := range pids {
			pc.poolOf[id] = p.Name
		}
	}
	if _, ok := pc.poolIDs[defaultPool]; !ok && defaultPool != "" {
		return nil, fmt.Errorf("default pool %q is not among the pools", defaultPool)
	}
	return pc, nil
}

// name resolves the pool a request names: "" is the default pool.
func (pc *poolSet) name(name string) string {
	if name == "" {
		return pc.defaultPool
	}
	return name
}

// list names the pools, in the configuration's order.
func (pc *poolSet) list() string {
	names := make([]string, len(pc.pools))
	for i, p := range pc.pools {
		names[i] = p.Name
	}
	return strings.Join(names, ", ")
}

// CheckPools tells whether Reconfigure would take pools and
// defaultPool: an error names a pool with a device the table does not
// manage.
func (t *Table) CheckPools(pools []Pool, defaultPool string) error {
	return CheckPools(t.ids, pools, defaultPool)
}

// CheckPools tells whether a table of devices ids would take pools and
// defaultPool (Open, Reconfigure): an error names a pool with a device
// not among ids, or a default pool not among the pools.
func CheckPools(ids []int, pools []Pool, defaultPool string) error {
	_, err := newPoolSet(ids, pools, defaultPool)
	return err
}

// Refused is a waiter that a Reconfigure took out of the line, with why:
// the new policy would refuse its request (Admit's refusal.Refusal).
type Refused struct {
	W   *Waiter
	Why *refusal.Refusal
}

// Reconfigure takes up a new policy: pools (and the default pool) in
// place of the table's, and limitOf for the limit of each user waiting
// (false: the user is not known to limitOf, and their waiters keep the
// limit they came with). Each waiter in line is checked again as Admit
// checks a request: one the new policy refuses leaves the line and is
// returned, for its owner to tell; the others wait on in their places,
// with their pool's devices as the new pools have them (a request for
// exact devices keeps the pool it joined as its line's label) and their
// user's new limit counted. Leases are not looked at: one the new policy
// would not grant runs on. A pool that names a device the table does not
// manage is an error, and nothing changes. limitOf is called holding the
// table's lock: it must not wait (a look-up in a cache, not NSS).
// Reconfigure does not serve the line: the owner does, after.
func (t *Table) Reconfigure(pools []Pool, defaultPool string, limitOf func(uid uint32, user string) (policy.Limit, bool)) ([]Refused, error) {
	pc, err := newPoolSet(t.ids, pools, defaultPool)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	limits := map[uint32]policy.Limit{}
	var refused []Refused
	for _, w := range slices.Clone(t.q.Waiters()) {
		lim, ok := limits[w.UID]
		if !ok {
			if lim, ok = limitOf(w.UID, w.User); !ok {
				lim = t.limitLocked(w)
			}
			limits[w.UID] = lim
		}
		// A share is checked with its memory: its candidates are the
		// devices that can hold it, not the whole pool.
		r := Request{Holder: w.Holder, N: w.N, Pool: w.Pool, Limit: lim, Mem: w.Mem}
		if w.Exact {
			r.Devices = w.Cand
		}
		nw, err := t.admit(pc, r, true)
		if err != nil {
			rf, ok := err.(*refusal.Refusal)
			if !ok {
				rf = &refusal.Refusal{Err: ErrDenied, Msg: err.Error()}
			}
			t.removeLocked(w, false)
			refused = append(refused, Refused{W: w, Why: rf})
			continue
		}
		w.Cand = nw.Cand
	}
	for uid, lim := range limits {
		t.q.SetLimit(uid, lim)
	}
	t.pc.Store(pc)
	return refused, nil
}

// limitLocked is the limit w's user waits under: the one the line counts
// (Queue.lim: their latest request's, or a Reconfigure's), else w's own.
func (t *Table) limitLocked(w *Waiter) policy.Limit {
	if lim, ok := t.q.lim[w.UID]; ok {
		return lim
	}
	return w.Limit
}
