package status

import (
	"errors"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/internal/fileid"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
)

// Declared against used, for devices of shares (issue 19). After each
// background scan the ledger asks the vendor's tool what each process
// uses of device memory (npu.ProcessMemory) and joins it to the shares
// by their holders: a process that holds a share's lock file, or whose
// ancestor does. A share's use is the sum of its processes'; its peak is
// kept, shown in status and written at its end; one over its declaration
// is shown, logged the first time, and, with [share] over_declared =
// "term", its holders are sent SIGTERM. A process on a shared device
// that holds no lease counts against the device's room for shares with
// what the tool shows it using now, scan by scan (Table.SetExternal): not
// its peak, which would let a brief use keep shares off the device for as
// long as the process lives. Unleased use as such is the unleased-use
// policy's to report and act on ([status] unleased).

// memUse is what the tool showed of one lease's processes.
type memUse struct {
	used, peak int64 // MiB
	over       bool  // seen over its declaration (said once)
}

// memoryOnce reads the processes' device memory after scan res and acts
// on it. It holds no lock while the tool runs.
func (g *Ledger) memoryOnce(res *procscan.Result) {
	if len(g.policy().Share.Pools) == 0 {
		return
	}
	procs, ok, err := g.inv.ProcessMemory(npu.Tools{NVIDIASmi: g.policy().NVIDIASmi})
	if !ok {
		return
	}
	if err != nil {
		g.repeat("device memory of processes: %v; shares' use unknown", err)
		return
	}
	// Each process's device, where the tool does not say: the node it
	// has open.
	nodeOf := map[int]int{}
	for rdev, pids := range res.Nodes {
		if nd, ok := g.nodes[rdev]; ok && !nd.Control {
			for _, pid := range pids {
				nodeOf[pid] = nd.Device
			}
		}
	}
	ancestors := map[int][]int{}
	for _, p := range procs {
		ancestors[p.PID] = g.scanner.Ancestors(res, p.PID)
	}
	type signal struct {
		pid   int
		start uint64
		uid   uint32
	}
	var term []signal
	external := map[int]int64{}
	g.mu.Lock()
	if g.extSeen == nil {
		g.extSeen = map[int]map[int]bool{}
	}
	seen := map[int]map[int]bool{} // this scan's outside users, by device
	used := map[*entry]int64{}
	for _, p := range procs {
		e, dev := g.shareOfLocked(p, ancestors[p.PID], nodeOf)
		switch {
		case e != nil:
			used[e] += p.MiB
		case (dev >= 0 && len(g.shares[dev]) > 0 || dev >= 0 && g.leases[dev] == nil && g.sharedLocked(dev)) && unix.Kill(p.PID, 0) != unix.ESRCH:
			if !g.extSeen[dev][p.PID] {
				g.log.Printf("npu %d: pid %d uses %s of its memory without a lease; what it uses counts against the room for shares while it uses it", dev, p.PID, quantity.Size(p.MiB))
			}
			if seen[dev] == nil {
				seen[dev] = map[int]bool{}
			}
			seen[dev][p.PID] = true
			external[dev] += p.MiB
		}
	}
	for _, list := range g.shares {
		for _, e := range list {
			u := used[e]
			if e.mem == nil {
				e.mem = &memUse{}
			}
			e.mem.used, e.mem.peak = u, max(e.mem.peak, u)
			if u > e.Mem && !e.mem.over {
				e.mem.over = true
				g.log.Printf("npu %s: the share of %s (lease %d) uses %s, over its declaration of %s", npu.FormatIDs(e.Devices), e.User, e.ID, quantity.Size(u), quantity.Size(e.Mem))
				if g.policy().Share.OverDeclared == policy.OverTerm {
					for _, hs := range e.holders {
						for _, h := range hs {
							term = append(term, signal{h.PID, h.Start, h.UID})
						}
					}
				}
			}
		}
	}
	// Said once a process, until the tool shows it no more.
	g.extSeen = seen
	prev := g.extSet
	g.extSet = external
	g.changedLocked()
	g.unlock()
	for dev, mib := range external {
		if prev[dev] != mib {
			g.table.SetExternal(dev, mib)
		}
	}
	for dev := range prev {
		if _, ok := external[dev]; !ok {
			g.table.SetExternal(dev, 0)
		}
	}
	for _, s := range term {
		if err := g.scanner.SignalAs(s.pid, s.start, s.uid, unix.SIGTERM); err != nil && !errors.Is(err, procscan.ErrNotTheirs) {
			g.log.Printf("over its declaration: pid %d: SIGTERM: %v", s.pid, err)
		}
	}
}

// shareOfLocked is the share whose holders include process p or one of
// its ancestors, and the device p uses (-1: unknown). A process of a
// whole lease, or of none, has no share.
func (g *Ledger) shareOfLocked(p npu.ProcMem, ancestors []int, nodeOf map[int]int) (*entry, int) {
	dev := p.Device
	if dev < 0 {
		if d, ok := nodeOf[p.PID]; ok {
			dev = d
		}
	}
	chain := append([]int{p.PID}, ancestors...)
	for id, list := range g.shares {
		if dev >= 0 && id != dev {
			continue
		}
		for _, e := range list {
			for _, h := range e.holders[id] {
				if slices.Contains(chain, h.PID) {
					return e, id
				}
			}
		}
	}
	// A holder of a whole lease: not outside use.
	for id, e := range g.leases {
		if dev >= 0 && id != dev {
			continue
		}
		for _, h := range e.holders[id] {
			if slices.Contains(chain, h.PID) {
				return nil, -1
			}
		}
	}
	return nil, dev
}

// sharedLocked tells whether device id may hold shares, as the last board
// showed it.
func (g *Ledger) sharedLocked(id int) bool { return g.capacity[id] > 0 }

// Shared notes that device id, whose memory was not known at Open, may
// hold shares of capacity MiB together from now on: what processes
// outside any lease use there counts against them.
func (g *Ledger) Shared(id int, capacity int64) {
	g.mu.Lock()
	g.capacity[id] = capacity
	g.mu.Unlock()
}

// maxTaskPeaks bounds the peaks of ended task shares kept for TaskPeak.
const maxTaskPeaks = 4096

// TaskPeak is the most device memory the share of task id was seen to
// use, in MiB: of its share held now, or of one that ended lately; 0 if
// unknown. The task room asks at the task's end (its supervisor's
// report, made while it still holds the share).
func (g *Ledger) TaskPeak(id uint64) int64 {
	g.mu.Lock()
	defer g.unlock()
	var peak int64
	for _, list := range g.shares {
		for _, e := range list {
			if e.Kind == lease.Task && e.Task == id && e.mem != nil {
				peak = max(peak, e.mem.peak)
			}
		}
	}
	return max(peak, g.taskPeaks[id])
}

// notePeakLocked keeps the peak of ended share e, if a task's.
func (g *Ledger) notePeakLocked(e *entry) {
	if e.Kind != lease.Task || e.mem == nil || e.mem.peak == 0 {
		return
	}
	if g.taskPeaks == nil {
		g.taskPeaks = map[uint64]int64{}
	}
	if len(g.taskPeaks) >= maxTaskPeaks {
		clear(g.taskPeaks) // a report comes at its task's end: old ones are not asked for
	}
	g.taskPeaks[e.Task] = max(g.taskPeaks[e.Task], e.mem.peak)
}

// adoptShares takes up, at start, the shares the lease table found held
// (their lock files, with their declarations): one whose file an open
// lease of the accounting log names goes on as that lease (its holder,
// its record), and that lease is not ended; any other is a share found
// now, of whoever the scans show holding it.
func (g *Ledger) adoptShares(byFile map[fileid.ID]*openLease, a Adopter) {
	for _, d := range g.table.Snapshot().Devices {
		for _, found := range d.Leases {
			if found.Mem == 0 || !found.Adopted || found.Kind != lease.Found || len(found.Files) != 1 {
				continue
			}
			id, fid := found.Devices[0], found.Files[0]
			l := found
			logged := false
			if ol := byFile[fid]; ol != nil && ol.held[id] {
				r := ol.rec
				l = &lease.Lease{ID: r.Lease, Pool: r.Pool, Since: time.UnixMilli(r.T), Adopted: true, Devices: []int{id}, Files: []fileid.ID{fid},
					Mem: found.Mem, Share: r.Share, Holder: r.holder()}
				if err := a.AdoptShare(found, l); err != nil {
					g.log.Print(err) // it ended meanwhile: its end is found's, below
					l = found
				} else {
					delete(ol.held, id)
					logged = true
				}
			}
			e := newEntry(l)
			if !logged {
				rec := e.record("start")
				rec.Found = true
				g.usage.add(rec)
			}
			e.logged = true
			g.mu.Lock()
			ends := g.early[l] // it ended already
			delete(g.early, l)
			g.putLocked(id, e)
			for _, x := range ends {
				g.endLocked(e, x.id, x.at)
			}
			g.unlock()
			g.log.Printf("npu %d: share of %s (%s, %s) from before this start goes on", id, orFound(l.User), kindName(e), quantity.Size(l.Mem))
		}
	}
}

func orFound(user string) string {
	if user == "" {
		return "an unknown holder"
	}
	return user
}
