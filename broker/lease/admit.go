package lease

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/npurun/npurun/broker/refusal"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/policy"
)

// MaxDevices bounds the devices one request may name.
const MaxDevices = 64

// What a request may be refused for: a refusal.Refusal wraps one, and the
// owner maps it to its own answer (errors.Is).
var (
	ErrBadRequest = errors.New("bad request")    // malformed: a device named twice, a count below 0
	ErrNoDevice   = errors.New("no such device") // a device this table does not manage
	ErrNoPool     = errors.New("no such pool")
	ErrDenied     = errors.New("denied") // the policy refuses it: a pool not open to its user, more than the pool has or the user may hold
	// ErrGone is Claim's refusal of a request of an external pool that
	// left the line (cancelled, its client gone) before its allocator's
	// answer.
	ErrGone = errors.New("the request left the line")
)

// Request is what a holder asks for: n devices of a pool, or exactly
// Devices.
type Request struct {
	Holder  Holder
	N       int    // devices wanted; 0: one
	Devices []int  // exactly these (npurun --device)
	Pool    string // "": the default pool
	Limit   policy.Limit
	Mem     int64 // a share of each device, of this much memory in MiB (share.go); 0: whole devices
}

// Admit checks a request against the devices, the pools and its holder's
// limit, and returns the waiter that queues it (not yet in line), or a
// refusal.Refusal.
func (t *Table) Admit(r Request) (*Waiter, error) {
	return t.admit(t.pc.Load(), r, false)
}

// admit is Admit against the pools pc: the one check of a request, on its
// arrival and again at each Reconfigure (locked: holding the table's
// lock, as Reconfigure does).
func (t *Table) admit(pc *poolSet, r Request, locked bool) (*Waiter, error) {
	lim := r.Limit
	w := &Waiter{Holder: r.Holder, Limit: lim, Queued: time.Now()}
	if len(r.Devices) > 0 {
		if len(r.Devices) > MaxDevices {
			return nil, refusal.New(ErrBadRequest, "", "at most %d devices in one request", MaxDevices)
		}
		ids := slices.Clone(r.Devices)
		slices.Sort(ids)
		if len(slices.Compact(slices.Clone(ids))) != len(ids) {
			return nil, refusal.New(ErrBadRequest, "", "device named twice in %v", r.Devices)
		}
		for _, id := range ids {
			if id < 0 || id >= len(t.devs) || t.devs[id] == nil {
				return nil, refusal.New(ErrNoDevice, "this broker manages "+t.vendor.Format(t.ids), "no %s here", t.vendor.Format([]int{id}))
			}
			p, inPool := pc.poolOf[id]
			switch {
			case !inPool:
				return nil, refusal.New(ErrDenied, "", "%s is in no pool, so nobody may lease it", t.vendor.Format([]int{id}))
			case !lim.AllowsPool(p):
				return nil, refusal.New(ErrDenied, "", "%s is in pool %q, which %s does not open to %s", t.vendor.Format([]int{id}), p, lim.Source, r.Holder.User)
			case pc.external[p] != "":
				return nil, refusal.New(ErrBadRequest, fmt.Sprintf("npurun -n %d --pool %s", len(ids), p), "%s picks the devices of pool %q: ask for a count (-n), not for %s", pc.external[p], p, t.vendor.Format([]int{id}))
			}
			w.Pool = p
		}
		w.Cand, w.N, w.Exact = ids, len(ids), true
	} else {
		w.N = r.N
		if w.N == 0 {
			w.N = 1
		}
		if w.N < 0 {
			return nil, refusal.New(ErrBadRequest, "", "bad device count %d", r.N)
		}
		w.Pool = pc.name(r.Pool)
		ids, ok := pc.poolIDs[w.Pool]
		if !ok {
			return nil, refusal.New(ErrNoPool, "pools: "+pc.list(), "no pool %q here", r.Pool)
		}
		if !lim.AllowsPool(w.Pool) {
			return nil, refusal.New(ErrDenied, "", "pool %q is not open to %s (%s)", w.Pool, r.Holder.User, lim.Source)
		}
		if w.N > len(ids) {
			return nil, refusal.New(ErrDenied, "", "%s asked, pool %q has only %d", quantity.Count(w.N, "device", "devices"), w.Pool, len(ids))
		}
		w.Cand = ids
		w.External = pc.external[w.Pool] != ""
	}
	if r.Mem < 0 {
		return nil, refusal.New(ErrBadRequest, "", "bad memory size %d", r.Mem)
	}
	if r.Mem > 0 {
		if err := t.admitShare(pc, w, r.Mem, locked); err != nil {
			return nil, err
		}
	}
	if lim.MaxDevices > 0 && w.N > lim.MaxDevices {
		return nil, refusal.New(ErrDenied, "", "%s asked, the limit for %s is %d held at once (%s)", quantity.Count(w.N, "device", "devices"), r.Holder.User, lim.MaxDevices, lim.Source)
	}
	return w, nil
}

// PoolName resolves the pool a request names: "" is the default pool.
func (t *Table) PoolName(name string) string { return t.pc.Load().name(name) }

// PoolOf is the pool of device id, "" if it is in none.
func (t *Table) PoolOf(id int) string { return t.pc.Load().poolOf[id] }
