package broker

import (
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/policy"
)

// The background scan reads every process's descriptors in /proc (a few
// hundred milliseconds on a busy machine: ~10-60 µs a process), so status
// never waits for one. It finds the holders of every lease, including a
// process a descriptor was passed to, and the processes that have a
// device node open without holding a lease on that device, themselves or
// through an ancestor ("unleased use"). Such a process is reported once it
// has been seen for the grace window ([status] unleased_grace), so that
// short-lived tools are not; for a restricted account the policy may then
// have it sent SIGTERM or SIGKILL ([status] unleased_use). A lease that
// has not touched its device yet is never idle, and nothing here takes a
// lease away: allocation is the truth, usage only a signal.
//
// Its CPU share is bounded: a scan starts at most every scan_interval, and
// never sooner after the last one than 59 times the CPU time that one
// took: the scan's own thread stays within 1/60 of one core whatever the
// number of processes, which leaves the broker's whole share within 2%
// with what the scan costs elsewhere (its garbage, mostly). On a busy
// machine its wall time is longer, not its share.
// Status asks for a scan sooner (a kick) when it finds a lease whose known
// holders are all gone; the bound holds for those too.

// scanBudget is the least ratio of the time from one scan's start to the
// next one's to the CPU time the first took: 60, 1/60 of one core.
const scanBudget = 60

// scanInfo is what status tells of the last background scan.
type scanInfo struct {
	at    time.Time
	took  time.Duration
	procs int
}

// useKey names one process's unleased use of one device.
type useKey struct {
	pid   int
	start uint64
	dev   int
}

// use is a device node open without a lease.
type use struct {
	useKey
	uid        uint32
	user       string
	command    string
	since      time.Time // first seen
	reported   bool      // past the grace window
	restricted bool
	action     string // policy.UnleasedReport, UnleasedTerm, UnleasedKill
	acted      bool   // the action was logged
}

// kickScan asks for a scan as soon as the CPU budget allows.
func (s *Server) kickScan() {
	select {
	case s.led.kick <- struct{}{}:
	default:
	}
}

// scanLoop runs the background scan for the broker's life. It keeps to
// one thread, so that the CPU time a scan costs is that thread's.
func (s *Server) scanLoop() {
	runtime.LockOSThread()
	var lastEnd time.Time
	var cost time.Duration
	next := time.Now()
	for {
		if wait := time.Until(next); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-s.led.kick:
				t.Stop()
				if early := lastEnd.Add(time.Duration(scanBudget-1) * cost); early.Before(next) {
					next = early
				}
				continue
			}
		}
		start, cpu := time.Now(), threadCPU()
		s.scanOnce()
		lastEnd = time.Now()
		if cost = threadCPU() - cpu; cpu == 0 || cost <= 0 {
			cost = lastEnd.Sub(start) // no CPU time to be had: the wall time, which is more
		}
		next = start.Add(max(s.cfg.Status.ScanInterval, time.Duration(scanBudget)*cost))
	}
}

// threadCPU is the CPU time, user and system, of the calling thread; 0
// where it cannot be read.
func threadCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_THREAD, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// scanOnce scans /proc for the holders of every lease and for device
// nodes open without a lease, then acts on what it found.
func (s *Server) scanOnce() {
	targets := procscan.Targets{Files: map[procscan.FileID]bool{}, Nodes: map[uint64]bool{}}
	s.mu.Lock()
	for rdev := range s.led.nodes {
		targets.Nodes[rdev] = true
	}
	for _, l := range s.uniqueLeasesLocked() {
		for i, id := range l.devices {
			if l.held[id] {
				targets.Files[l.files[i]] = true
			}
		}
	}
	s.mu.Unlock()
	res, err := s.led.scanner.Scan(targets)
	if err != nil {
		s.log.Printf("scan /proc: %v", err)
		return
	}
	// What the judgement needs from /proc and the user database, read
	// outside the lock: the ancestors of each user of a node, and whether
	// its account is restricted.
	ancestors := map[int][]int{}
	restricted := map[uint32]bool{}
	for _, pids := range res.Nodes {
		for _, pid := range pids {
			if _, done := ancestors[pid]; !done {
				ancestors[pid] = s.led.scanner.Ancestors(res, pid)
			}
			if pi := res.Info[pid]; pi != nil {
				if _, done := restricted[pi.UID]; !done {
					restricted[pi.UID] = s.restrictedAccount(pi.UID)
				}
			}
		}
	}
	names := map[uint32]string{}
	for _, pi := range res.Info {
		if pi != nil {
			if _, done := names[pi.UID]; !done {
				names[pi.UID] = s.led.names.name(pi.UID)
			}
		}
	}
	s.mu.Lock()
	s.led.lastScan = &scanInfo{at: res.At, took: res.Took, procs: res.Procs}
	s.led.metrics.scanned(res)
	s.holdersFromScanLocked(res, targets, names)
	acts := s.unleasedLocked(res, targets, ancestors, restricted, names)
	s.changedLocked() // the board tells when the last scan was, if nothing else
	s.mu.Unlock()
	for _, u := range acts {
		sig := unix.SIGTERM
		if u.action == policy.UnleasedKill {
			sig = unix.SIGKILL
		}
		if err := s.led.scanner.Signal(u.pid, u.start, sig); err != nil {
			s.log.Printf("npu %d: pid %d (%s): %s: %v", u.dev, u.pid, u.user, unix.SignalName(sig), err)
		}
	}
}

// holdersFromScanLocked takes each lease's holders from a full scan.
func (s *Server) holdersFromScanLocked(res *procscan.Result, targets procscan.Targets, names map[uint32]string) {
	for _, l := range s.uniqueLeasesLocked() {
		found := map[int][]*procscan.Proc{}
		scanned := true
		for i, id := range l.devices {
			if !l.held[id] {
				continue
			}
			if !targets.Files[l.files[i]] {
				scanned = false // granted after the scan began
				break
			}
			for _, pid := range res.Files[l.files[i]] {
				if pi := res.Info[pid]; pi != nil {
					found[id] = append(found[id], pi)
				}
			}
		}
		if scanned {
			s.setHoldersLocked(l, found, res.At, names)
		}
	}
}

// unleasedLocked judges the device nodes open in res: it keeps the uses
// seen, reports those past the grace window, and returns those the policy
// acts on now.
func (s *Server) unleasedLocked(res *procscan.Result, targets procscan.Targets, ancestors map[int][]int, restricted map[uint32]bool, names map[uint32]string) []use {
	st := s.cfg.Status
	seen := map[useKey]bool{}
	var acts []use
	for rdev, pids := range res.Nodes {
		dev, ok := s.led.nodes[rdev]
		if !ok {
			continue
		}
		var holders map[int]bool
		if l := s.led.leases[dev]; l != nil {
			fid, _ := l.fileOf(dev)
			if !targets.Files[fid] {
				continue // leased after the scan began: judged next time
			}
			holders = make(map[int]bool, len(res.Files[fid]))
			for _, pid := range res.Files[fid] {
				holders[pid] = true
			}
		}
		for _, pid := range pids {
			pi := res.Info[pid]
			if pi == nil || exempt(pi, st.UnleasedExempt) {
				continue
			}
			if holders[pid] || slices.ContainsFunc(ancestors[pid], func(a int) bool { return holders[a] }) {
				continue
			}
			k := useKey{pid: pid, start: pi.Start, dev: dev}
			seen[k] = true
			u := s.led.seen[k]
			if u == nil {
				if len(s.led.seen) >= maxUses {
					continue
				}
				u = &use{useKey: k, uid: pi.UID, user: names[pi.UID], command: commandLine(pi), since: res.At,
					restricted: restricted[pi.UID], action: policy.UnleasedReport}
				s.led.seen[k] = u
			}
			if !u.reported && res.At.Sub(u.since) >= st.UnleasedGrace {
				u.reported = true
				if u.restricted {
					u.action = st.UnleasedUse
				}
				s.log.Printf("npu %d: pid %d (%s: %s) has %s open without a lease, seen for %s%s",
					dev, pid, u.user, u.command, s.led.paths[dev], quantity.Duration(res.At.Sub(u.since)), actionNote(u))
			}
			if u.reported && u.action != policy.UnleasedReport {
				acts = append(acts, *u)
			}
		}
	}
	for k := range s.led.seen {
		if !seen[k] {
			delete(s.led.seen, k) // gone, or closed
		}
	}
	s.led.reported = s.led.reported[:0]
	for _, u := range s.led.seen {
		if u.reported {
			s.led.reported = append(s.led.reported, u)
		}
	}
	slices.SortFunc(s.led.reported, func(a, b *use) int {
		if a.dev != b.dev {
			return a.dev - b.dev
		}
		return a.pid - b.pid
	})
	return acts
}

// maxUses bounds the unleased uses the broker keeps track of.
const maxUses = 4096

func actionNote(u *use) string {
	switch u.action {
	case policy.UnleasedTerm:
		return fmt.Sprintf("; sending it SIGTERM (unleased_use = \"term\", %s is restricted)", u.user)
	case policy.UnleasedKill:
		return fmt.Sprintf("; sending it SIGKILL (unleased_use = \"kill\", %s is restricted)", u.user)
	}
	return ""
}

// exempt tells whether the process is one of the programs never reported:
// a name matches the executable's base name or the command's name, a path
// the executable.
func exempt(pi *procscan.Proc, programs []string) bool {
	for _, p := range programs {
		switch {
		case filepath.IsAbs(p):
			if pi.Exe == p {
				return true
			}
		case pi.Exe != "" && filepath.Base(pi.Exe) == p:
			return true
		case pi.Comm == p || len(p) > 15 && pi.Comm == p[:15]:
			return true
		}
	}
	return false
}

// restrictedAccount tells whether uid is a restricted account
// ([restrict]), looking the account up if need be: unleased_use acts on
// those only. Root never is.
func (s *Server) restrictedAccount(uid uint32) bool {
	if uid == 0 {
		return false
	}
	acct := s.users.lookup(uid)
	return acct.known && s.cfg.Restricted(acct.name, acct.groups)
}

// unleasedInfo is u as the board shows it.
func (s *Server) unleasedInfo(u *use, showCommand bool) client.Unleased {
	out := client.Unleased{Device: u.dev, Name: s.deviceName(u.dev), Node: s.led.paths[u.dev], PID: u.pid, User: u.user, UID: u.uid,
		Since: u.since.UnixMilli(), Restricted: u.restricted, Action: u.action}
	if showCommand {
		out.Command = u.command
	}
	return out
}
