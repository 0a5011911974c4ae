package broker

import (
	"fmt"
	"maps"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/broker/slurmjobs"
	"github.com/npurun/npurun/npu"
)

// What status knows of each lease, beside the lease table's record of its
// grant (lease.Lease: who it was granted to, kind, user, the pid from
// SO_PEERCRED, task id, login session, when, and which lock files it
// holds): who /proc shows holding it now. Status joins the two, and where
// they disagree /proc wins and the broker says so in its log. Starts and
// ends go to the accounting log (usage.go). The ledger follows the table:
// a lease is entered as it is granted (leaseStartLocked) or adopted, and
// its devices leave as the table reports them released (leaseEndLocked).

// ledgerEntry is one grant while any of its devices is held.
type ledgerEntry struct {
	*lease.Lease                   // the table's record of the grant
	pid          int               // the process granted it; for a task, its supervisor once known
	pidStart     uint64            // against pid reuse: taken when /proc first shows it holding the lease; 0 until then
	files        []procscan.FileID // the lease's lock files, in the order of its devices
	held         map[int]bool      // devices not yet released
	logged       bool              // its start is in the accounting log; else it is summed (usagelimit.go)

	holders map[int][]*procscan.Proc // per device: who /proc shows holding it, from the last look
	checked time.Time                // when that look was
	said    map[string]bool          // disagreements already logged
}

// newEntry is the ledger's entry for lease l, its devices all held.
func newEntry(l *lease.Lease) *ledgerEntry {
	e := &ledgerEntry{Lease: l, pid: l.PID, pidStart: l.PIDStart, held: make(map[int]bool, len(l.Devices))}
	for i, id := range l.Devices {
		e.held[id] = true
		if i < len(l.Files) {
			e.files = append(e.files, procscan.FileID(l.Files[i]))
		}
	}
	return e
}

// kind is l's kind as the wire and the accounting log name it.
func (l *ledgerEntry) kind() string { return string(l.Kind) }

// fileOf returns the lock file of device id in l.
func (l *ledgerEntry) fileOf(id int) (procscan.FileID, bool) {
	if i := slices.Index(l.Devices, id); i >= 0 && i < len(l.files) {
		return l.files[i], true
	}
	return procscan.FileID{}, false
}

// ledger is the broker's record of leases and what it saw in /proc, under
// Server.mu unless said otherwise.
type ledger struct {
	leases  map[int]*ledgerEntry // by device id, while held
	scanner *procscan.Scanner    // safe for concurrent use
	usage   *usageLog            // the accounting log
	nodes   map[uint64]npu.Node  // the device and control nodes watched, by device number

	// the background scan (scan.go)
	kick       chan struct{}
	lastScan   *scanInfo
	seen       map[useKey]*use       // device nodes used without a lease, by process and node
	streaks    map[streakKey]*streak // how long each account's use of a node has gone on
	lastJudged time.Time             // the start of the last scan judged
	reported   []*use                // those past the grace window, as status shows them

	// watchers (status.go)
	gen     uint64
	changed chan struct{} // closed at the next change; nil while nobody waits

	// the accounting log's limit on lease records per user (usagelimit.go)
	logLimit logLimit
	sums     usageSums

	refreshMu sync.Mutex // one targeted look at a time
	refreshed time.Time

	metrics   *metrics
	metricsLn net.Listener // [broker] metrics_listen, nil when off

	names nameCache // uid -> user name, for holders of any uid
}

// initLedger prepares the ledger: the /proc scanner, the device nodes to
// watch, the accounting log (read back for the leases still open), and
// the leases found held at start (held: device id -> its held lock file).
// It returns once every held device has its lease taken up (adopted by the
// lease table) or recorded as found.
func (s *Server) initLedger(stateDir string, held map[int]lease.FileID) error {
	led := &s.led
	led.leases = map[int]*ledgerEntry{}
	led.kick = make(chan struct{}, 1)
	led.seen = map[useKey]*use{}
	led.nodes, led.streaks = map[uint64]npu.Node{}, map[streakKey]*streak{}
	led.metrics = newMetrics(s)
	s.listenMetrics()
	nodes, notes := s.inv.WatchNodes()
	for _, note := range notes {
		s.log.Print(note)
	}
	for _, nd := range nodes {
		led.nodes[nd.Number] = nd
	}
	var err error
	if led.scanner, err = procscan.New(s.procRoot(), os.Getpid()); err != nil {
		return fmt.Errorf("read /proc: %w", err)
	}

	path := usagePath(s.cfg.Usage.Log, stateDir)
	if s.cfg.Usage.Log != "" {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			s.log.Printf("usage log %s: %v", path, err)
		}
	}
	led.usage = newUsageLog(path, s.cfg.Usage.MaxSize, s.cfg.Usage.Keep, s.log, s.openRecords)
	recs, err := readUsage(path)
	if err != nil {
		s.log.Printf("usage log: %v; leases held from before this start are recorded as found", err)
	}
	for _, r := range recs {
		s.table.NoteID(r.Lease)
	}
	led.logLimit = logLimit{}
	led.sums = usageSums{}
	s.adoptLeases(openLeases(recs), held)
	go led.usage.run()
	go s.sumLoop()
	go s.scanLoop()
	return nil
}

// procRoot is where /proc is read.
func (s *Server) procRoot() string { return "/proc" }

// leaseStartLocked records lease l, just granted by handover h: the
// ledger, the accounting log, the metrics.
func (s *Server) leaseStartLocked(l *lease.Lease, h *lease.Handover) {
	e := newEntry(l)
	for _, id := range l.Devices {
		s.led.leases[id] = e
	}
	now := l.Since
	waited := now.Sub(h.W.Queued)
	s.led.metrics.granted(e.kind(), waited)
	for i := range l.Devices {
		if at := h.Freed(i); !at.IsZero() && h.W.Queued.Before(at) {
			s.led.metrics.handoff(now.Sub(at))
		}
	}
	if s.led.logLimit.allow(l.UID, now) {
		rec := e.record("start")
		rec.WaitedMS = waited.Milliseconds()
		s.led.usage.add(rec)
		e.logged = true
	}
	s.led.refreshed = time.Time{} // the next status looks at the new lease's holders
	s.changedLocked()
}

// record is l as a line of the accounting log.
func (l *ledgerEntry) record(ev string) usageRec {
	r := usageRec{T: l.Since.UnixMilli(), Ev: ev, Lease: l.ID, Kind: l.kind(), User: l.User, UID: l.UID, Pool: l.Pool,
		Devices: l.Devices, Task: l.Task, PID: l.pid, PIDStart: l.pidStart, Service: l.Service, TTY: l.TTY, RHost: l.RHost, Claimed: l.Claimed,
		SlurmJob: l.SlurmJob}
	for _, f := range l.files {
		r.FSDev = f.Dev
		r.Inodes = append(r.Inodes, f.Ino)
	}
	return r
}

// leaseEndLocked records that device id of lease ll was released at now:
// the lease table's watcher saw the lock go.
func (s *Server) leaseEndLocked(ll *lease.Lease, id int, now time.Time) {
	l := s.led.leases[id]
	if l == nil || l.Lease != ll {
		return
	}
	delete(s.led.leases, id)
	delete(l.held, id)
	if l.logged {
		s.led.usage.add(usageRec{T: now.UnixMilli(), Ev: "end", Lease: l.ID, Device: &id, How: endReleased, DurMS: now.Sub(l.Since).Milliseconds()})
	} else {
		s.led.sums.add(l, now)
	}
	s.changedLocked()
}

// openRecords are the "open" records of the leases held now, for a fresh
// accounting log.
func (s *Server) openRecords() []usageRec {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []usageRec
	for _, l := range s.uniqueLeasesLocked() {
		l.logged = true // its end goes to the log now, to close this record
		r := l.record("open")
		// Only the devices still held: the others have their ends.
		r.Devices, r.Inodes = nil, nil
		for i, id := range l.Devices {
			if l.held[id] {
				r.Devices = append(r.Devices, id)
				r.Inodes = append(r.Inodes, l.files[i].Ino)
			}
		}
		out = append(out, r)
	}
	return out
}

// uniqueLeasesLocked returns each held lease once, by its first device.
func (s *Server) uniqueLeasesLocked() []*ledgerEntry {
	var out []*ledgerEntry
	for _, id := range s.inv.IDs {
		if l := s.led.leases[id]; l != nil && !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	return out
}

// adoptLeases takes up, at start, the leases held from before: a held
// device whose lock file is one that an open lease of the log names goes
// on as that lease (holders, max_devices, the log); a held device the log
// does not know becomes a lease found now, of whoever /proc shows holding
// it. An open lease whose devices are free by now ended while the broker
// was down: its ends are written with the time it was found gone. Each
// lease is adopted by the lease table, which releases it through its
// watchers as any other. held maps device ids to their held lock file.
func (s *Server) adoptLeases(open map[uint64]*openLease, held map[int]lease.FileID) {
	now := time.Now()
	byFile := map[lease.FileID]*openLease{}
	for _, ol := range open {
		for i, ino := range ol.rec.Inodes {
			if i < len(ol.rec.Devices) {
				byFile[lease.FileID{Dev: ol.rec.FSDev, Ino: ino}] = ol
			}
		}
	}
	adopted := map[uint64]*lease.Lease{}
	var order []*lease.Lease
	var unknown []int
	for _, id := range slices.Sorted(maps.Keys(held)) {
		fid := held[id]
		ol := byFile[fid]
		if fid == (lease.FileID{}) || ol == nil || !ol.held[id] || !slices.Contains(ol.rec.Devices, id) {
			unknown = append(unknown, id)
			continue
		}
		l := adopted[ol.rec.Lease]
		if l == nil {
			r := ol.rec
			l = &lease.Lease{ID: r.Lease, Pool: r.Pool, Since: time.UnixMilli(r.T), Adopted: true,
				Holder: lease.Holder{Kind: lease.Kind(r.Kind), UID: r.UID, User: r.User, PID: r.PID, PIDStart: r.PIDStart, Task: r.Task,
					Service: r.Service, TTY: r.TTY, RHost: r.RHost, Claimed: r.Claimed, SlurmJob: r.SlurmJob}}
			adopted[r.Lease] = l
			order = append(order, l)
		}
		l.Devices = append(l.Devices, id)
		l.Files = append(l.Files, fid)
		delete(ol.held, id)
	}
	for _, l := range order {
		e := newEntry(l)
		e.logged = true
		s.adopt(e)
		for _, id := range l.Devices {
			s.log.Printf("npu %d: lease of %s (%s) from before this start goes on", id, l.User, kindName(e))
		}
	}
	for _, ol := range open {
		for _, id := range slices.Sorted(maps.Keys(ol.held)) {
			id := id
			s.led.usage.add(usageRec{T: now.UnixMilli(), Ev: "end", Lease: ol.rec.Lease, Device: &id, How: endGone,
				DurMS: now.UnixMilli() - ol.rec.T})
		}
	}
	if s.slurm != nil && len(unknown) > 0 {
		unknown = s.adoptSlurmJobs(unknown, held)
	}
	if len(unknown) > 0 {
		s.findHolders(unknown, held, now)
	}
}

// adoptSlurmJobs adopts the Slurm jobs' leases that the Slurm room's
// records name among the held devices ids the accounting log does not
// know (its records of their starts were summed or lost), and returns
// the devices left unknown.
func (s *Server) adoptSlurmJobs(ids []int, held map[int]lease.FileID) []int {
	unknown := map[int]lease.FileID{}
	for _, id := range ids {
		unknown[id] = held[id]
	}
	for _, l := range s.slurm.Adoptable(unknown, s.table.PoolOf) {
		e := newEntry(l)
		s.led.usage.add(e.record("start"))
		e.logged = true
		s.adopt(e)
		for _, id := range l.Devices {
			delete(unknown, id)
		}
	}
	return slices.Sorted(maps.Keys(unknown))
}

// findHolders makes a lease of each held device the log does not know,
// for whoever a scan of /proc shows holding it.
func (s *Server) findHolders(ids []int, held map[int]lease.FileID, now time.Time) {
	targets := procscan.Targets{Files: map[procscan.FileID]bool{}}
	for _, id := range ids {
		if fid := held[id]; fid != (lease.FileID{}) {
			targets.Files[procscan.FileID(fid)] = true
		}
	}
	// A scan reads a bounded share of each user's processes: scan on
	// until every lock file has a holder, or no process was left unread.
	res := &procscan.Result{Files: map[procscan.FileID][]int{}, Info: map[int]*procscan.Proc{}}
	for range maxFindScans {
		r, err := s.led.scanner.Scan(targets)
		if err != nil {
			s.log.Printf("find the holders of npu %s: %v", npu.FormatIDs(ids), err)
			return
		}
		for fid, pids := range r.Files {
			res.Files[fid] = append(res.Files[fid], pids...)
		}
		maps.Copy(res.Info, r.Info)
		all := true
		for fid := range targets.Files {
			all = all && len(res.Files[fid]) > 0
		}
		if all || !r.AnyDeferred() {
			break
		}
	}
	if s.slurm != nil {
		ids = s.findSlurmJobs(ids, held, res, now)
	}
	for _, id := range ids {
		fid := held[id]
		if fid == (lease.FileID{}) {
			continue
		}
		l := &lease.Lease{ID: s.table.NewID(), Holder: lease.Holder{Kind: lease.Found}, Since: now, Adopted: true,
			Pool: s.table.PoolOf(id), Devices: []int{id}, Files: []lease.FileID{fid}}
		pids := res.Files[procscan.FileID(fid)]
		if len(pids) == 0 {
			s.log.Printf("npu %d is held by a lease from before this start, and no process shows holding it", id)
		} else if pi := res.Info[pids[0]]; pi != nil {
			l.UID, l.PID, l.PIDStart = pi.UID, pi.PID, pi.Start
			l.User = s.led.names.name(pi.UID)
			s.log.Printf("npu %d is held by a lease from before this start with no record of its grant: held by pid %d (%s)", id, pi.PID, l.User)
		}
		e := newEntry(l)
		rec := e.record("start")
		rec.Found = true
		s.led.usage.add(rec)
		e.logged = true
		s.adopt(e)
	}
}

// findSlurmJobs makes a Slurm job's lease of the held devices ids,
// neither the log nor the Slurm room's records know, whose holders (res)
// include the job's extern step (a root "slurmstepd: [N.extern]"), one
// lease per job; its user is the other holders', else Slurm's (squeue).
// It returns the devices left.
func (s *Server) findSlurmJobs(ids []int, held map[int]lease.FileID, res *procscan.Result, now time.Time) []int {
	var left []int
	jobs := map[uint32]*lease.Lease{}
	for _, id := range ids {
		fid := held[id]
		var job uint32
		var user, extern *procscan.Proc
		for _, pid := range res.Files[procscan.FileID(fid)] {
			pi := res.Info[pid]
			switch {
			case pi == nil:
			case pi.UID != 0:
				user = pi
			case job == 0:
				if job = slurmjobs.ExternJob(pi.UID, pi.Cmdline); job != 0 {
					extern = pi
				}
			}
		}
		if fid == (lease.FileID{}) || job == 0 {
			left = append(left, id)
			continue
		}
		l := jobs[job]
		if l == nil {
			l = &lease.Lease{ID: s.table.NewID(), Holder: lease.Holder{Kind: lease.Slurm, SlurmJob: job, PID: extern.PID, PIDStart: extern.Start},
				Since: now, Adopted: true, Pool: s.table.PoolOf(id)}
			jobs[job] = l
		}
		l.Devices, l.Files = append(l.Devices, id), append(l.Files, fid)
		if user != nil && l.User == "" {
			l.UID, l.User = user.UID, s.led.names.name(user.UID)
		}
	}
	for _, job := range slices.Sorted(maps.Keys(jobs)) {
		l := jobs[job]
		if l.User == "" {
			uid, name, err := s.slurm.JobUser(job)
			if err != nil {
				s.log.Printf("job %d: its user: %v", job, err)
			}
			l.UID, l.User = uid, name
		}
		s.log.Printf("%s is held by job %d of %s, whose lease has no record: taken up as the job's", s.inv.Vendor.Format(l.Devices), job, l.User)
		e := newEntry(l)
		rec := e.record("start")
		rec.Found = true
		s.led.usage.add(rec)
		e.logged = true
		s.adopt(e)
	}
	return left
}

// maxFindScans bounds the scans findHolders does for the holders of the
// leases found at start.
const maxFindScans = 64

// adopt enters lease e, held since before this start, in the ledger, and
// has the lease table take it up: it counts against its user's
// max_devices, and is released through the table's watchers as any other.
func (s *Server) adopt(e *ledgerEntry) {
	if err := s.table.Adopt(e.Lease); err != nil {
		s.log.Print(err)
		return
	}
	for _, id := range e.Devices {
		s.led.leases[id] = e
	}
}

func kindName(l *ledgerEntry) string {
	switch l.kind() {
	case client.KindTask:
		return fmt.Sprintf("task %d", l.Task)
	case client.KindSlurm:
		return slurmJobName(l)
	case client.KindHeld:
		return "grant unknown"
	}
	return l.kind()
}

// lookupName is the name of uid in the user database, or "uid N".
func lookupName(uid uint32) string {
	if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
		return u.Username
	}
	return "uid " + strconv.FormatUint(uint64(uid), 10)
}

// nameCache maps uids to user names, for holders and unleased users of any
// uid, without the cost of a full account lookup.
type nameCache struct {
	mu sync.Mutex
	m  map[uint32]nameEntry
}

type nameEntry struct {
	name string
	at   time.Time
}

func (c *nameCache) name(uid uint32) string {
	c.mu.Lock()
	e, ok := c.m[uid]
	c.mu.Unlock()
	if ok && time.Since(e.at) < accountTTL {
		return e.name
	}
	e = nameEntry{name: lookupName(uid), at: time.Now()}
	c.mu.Lock()
	if c.m == nil || len(c.m) > 4096 {
		c.m = map[uint32]nameEntry{}
	}
	c.m[uid] = e
	c.mu.Unlock()
	return e.name
}

// commandLine writes a process's command line for people: its arguments,
// or its name in brackets as ps(1) does for a process without any.
func commandLine(pi *procscan.Proc) string {
	if len(pi.Cmdline) == 0 {
		return "[" + pi.Comm + "]"
	}
	cmd := strings.Join(pi.Cmdline, " ")
	if len(cmd) > maxCommand {
		cut := maxCommand
		for cut > 0 && !utf8.RuneStart(cmd[cut]) {
			cut-- // not inside a character
		}
		cmd = cmd[:cut] + "…"
	}
	return cmd
}

// maxCommand bounds a command line on the board.
const maxCommand = 256
