package status

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/internal/fileid"
	"github.com/npurun/npurun/wire"
)

// Between background scans the broker follows each lease's holders
// cheaply: the process it granted the lease to (a task's supervisor), the
// holders the last look found, and their descendants, read from
// /proc/PID/fd and /proc/PID/task/*/children. A holder that forked and
// exited leaves its child found the next time, through the last scan's
// holders; a process the descriptor was passed to outside the tree is
// found by the next full scan, which status asks for when a lease's known
// holders are all gone.

// refreshFresh is how long a look at the holders serves status requests.
const refreshFresh = 250 * time.Millisecond

// maxTree bounds the processes one lease's look reads.
const maxTree = 256

// Refresh looks at the known holders of every lease and their
// descendants, unless that was done a moment ago. It asks the task room
// for the supervisors of tasks whose lease has no process yet, and reads
// /proc, holding none of the ledger's lock.
func (g *Ledger) Refresh() {
	g.refreshMu.Lock()
	defer g.refreshMu.Unlock()
	type look struct {
		e       *entry
		pid     int    // the process granted the lease: its supervisor, for a task's
		start   uint64 // its start time, where known
		roots   []int
		targets procscan.Targets
		uids    map[uint32]bool // of the last look's holders, which may be kept
	}
	g.mu.Lock()
	if time.Since(g.refreshed) < refreshFresh {
		g.unlock()
		return
	}
	var looks []look
	for _, e := range g.uniqueLocked() {
		lk := look{e: e, pid: e.pid, start: e.pidStart, targets: procscan.Targets{Files: map[fileid.ID]bool{}}, uids: map[uint32]bool{}}
		in := map[int]bool{}
		for _, id := range e.Devices { // in device order: the same roots first each time
			for _, h := range e.holders[id] {
				lk.uids[h.UID] = true
				if !in[h.PID] {
					in[h.PID] = true
					lk.roots = append(lk.roots, h.PID)
				}
			}
		}
		for i, id := range e.Devices {
			if e.held[id] {
				lk.targets.Files[e.files[i]] = true
			}
		}
		if p := e.containerPID; p > 0 && !in[p] && p != e.pid {
			lk.roots = append(lk.roots, p) // containers.go
		}
		looks = append(looks, lk)
	}
	g.unlock()

	results := make([]*procscan.Result, len(looks))
	names := map[uint32]string{}
	for i := range looks {
		lk := &looks[i]
		if lk.e.kind() == wire.KindTask && lk.pid == 0 {
			lk.pid, lk.start = g.tasks.Supervisor(lk.e.Task)
		}
		if lk.pid > 0 { // first: the same roots first each time
			lk.roots = append([]int{lk.pid}, slices.DeleteFunc(lk.roots, func(p int) bool { return p == lk.pid })...)
		}
		results[i] = g.scanner.Tree(lk.roots, lk.targets, maxTree)
		for _, pi := range results[i].Info {
			if pi != nil {
				lk.uids[pi.UID] = true
			}
		}
		for uid := range lk.uids {
			if _, ok := names[uid]; !ok {
				names[uid] = g.names.name(uid)
			}
		}
	}

	g.mu.Lock()
	changed, lost := false, false
	for i, lk := range looks {
		e, res := lk.e, results[i]
		if e.pid == 0 && lk.pid > 0 {
			e.pid, e.pidStart = lk.pid, lk.start
		}
		found := map[int][]*procscan.Proc{}
		for i, id := range e.Devices {
			if !e.held[id] {
				continue
			}
			for _, pid := range res.Files[e.files[i]] {
				if pi := res.Info[pid]; pi != nil {
					found[id] = append(found[id], pi)
				}
			}
			// A look cut at maxTree did not reach every holder the last
			// one found: those stay until a look reaches them or the next
			// full scan, rather than vanish from the board meanwhile.
			for _, h := range e.holders[id] {
				if !res.Looked(h.PID) {
					found[id] = append(found[id], h)
				}
			}
			if len(found[id]) == 0 && g.holdsLocked(id, e) {
				lost = true // held, but not by anyone known: a full scan will tell
			}
		}
		if len(e.held) > 0 && g.setHoldersLocked(e, found, res.At, names) {
			changed = true
		}
	}
	g.refreshed = time.Now()
	if changed {
		g.changedLocked()
	}
	g.unlock()
	if lost {
		g.kickScan()
	}
}

// setHoldersLocked sets what /proc shows holding e's devices, says where
// that disagrees with the broker's record, and tells whether the holders
// changed. names are the user names of the holders' uids, as looked up
// with them.
func (g *Ledger) setHoldersLocked(e *entry, found map[int][]*procscan.Proc, at time.Time, names map[uint32]string) bool {
	changed := len(found) != len(e.holders)
	for id, hs := range found {
		slices.SortFunc(hs, func(a, b *procscan.Proc) int { return a.PID - b.PID })
		if !slices.EqualFunc(hs, e.holders[id], func(a, b *procscan.Proc) bool { return a.PID == b.PID && a.Start == b.Start }) {
			changed = true
		}
	}
	e.holders, e.checked = found, at
	if e.said == nil {
		e.said = map[string]bool{}
	}
	var all []*procscan.Proc
	inAll := map[*procscan.Proc]bool{}
	for _, id := range e.Devices {
		for _, h := range found[id] {
			if !inAll[h] {
				inAll[h] = true
				all = append(all, h)
			}
		}
	}
	// The holders' names: as looked up now, or kept from the look that
	// found a holder this one did not reach.
	who := make(map[uint32]string, len(names))
	for _, h := range all {
		if n, ok := names[h.UID]; ok {
			who[h.UID] = n
		} else if n, ok := e.who[h.UID]; ok {
			who[h.UID] = n
		}
	}
	e.who = who
	if e.pidStart == 0 {
		// The start time of the process granted the lease, read here, off
		// the grant's path: while it holds the lease its pid is its own.
		for _, h := range all {
			if h.PID == e.pid {
				e.pidStart = h.Start
			}
		}
	}
	devs := g.inv.Vendor.Format(heldIDs(e))
	if e.pid > 0 && e.kind() != wire.KindTask && len(all) > 0 && !e.said["pid"] &&
		!slices.ContainsFunc(all, func(h *procscan.Proc) bool { return h.PID == e.pid && (e.pidStart == 0 || h.Start == e.pidStart) }) {
		e.said["pid"] = true
		g.sayLocked("%s: pid %d, granted the lease of %s, holds it no more; /proc shows it held by %s", devs, e.pid, e.User, pidList(all, names))
	}
	for _, h := range all {
		key := "uid " + strconv.Itoa(h.PID)
		if h.UID != e.UID && e.User != "" && !e.said[key] && !(h.UID == 0 && e.kind() == wire.KindSlurm) { // a job's step daemons are root's
			e.said[key] = true
			g.sayLocked("%s: the lease of %s is held by pid %d of %s: its descriptor was passed on", devs, e.User, h.PID, names[h.UID])
		}
	}
	return changed
}

func heldIDs(e *entry) []int {
	var ids []int
	for _, id := range e.Devices {
		if e.held[id] {
			ids = append(ids, id)
		}
	}
	return ids
}

func pidList(ps []*procscan.Proc, names map[uint32]string) string {
	parts := make([]string, 0, len(ps))
	for i, p := range ps {
		if i == 4 {
			parts = append(parts, fmt.Sprintf("and %d more", len(ps)-i))
			break
		}
		parts = append(parts, fmt.Sprintf("pid %d (%s)", p.PID, names[p.UID]))
	}
	return strings.Join(parts, ", ")
}

// maxHolders bounds the holders one lease shows on the board.
const maxHolders = 16

// holdersInfo is what the board shows of device id's holders in e: the
// root holders (whose parent holds nothing) first, then the others, in
// pid order; commands left out where show says so. Their users' names are
// those looked up with them (a holder whose name is not known, which no
// look leaves, is shown by its uid).
func holdersInfo(e *entry, id int, show func(uid uint32) bool) ([]wire.Holder, int) {
	hs := e.holders[id]
	isHolder := make(map[int]bool, len(hs))
	for _, h := range hs {
		isHolder[h.PID] = true
	}
	var roots, rest []*procscan.Proc
	for _, h := range hs {
		if isHolder[h.PPID] {
			rest = append(rest, h)
		} else {
			roots = append(roots, h)
		}
	}
	all := append(roots, rest...)
	more := 0
	if len(all) > maxHolders {
		more = len(all) - maxHolders
		all = all[:maxHolders]
	}
	out := make([]wire.Holder, 0, len(all))
	for _, h := range all {
		name, ok := e.who[h.UID]
		if !ok {
			name = "uid " + strconv.FormatUint(uint64(h.UID), 10)
		}
		ch := wire.Holder{PID: h.PID, PPID: h.PPID, UID: h.UID, User: name, Started: h.Started.UnixMilli()}
		if show(h.UID) {
			ch.Command = CommandLine(h)
		}
		ch.Container = h.Container // named by the board (nameContainersLocked)
		out = append(out, ch)
	}
	return out, more
}
