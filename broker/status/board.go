package status

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/wire"
)

// The board is what npubroker status shows: every device with its state,
// its lease and the holders /proc shows, the lines of waiters, the
// unleased use past its grace window, and the last scan. It is drawn from
// a snapshot of the lease table, the task room's line of CPU waiters and
// the ledger, each copied under its own room's lock, one after the other:
// a lease the ledger records is shown as such until the ledger hears of
// its end, whatever the table's copy says; one the table's copy shows and
// the ledger does not (told of it a moment later) is shown from the
// table's record of its grant.

// Changed tells watchers that the board changed (the line, the devices).
// With nobody watching it costs an increment: it is called on every
// scheduling pass. A nil Ledger (another room's unit test builds a broker
// without one) tells nobody.
func (g *Ledger) Changed() {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.changedLocked()
	g.mu.Unlock()
}

func (g *Ledger) changedLocked() {
	g.gen++
	if g.changed != nil {
		close(g.changed)
		g.changed = nil
	}
}

// Watch tells whether the board changed since the change count sent, and
// returns a channel closed at the next change.
func (g *Ledger) Watch(sent uint64) (changed bool, next <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.changed == nil {
		g.changed = make(chan struct{})
	}
	return g.gen != sent, g.changed
}

// maxWaitersShown is how many waiters of each pool the board lists.
const maxWaitersShown = 20

// maxUnleasedShown bounds the unleased uses the board lists.
const maxUnleasedShown = 100

// Board is the board as asker may see it, after a look at the holders,
// and the change count it reflects. Any user may ask: the board shows
// every device, state and waiter; the command lines of other users'
// processes only where [status] show_commands allows.
func (g *Ledger) Board(asker uint32) (*wire.Board, uint64) {
	g.Refresh()
	snap := g.table.Snapshot()
	cpu, ncpu := g.tasks.CPULine(maxWaitersShown)
	why := make([]string, len(cpu))
	for i, w := range cpu {
		why[i] = g.table.Reason(w)
	}
	g.mu.Lock()
	defer g.unlock()
	return g.boardLocked(asker, snap, cpu, ncpu, why), g.gen
}

func (g *Ledger) boardLocked(asker uint32, snap lease.Snapshot, cpu []*lease.Waiter, ncpu int, cpuWhy []string) *wire.Board {
	now := time.Now()
	show := func(uid uint32) bool {
		return g.policy().Status.ShowsCommand(asker, uid)
	}
	b := &wire.Board{Time: now.UnixMilli(), Vendor: string(g.inv.Vendor), Devices: []wire.DeviceState{}, Waiting: []wire.Line{}, Unleased: []wire.Unleased{}}
	states, reserved := g.statesLocked(snap)
	why := make(map[*lease.Waiter]string, len(reserved))
	for _, p := range snap.Line {
		if p.Why != "" {
			why[p.W] = p.Why
		}
	}
	for _, d := range snap.Devices {
		id := d.ID
		ds := wire.DeviceState{ID: id, Name: g.deviceName(id), Pool: d.Pool, State: states[id]}
		g.deviceUtilLocked(&ds)
		if dr := d.Drain; dr != nil {
			ds.Drain = &wire.DrainInfo{Drained: true, By: dr.By, Reason: dr.Reason, Since: dr.Since.UnixMilli()}
			if d.State == lease.Drained {
				ds.Since = ds.Drain.Since
			}
		}
		if e := g.leases[id]; e != nil {
			ds.Since = e.Since.UnixMilli()
			ds.Lease = leaseInfo(e, id, show)
		} else if d.State == lease.Leased {
			// Granted, and the ledger not told yet (or told of its end
			// since the snapshot): the table's record, holders unknown.
			ds.Since = d.Leases[0].Since.UnixMilli()
			ds.Lease = leaseInfo(newEntry(d.Leases[0]), id, show)
		}
		g.nameContainersLocked(ds.Lease, show)
		if d.Capacity > 0 || d.Unknown != "" || len(g.shares[id]) > 0 { // shares from before a start that shares it no more, too
			ds.Capacity, ds.Declared, ds.External, ds.CapacityUnknown = d.Capacity, d.Declared, d.External, d.Unknown
			for _, e := range g.shares[id] {
				ds.Shares = append(ds.Shares, *leaseInfo(e, id, show))
			}
			if len(ds.Shares) > 0 {
				ds.State = wire.DeviceShared
				ds.Since = ds.Shares[0].Since
			}
		}
		if w := reserved[id]; w != nil {
			wi := waiterInfo(w, 0, why[w])
			ds.ReservedFor = &wi
			ds.Since = w.Queued.UnixMilli()
			if !d.Freed.IsZero() && d.Freed.After(w.Queued) {
				ds.Since = d.Freed.UnixMilli()
			}
		}
		b.Devices = append(b.Devices, ds)
	}
	lines := map[string]*wire.Line{}
	for _, p := range g.policy().Pools {
		b.Waiting = append(b.Waiting, wire.Line{Pool: p.Name, Waiters: []wire.WaiterInfo{}})
	}
	for i := range b.Waiting {
		lines[b.Waiting[i].Pool] = &b.Waiting[i]
	}
	for _, p := range snap.Line {
		ln := lines[p.W.Pool]
		if ln == nil {
			continue
		}
		ln.Count++
		if len(ln.Waiters) < maxWaitersShown {
			wi := waiterInfo(p.W, ln.Count, p.Why)
			if !p.Start.IsZero() {
				wi.Start = p.Start.UnixMilli()
			}
			ln.Waiters = append(ln.Waiters, wi)
		}
	}
	if ncpu > 0 {
		ln := wire.Line{Pool: "cpu", Count: ncpu, Waiters: []wire.WaiterInfo{}}
		for i, w := range cpu {
			ln.Waiters = append(ln.Waiters, waiterInfo(w, i+1, cpuWhy[i]))
		}
		b.Waiting = append(b.Waiting, ln)
	}
	for _, u := range g.reported {
		if len(b.Unleased) == maxUnleasedShown {
			b.Truncated = true
			break
		}
		b.Unleased = append(b.Unleased, g.unleasedInfo(u, show(u.uid)))
	}
	if b.Util = g.utilInfoLocked(); b.Util == nil {
		noUtil(b) // sampling off since: what the leases kept is not shown
	}
	b.Scan = wire.ScanInfo{IntervalMS: g.policy().Status.ScanInterval.Milliseconds(), GraceMS: g.policy().Status.UnleasedGrace.Milliseconds()}
	if ls := g.lastScan; ls != nil {
		b.Scan.Last = ls.at.UnixMilli()
		b.Scan.TookMS = float64(ls.took.Microseconds()) / 1000
		b.Scan.Procs = ls.procs
	}
	return b
}

// States returns each device's state as the board shows it.
func (g *Ledger) States() map[int]string {
	snap := g.table.Snapshot()
	g.mu.Lock()
	defer g.unlock()
	states, _ := g.statesLocked(snap)
	return states
}

// statesLocked returns each device's state in snapshot snap, and the
// waiter each reserved device is kept for (lease.Table.Snapshot says
// which): a lease the ledger still records is shown until the ledger
// hears of its end (the table's watcher reports it just after the lock
// goes).
func (g *Ledger) statesLocked(snap lease.Snapshot) (map[int]string, map[int]*lease.Waiter) {
	states := make(map[int]string, len(snap.Devices))
	reserved := map[int]*lease.Waiter{}
	for _, d := range snap.Devices {
		switch e := g.leases[d.ID]; {
		case e != nil:
			states[d.ID] = kindState(e.kind())
		case d.State == lease.Reserved:
			states[d.ID] = wire.DeviceReserved
			reserved[d.ID] = d.For
		case d.State == lease.Free:
			states[d.ID] = wire.DeviceFree
		case d.State == lease.Drained:
			states[d.ID] = wire.DeviceDrained
		case d.State == lease.Granting:
			states[d.ID] = kindState(string(d.For.Kind))
		case d.State == lease.Leased:
			states[d.ID] = kindState(string(d.Leases[0].Kind))
		default:
			states[d.ID] = wire.DeviceOut
		}
	}
	return states, reserved
}

func kindState(kind string) string {
	switch kind {
	case wire.KindInline:
		return wire.DeviceLeased
	case wire.KindTask:
		return wire.DeviceTask
	case wire.KindLogin:
		return wire.DeviceLogin
	case wire.KindSlurm:
		return wire.DeviceSlurm
	case wire.KindContainer:
		return wire.DeviceContainer
	}
	return wire.DeviceHeld
}

// deviceName is what people call device id: npu3, gpu3.
func (g *Ledger) deviceName(id int) string {
	return g.inv.Vendor.Noun() + strconv.Itoa(id)
}

func leaseInfo(e *entry, id int, show func(uint32) bool) *wire.LeaseInfo {
	li := &wire.LeaseInfo{ID: e.ID, Kind: e.kind(), User: e.User, UID: e.UID, PID: e.pid, Task: e.Task,
		Service: e.Service, TTY: e.TTY, RHost: e.RHost, Claimed: e.Claimed, Devices: e.Devices, Since: e.Since.UnixMilli(), Adopted: e.Adopted,
		SlurmJob: e.SlurmJob, Container: e.container, Mem: e.Mem, Backfill: backfillInfo(e.Lease)}
	if m := e.mem; m != nil {
		li.Used, li.Peak, li.Over = m.used, m.peak, m.over
	}
	leaseUtilInfo(e, li)
	leaseIdleInfo(e, li)
	li.Holders, li.MoreHolders = holdersInfo(e, id, show)
	if !e.checked.IsZero() {
		li.Checked = e.checked.UnixMilli()
	}
	return li
}

// waiterInfo is waiter w, at place pos, waiting for why beyond its turn,
// as the board shows it.
func waiterInfo(w *lease.Waiter, pos int, why string) wire.WaiterInfo {
	wi := wire.WaiterInfo{Position: pos, Kind: string(w.Kind), User: w.User, N: w.N, Mem: w.Mem, Since: w.Queued.UnixMilli(), Why: why, Task: w.Task, SlurmJob: w.SlurmJob}
	if w.Exact {
		wi.Devices = w.Cand
	}
	return wi
}

// EncodeBoard is the status reply carrying b, cut to fit one message if
// it must be: fewer waiters, unleased uses and holders, then no commands,
// then fewer devices; Truncated says so.
func EncodeBoard(b *wire.Board) []byte {
	for cut := 0; ; cut++ {
		data, err := json.Marshal(&wire.Reply{V: wire.Version, Type: wire.TypeStatus, Board: b})
		if err == nil && len(data) <= wire.MaxMessage || cut == 5 {
			return data
		}
		b.Truncated = true
		keep := []int{5, 1, 0, 0, 0}[cut]
		for i := range b.Waiting {
			b.Waiting[i].Waiters = b.Waiting[i].Waiters[:min(keep, len(b.Waiting[i].Waiters))]
		}
		b.Unleased = b.Unleased[:min(keep*4, len(b.Unleased))]
		for i := range b.Devices {
			li := b.Devices[i].Lease
			if li == nil {
				continue
			}
			if n := max(keep, 1); len(li.Holders) > n {
				li.MoreHolders += len(li.Holders) - n
				li.Holders = li.Holders[:n]
			}
			if cut >= 3 {
				for j := range li.Holders {
					li.Holders[j].Command = ""
				}
			}
		}
		if cut == 4 {
			b.Devices = b.Devices[:min(len(b.Devices), 256)]
		}
	}
}
