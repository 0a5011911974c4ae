package broker

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/broker/procscan"
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

// refreshHolders looks at the known holders of every lease and their
// descendants, unless that was done a moment ago.
func (s *Server) refreshHolders() {
	s.led.refreshMu.Lock()
	defer s.led.refreshMu.Unlock()
	type look struct {
		l       *ledgerEntry
		roots   []int
		targets procscan.Targets
		uids    map[uint32]bool // of the last look's holders, which may be kept
	}
	s.mu.Lock()
	if time.Since(s.led.refreshed) < refreshFresh {
		s.mu.Unlock()
		return
	}
	var looks []look
	for _, l := range s.uniqueLeasesLocked() {
		if l.kind() == client.KindTask && l.pid == 0 {
			l.pid, l.pidStart = s.taskSupervisorLocked(l.Task)
		}
		lk := look{l: l, targets: procscan.Targets{Files: map[procscan.FileID]bool{}}, uids: map[uint32]bool{}}
		in := map[int]bool{}
		if l.pid > 0 {
			lk.roots = append(lk.roots, l.pid)
			in[l.pid] = true
		}
		for _, id := range l.Devices { // in device order: the same roots first each time
			for _, h := range l.holders[id] {
				lk.uids[h.UID] = true
				if !in[h.PID] {
					in[h.PID] = true
					lk.roots = append(lk.roots, h.PID)
				}
			}
		}
		for i, id := range l.Devices {
			if l.held[id] {
				lk.targets.Files[l.files[i]] = true
			}
		}
		looks = append(looks, lk)
	}
	s.mu.Unlock()

	results := make([]*procscan.Result, len(looks))
	names := map[uint32]string{}
	for i, lk := range looks {
		results[i] = s.led.scanner.Tree(lk.roots, lk.targets, maxTree)
		for _, pi := range results[i].Info {
			if pi != nil {
				lk.uids[pi.UID] = true
			}
		}
		for uid := range lk.uids {
			if _, ok := names[uid]; !ok {
				names[uid] = s.led.names.name(uid)
			}
		}
	}

	s.mu.Lock()
	changed, lost := false, false
	for i, lk := range looks {
		l, res := lk.l, results[i]
		found := map[int][]*procscan.Proc{}
		for i, id := range l.Devices {
			if !l.held[id] {
				continue
			}
			for _, pid := range res.Files[l.files[i]] {
				if pi := res.Info[pid]; pi != nil {
					found[id] = append(found[id], pi)
				}
			}
			// A look cut at maxTree did not reach every holder the last
			// one found: those stay until a look reaches them or the next
			// full scan, rather than vanish from the board meanwhile.
			for _, h := range l.holders[id] {
				if !res.Looked(h.PID) {
					found[id] = append(found[id], h)
				}
			}
			if len(found[id]) == 0 && s.led.leases[id] == l {
				lost = true // held, but not by anyone known: a full scan will tell
			}
		}
		if len(l.held) > 0 && s.setHoldersLocked(l, found, res.At, names) {
			changed = true
		}
	}
	s.led.refreshed = time.Now()
	if changed {
		s.changedLocked()
	}
	s.mu.Unlock()
	if lost {
		s.kickScan()
	}
}

// setHoldersLocked sets what /proc shows holding l's devices, logs where
// that disagrees with the broker's record, and tells whether the holders
// changed.
func (s *Server) setHoldersLocked(l *ledgerEntry, found map[int][]*procscan.Proc, at time.Time, names map[uint32]string) bool {
	changed := len(found) != len(l.holders)
	for id, hs := range found {
		slices.SortFunc(hs, func(a, b *procscan.Proc) int { return a.PID - b.PID })
		if !slices.EqualFunc(hs, l.holders[id], func(a, b *procscan.Proc) bool { return a.PID == b.PID && a.Start == b.Start }) {
			changed = true
		}
	}
	l.holders, l.checked = found, at
	if l.said == nil {
		l.said = map[string]bool{}
	}
	var all []*procscan.Proc
	inAll := map[*procscan.Proc]bool{}
	for _, id := range l.Devices {
		for _, h := range found[id] {
			if !inAll[h] {
				inAll[h] = true
				all = append(all, h)
			}
		}
	}
	if l.pidStart == 0 {
		// The start time of the process granted the lease, read here, off
		// the grant's path: while it holds the lease its pid is its own.
		for _, h := range all {
			if h.PID == l.pid {
				l.pidStart = h.Start
			}
		}
	}
	devs := s.inv.Vendor.Format(heldIDs(l))
	if l.pid > 0 && l.kind() != client.KindTask && len(all) > 0 && !l.said["pid"] &&
		!slices.ContainsFunc(all, func(h *procscan.Proc) bool { return h.PID == l.pid && (l.pidStart == 0 || h.Start == l.pidStart) }) {
		l.said["pid"] = true
		s.log.Printf("%s: pid %d, granted the lease of %s, holds it no more; /proc shows it held by %s", devs, l.pid, l.User, pidList(all, names))
	}
	for _, h := range all {
		key := "uid " + strconv.Itoa(h.PID)
		if h.UID != l.UID && l.User != "" && !l.said[key] && !(h.UID == 0 && l.kind() == client.KindSlurm) { // a job's step daemons are root's
			l.said[key] = true
			s.log.Printf("%s: the lease of %s is held by pid %d of %s: its descriptor was passed on", devs, l.User, h.PID, names[h.UID])
		}
	}
	return changed
}

func heldIDs(l *ledgerEntry) []int {
	var ids []int
	for _, id := range l.Devices {
		if l.held[id] {
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

// holdersInfo is what the board shows of device id's holders in l: the
// root holders (whose parent holds nothing) first, then the others, in
// pid order; commands left out where show says so.
func (s *Server) holdersInfo(l *ledgerEntry, id int, show func(uid uint32) bool) ([]client.Holder, int) {
	hs := l.holders[id]
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
	out := make([]client.Holder, 0, len(all))
	for _, h := range all {
		ch := client.Holder{PID: h.PID, PPID: h.PPID, UID: h.UID, User: s.led.names.name(h.UID), Started: h.Started.UnixMilli()}
		if show(h.UID) {
			ch.Command = commandLine(h)
		}
		out = append(out, ch)
	}
	return out, more
}
