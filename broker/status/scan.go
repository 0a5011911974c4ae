package status

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/internal/fileid"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/wire"
)

// The background scan reads every process's descriptors and maps in
// /proc (a few hundred milliseconds on a busy machine: ~10-60 µs a
// process), so status never waits for one. It finds the holders of every
// lease, including a process a descriptor was passed to, and the
// processes that use a device node without holding a lease on that
// device, themselves or through an ancestor ("unleased use"). A node is
// known by its device number, whatever path a process reached it by (a
// bind mount in a namespace of its own, a container's /dev), and used
// whether open at a descriptor or mapped with its descriptor closed. A
// control node (davinci_manager, nvidiactl, …), which every user of any
// device opens, is unleased use in a process that holds no lease at all,
// itself or through an ancestor.
//
// Use is judged per account, not per process: an account's use of a node
// is reported once it has gone on for the grace window ([status]
// unleased_grace), through gaps shorter than the window (and from one
// scan to the next, however far apart the pacing puts them), whichever of
// the account's processes had it (a use handed from process to process,
// each younger than the window, is reported all the same); short-lived
// tools are not. Each of its processes is then listed, and for a
// restricted account the policy may have each sent SIGTERM or SIGKILL
// ([status] unleased_use), as the account itself would send it: its uid
// is read again just before, and a process that has become another
// user's (through a set-user-ID program) is left alone. Accounts of
// unleased_exempt_users and unleased_exempt_groups (root by default) are
// never reported. A lease that has not touched its device yet is never
// idle, and nothing here takes a lease away: allocation is the truth,
// usage only a signal.
//
// Its CPU share is bounded: a scan starts at most every scan_interval, and
// never sooner after the last one than 59 times the CPU time that one
// took: the scan's own thread stays within 1/60 of one core whatever the
// number of processes, which leaves the broker's whole share within 2%
// with what the scan costs elsewhere (its garbage, mostly). On a busy
// machine its wall time is longer, not its share; and one user's work in
// a scan is bounded (procscan's UserBudget), so that a user with a great
// many descriptors delays the finding of that user's own use, not
// everyone's.
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

// useKey names one process's unleased use of one node.
type useKey struct {
	pid   int
	start uint64
	node  uint64 // the node's device number
}

// use is a device node used without a lease by one process.
type use struct {
	useKey
	dev        int    // the device whose node it is; npu.ControlNode for a control node
	path       string // the node
	uid        uint32 // the process's effective uid when last seen
	user       string
	command    string
	mapped     bool      // mapped, no descriptor open
	since      time.Time // when its account's use of the node began
	reported   bool      // past the grace window
	restricted bool
	action     string // policy.UnleasedReport, UnleasedTerm, UnleasedKill
	now        bool   // seen by the last scan (not only kept from an earlier one)

	container *wire.ContainerRef // the container the process is in; nil for none
}

// streakKey names one account's unleased use of one node; in a
// container, the container's (its processes are root's, whichever
// container they are in).
type streakKey struct {
	uid       uint32
	node      uint64
	container string // the container's id; "" for a host process
}

// streak is how long an account's unleased use of a node has gone on:
// seen first and last, through gaps shorter than the grace window.
type streak struct {
	first, last time.Time
	logged      bool // its report is in the log: the account's later processes are not logged again, unless signalled
}

// judgement is what scanOnce reads, outside the lock, for judging the
// users of nodes: their ancestors, and which accounts are restricted,
// exempt, and their names.
type judgement struct {
	ancestors  map[int][]int
	restricted map[uint32]bool
	exempt     map[uint32]bool
	names      map[uint32]string
}

// kickScan asks for a scan as soon as the CPU budget allows.
func (g *Ledger) kickScan() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// scanLoop runs the background scan for the broker's life. It keeps to
// one thread, so that the CPU time a scan costs is that thread's.
func (g *Ledger) scanLoop() {
	runtime.LockOSThread()
	var lastEnd time.Time
	var cost time.Duration
	next := time.Now()
	for {
		if wait := time.Until(next); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-g.kick:
				t.Stop()
				if early := lastEnd.Add(time.Duration(scanBudget-1) * cost); early.Before(next) {
					next = early
				}
				continue
			}
		}
		start, cpu := time.Now(), threadCPU()
		g.scanOnce()
		lastEnd = time.Now()
		if cost = threadCPU() - cpu; cpu == 0 || cost <= 0 {
			cost = lastEnd.Sub(start) // no CPU time to be had: the wall time, which is more
		}
		next = start.Add(max(g.policy().Status.ScanInterval, time.Duration(scanBudget)*cost))
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
// nodes used without a lease, then acts on what it found.
func (g *Ledger) scanOnce() {
	g.mu.Lock()
	targets := g.scanSetLocked()
	g.unlock()
	res, err := g.scanner.Scan(targets.Targets)
	if err != nil {
		g.log.Printf("scan /proc: %v", err)
		return
	}
	// What the judgement needs from /proc and the user database, read
	// outside the lock: the ancestors of each user of a node, and its
	// account.
	j := &judgement{ancestors: map[int][]int{}, restricted: map[uint32]bool{}, exempt: map[uint32]bool{}, names: map[uint32]string{}}
	for _, pids := range res.Nodes {
		for _, pid := range pids {
			if _, done := j.ancestors[pid]; !done {
				j.ancestors[pid] = g.scanner.Ancestors(res, pid)
			}
			if pi := res.Info[pid]; pi != nil {
				if _, done := j.restricted[pi.UID]; !done {
					j.restricted[pi.UID], j.exempt[pi.UID] = g.unleasedAccount(pi.UID)
				}
			}
		}
	}
	for _, pi := range res.Info {
		if pi != nil {
			if _, done := j.names[pi.UID]; !done {
				j.names[pi.UID] = g.names.name(pi.UID)
			}
		}
	}
	g.metrics.scanned(res)
	g.mu.Lock()
	g.lastScan = &scanInfo{at: res.At, took: res.Took, procs: res.Procs}
	g.holdersFromScanLocked(res, targets, j.names)
	acts := g.unleasedLocked(res, targets, j)
	g.changedLocked() // the board tells when the last scan was, if nothing else
	g.unlock()
	g.memoryOnce(res)
	for _, u := range acts {
		sig := unix.SIGTERM
		if u.action == policy.UnleasedKill {
			sig = unix.SIGKILL
		}
		err := g.scanner.SignalAs(u.pid, u.start, u.uid, sig)
		switch {
		case errors.Is(err, procscan.ErrNotTheirs):
			g.log.Printf("%spid %d, %s's until now, %v: not sent %s", useSubject(&u), u.pid, u.user, err, unix.SignalName(sig))
		case err != nil:
			g.log.Printf("%spid %d (%s): %s: %v", useSubject(&u), u.pid, u.user, unix.SignalName(sig), err)
		}
	}
}

// scanSet is what a scan looks for: the device nodes, the lock files of
// the leases held as it begins, and those leases. Only they are judged by
// it: a file is known by its device and inode number, and a lease let go
// of while /proc is read may leave its number to a later lease's file
// (the file system gives a freed inode out again), whose holders the scan
// then finds under it; a lease held from the scan's start to its end kept
// its file (the table holds it open), so what was found under it is its
// own. The ender's sweep (package leaseend) judges by the same rule.
type scanSet struct {
	procscan.Targets
	leases map[*entry]bool
}

// scanSetLocked is what a scan beginning now looks for.
func (g *Ledger) scanSetLocked() scanSet {
	set := scanSet{Targets: procscan.Targets{Files: map[fileid.ID]bool{}, Nodes: map[uint64]bool{}}, leases: map[*entry]bool{}}
	for rdev := range g.nodes {
		set.Nodes[rdev] = true
	}
	for _, e := range g.uniqueLocked() {
		for i, id := range e.Devices {
			if e.held[id] {
				set.Files[e.files[i]] = true
				set.leases[e] = true
			}
		}
	}
	return set
}

// holdersFromScanLocked takes each lease's holders from a full scan. A
// holder the scan did not read to the end (its user's work was cut
// short) stays until a scan does.
func (g *Ledger) holdersFromScanLocked(res *procscan.Result, targets scanSet, names map[uint32]string) {
	for _, l := range g.uniqueLocked() {
		found := map[int][]*procscan.Proc{}
		scanned := true
		for i, id := range l.Devices {
			if !l.held[id] {
				continue
			}
			if !targets.leases[l] {
				scanned = false // granted after the scan began
				break
			}
			for _, pid := range res.Files[l.files[i]] {
				if pi := res.Info[pid]; pi != nil {
					found[id] = append(found[id], pi)
				}
			}
			for _, h := range l.holders[id] {
				if !res.Looked(h.PID) && !slices.ContainsFunc(found[id], func(p *procscan.Proc) bool { return p.PID == h.PID }) {
					found[id] = append(found[id], h)
				}
			}
		}
		if scanned {
			g.setHoldersLocked(l, found, res.At, names)
		}
	}
}

// unleasedLocked judges the device nodes used in res: it keeps the uses
// seen and their accounts' streaks, reports those past the grace window,
// and returns those the policy acts on now.
func (g *Ledger) unleasedLocked(res *procscan.Result, targets scanSet, j *judgement) []use {
	st := g.policy().Status
	seen := map[useKey]bool{}
	// An account's use goes on through a gap shorter than the grace
	// window, and always from one scan to the next, however far apart
	// the pacing puts them.
	gap := st.UnleasedGrace
	if !g.lastJudged.IsZero() {
		gap = max(gap, res.At.Sub(g.lastJudged))
	}
	g.lastJudged = res.At
	// Whoever holds any lease, for the control nodes; and the accounts
	// granted one since the scan began, whose control nodes wait for the
	// next scan.
	var anyLease map[int]bool
	fresh := map[uint32]bool{}
	for _, l := range g.uniqueLocked() {
		if !targets.leases[l] && slices.ContainsFunc(l.Devices, func(id int) bool { return l.held[id] }) {
			fresh[l.UID] = true
		}
	}
	var acts []use
	for rdev, pids := range res.Nodes {
		nd, ok := g.nodes[rdev]
		if !ok {
			continue
		}
		var holders map[int]bool
		switch l := g.leases[nd.Device]; {
		case nd.Control:
			if anyLease == nil {
				anyLease = map[int]bool{}
				for fid := range targets.Files {
					for _, pid := range res.Files[fid] {
						anyLease[pid] = true
					}
				}
			}
			holders = anyLease
		case l != nil:
			fid, _ := l.fileOf(nd.Device)
			if !targets.leases[l] {
				continue // leased after the scan began: judged next time
			}
			holders = make(map[int]bool, len(res.Files[fid]))
			for _, pid := range res.Files[fid] {
				holders[pid] = true
			}
		case len(g.shares[nd.Device]) > 0:
			// A device of shares: the holders of any of them use it
			// under a lease (sharing packs, it does not isolate).
			holders = map[int]bool{}
			for _, e := range g.shares[nd.Device] {
				fid, _ := e.fileOf(nd.Device)
				for _, pid := range res.Files[fid] {
					holders[pid] = true
				}
			}
		}
		var inHolders map[string]bool // the containers holders are in (containers_status.go)
		for _, pid := range pids {
			pi := res.Info[pid]
			if pi == nil || j.exempt[pi.UID] && pi.Container == nil || nd.Control && fresh[pi.UID] {
				continue
			}
			if holders[pid] || slices.ContainsFunc(j.ancestors[pid], func(a int) bool { return holders[a] }) {
				continue
			}
			if inHolderContainer(res, holders, &inHolders, pi) {
				continue
			}
			k := useKey{pid: pid, start: pi.Start, node: rdev}
			seen[k] = true
			sk := streakKey{uid: pi.UID, node: rdev, container: containerID(pi)}
			sr := g.streaks[sk]
			if sr == nil || res.At.Sub(sr.last) > gap {
				if sr == nil && len(g.streaks) >= maxUses {
					continue
				}
				sr = &streak{first: res.At}
				g.streaks[sk] = sr
			}
			sr.last = res.At
			u := g.seen[k]
			if u == nil || u.uid != pi.UID {
				// New, or its process became another user's: judged as
				// that user's from here.
				if u == nil && len(g.seen) >= maxUses {
					continue
				}
				u = &use{useKey: k, dev: nd.Device, path: nd.Path, uid: pi.UID, user: j.names[pi.UID], command: CommandLine(pi),
					restricted: j.restricted[pi.UID], action: policy.UnleasedReport, container: pi.Container}
				g.seen[k] = u
			}
			u.since, u.now = sr.first, true
			u.mapped = slices.Contains(res.Mapped[rdev], pid)
			if !u.reported && res.At.Sub(sr.first) >= st.UnleasedGrace {
				u.reported = true
				if u.restricted {
					u.action = st.UnleasedUse
				}
				how := "open"
				if u.mapped {
					how = "mapped (its descriptor closed)"
				}
				if !sr.logged || u.action != policy.UnleasedReport {
					sr.logged = true
					g.sayLocked("%spid %d (%s: %s)%s has %s %s without a lease%s, %s's use of it seen for %s%s",
						useSubject(u), pid, u.user, u.command, g.inContainerLocked(u.container), nd.Path, how, controlNote(nd), u.user, quantity.Duration(res.At.Sub(sr.first)), actionNote(u))
				}
			}
			if u.reported && u.action != policy.UnleasedReport {
				acts = append(acts, *u)
			}
		}
	}
	for k, u := range g.seen {
		switch {
		case seen[k]:
		case !res.Looked(k.pid):
			// Not read to the end (its user's work was cut short): kept,
			// and its account's use goes on, until a scan that reads it.
			u.now = false
			if sr := g.streaks[streakKey{uid: u.uid, node: k.node, container: containerID(&procscan.Proc{Container: u.container})}]; sr != nil {
				sr.last = res.At
			}
		default:
			delete(g.seen, k) // gone, or closed
		}
	}
	for k, sr := range g.streaks {
		if res.At.Sub(sr.last) > gap {
			delete(g.streaks, k)
		}
	}
	g.reported = g.reported[:0]
	for _, u := range g.seen {
		if u.reported {
			g.reported = append(g.reported, u)
		}
	}
	slices.SortFunc(g.reported, func(a, b *use) int {
		if a.dev != b.dev {
			return a.dev - b.dev
		}
		if a.path != b.path {
			return strings.Compare(a.path, b.path)
		}
		return a.pid - b.pid
	})
	return acts
}

// maxUses bounds the unleased uses, and the accounts' streaks, the broker
// keeps track of.
const maxUses = 4096

// useSubject begins a log line about u: the device's.
func useSubject(u *use) string {
	if u.dev == npu.ControlNode {
		return ""
	}
	return fmt.Sprintf("npu %d: ", u.dev)
}

func controlNote(nd npu.Node) string {
	if nd.Control {
		return " (a control node, and it holds no lease at all)"
	}
	return ""
}

func actionNote(u *use) string {
	switch u.action {
	case policy.UnleasedTerm:
		return fmt.Sprintf("; sending it SIGTERM (unleased_use = \"term\", %s is restricted)", u.user)
	case policy.UnleasedKill:
		return fmt.Sprintf("; sending it SIGKILL (unleased_use = \"kill\", %s is restricted)", u.user)
	}
	return ""
}

// unleasedAccount tells whether uid is a restricted account ([restrict]:
// unleased_use acts on those only; root never is) and whether it is exempt
// ([status] unleased_exempt_users, unleased_exempt_groups), looking the
// account up if need be. An account the user database does not know is
// neither, unless its number is root's.
func (g *Ledger) unleasedAccount(uid uint32) (restricted, exempt bool) {
	if uid == 0 {
		return false, g.policy().Status.Exempt("root", nil)
	}
	name, groups, known := g.account(uid)
	if !known {
		return false, false
	}
	return g.policy().Restricted(name, groups), g.policy().Status.Exempt(name, groups)
}

// unleasedInfo is u as the board shows it.
func (g *Ledger) unleasedInfo(u *use, showCommand bool) wire.Unleased {
	out := wire.Unleased{Device: u.dev, Node: u.path, PID: u.pid, User: u.user, UID: u.uid,
		Since: u.since.UnixMilli(), Restricted: u.restricted, Action: u.action, Mapped: u.mapped}
	if u.dev == npu.ControlNode {
		out.Control = true
	} else {
		out.Name = g.deviceName(u.dev)
	}
	if showCommand {
		out.Command = u.command
	}
	out.Container = g.containers.named(u.container, showCommand)
	return out
}
