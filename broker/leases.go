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
	"github.com/npurun/npurun/npu"
)

// What the broker records of each lease, beside the lock table: who it was
// granted to (kind, user, the pid from SO_PEERCRED, task id, login
// session), when, and which lock files (device and inode) it holds. /proc
// tells who holds it now; status joins the two, and where they disagree
// /proc wins and the broker says so in its log. Starts and ends go to the
// accounting log (usage.go).

// ledgerEntry is one grant while any of its devices is held.
type ledgerEntry struct {
	id       uint64
	kind     string // client.KindInline, KindTask, KindLogin, KindHeld
	uid      uint32
	user     string
	pid      int    // the process granted it; for a task, its supervisor once known
	pidStart uint64 // against pid reuse: taken when /proc first shows it holding the lease; 0 until then
	task     uint64
	service  string // login sessions: PAM service, tty, remote host
	tty      string
	rhost    string
	claimed  bool // service, tty and rhost are the user's own claim, not root's (the PAM module's)
	pool     string
	devices  []int
	files    []procscan.FileID // lock files, in the order of devices
	since    time.Time
	adopted  bool         // held since before this broker's start
	held     map[int]bool // devices not yet released
	logged   bool         // its start is in the accounting log; else it is summed (usagelimit.go)

	holders map[int][]*procscan.Proc // per device: who /proc shows holding it, from the last look
	checked time.Time                // when that look was
	said    map[string]bool          // disagreements already logged
}

// fileOf returns the lock file of device id in l.
func (l *ledgerEntry) fileOf(id int) (procscan.FileID, bool) {
	if i := slices.Index(l.devices, id); i >= 0 && i < len(l.files) {
		return l.files[i], true
	}
	return procscan.FileID{}, false
}

// ledger is the broker's record of leases and what it saw in /proc, under
// Server.mu unless said otherwise.
type ledger struct {
	leases  map[int]*ledgerEntry // by device id, while held
	lastID  uint64
	scanner *procscan.Scanner   // safe for concurrent use
	usage   *usageLog           // the accounting log
	nodes   map[uint64]npu.Node // the device and control nodes watched, by device number
	freed   map[int]time.Time   // when a device's last lease ended, for the handoff metric

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
// the leases found held at start (held: device id -> a descriptor of its
// held lock file, the one its watcher will wait on). It returns once every
// held device has its lease taken up or recorded as found.
func (s *Server) initLedger(stateDir string, held map[int]int) error {
	led := &s.led
	led.leases = map[int]*ledgerEntry{}
	led.freed = map[int]time.Time{}
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
		led.lastID = max(led.lastID, r.Lease)
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

// newLeaseID returns an id no lease in the log has: microseconds since the
// epoch, or one more than the last id.
func (s *Server) newLeaseID() uint64 {
	id := max(uint64(time.Now().UnixMicro()), s.led.lastID+1)
	s.led.lastID = id
	return id
}

// inlineGrantedLocked records the lease that grantLocked just sent over
// connection c: fds are the locked descriptors sent, in the order of
// g.Devices. The lease is the waiter's user's (who may not be the
// connection's: root asks on behalf of a login); its pid is the process
// that will hold it, c's peer. A login session's lease (login: kind login,
// with its PAM service, tty and remote host) is recorded here too.
func (s *Server) inlineGrantedLocked(c *conn, g lease.Grant, fds []int, login bool) {
	l := &ledgerEntry{kind: client.KindInline, uid: g.W.UID, user: g.W.User, pid: int(c.pid), pool: g.W.Pool}
	if login {
		l.kind = client.KindLogin
	}
	if o := c.origin; o != nil {
		l.service, l.tty, l.rhost, l.claimed = o.Service, o.TTY, o.RHost, !o.ByRoot
	}
	s.leaseStartLocked(l, g.Devices, fds, g.W)
}

// taskGrantedLocked records the lease of a task that startTaskLocked is
// starting on devices (none for a --no-device task).
func (s *Server) taskGrantedLocked(t *task, devices []int, fds []int) {
	if len(devices) == 0 {
		return
	}
	l := &ledgerEntry{kind: client.KindTask, uid: t.UID, user: t.User, task: t.ID}
	if t.w != nil {
		l.pool = t.w.Pool
	}
	s.leaseStartLocked(l, devices, fds, t.w)
}

// leaseStartLocked records a lease granted on devices through the locked
// descriptors fds: the ledger, the accounting log, the metrics.
func (s *Server) leaseStartLocked(l *ledgerEntry, devices []int, fds []int, w *lease.Waiter) {
	now := time.Now()
	l.id, l.since = s.newLeaseID(), now
	l.devices = slices.Clone(devices)
	l.held = map[int]bool{}
	for i, id := range devices {
		fid, err := procscan.ID(fds[i])
		if err != nil {
			s.log.Printf("npu %d: lock file: %v; its holders will not be found", id, err)
		}
		l.files = append(l.files, fid)
		l.held[id] = true
		s.led.leases[id] = l
	}
	if l.pool == "" && len(devices) > 0 {
		l.pool = s.poolOf[devices[0]]
	}
	var waited time.Duration
	if w != nil {
		waited = now.Sub(w.Queued)
	}
	s.led.metrics.granted(l.kind, waited)
	for _, id := range devices {
		if at, ok := s.led.freed[id]; ok {
			if w != nil && w.Queued.Before(at) {
				s.led.metrics.handoff(now.Sub(at))
			}
			delete(s.led.freed, id)
		}
	}
	if s.led.logLimit.allow(l.uid, now) {
		rec := l.record("start")
		rec.WaitedMS = waited.Milliseconds()
		s.led.usage.add(rec)
		l.logged = true
	}
	s.led.refreshed = time.Time{} // the next status looks at the new lease's holders
	s.changedLocked()
}

// record is l as a line of the accounting log.
func (l *ledgerEntry) record(ev string) usageRec {
	r := usageRec{T: l.since.UnixMilli(), Ev: ev, Lease: l.id, Kind: l.kind, User: l.user, UID: l.uid, Pool: l.pool,
		Devices: l.devices, Task: l.task, PID: l.pid, PIDStart: l.pidStart, Service: l.service, TTY: l.tty, RHost: l.rhost, Claimed: l.claimed}
	for _, f := range l.files {
		r.FSDev = f.Dev
		r.Inodes = append(r.Inodes, f.Ino)
	}
	return r
}

// leaseEndLocked records that device d's lease ended: its watcher saw the
// lock go.
func (s *Server) leaseEndLocked(d *device) {
	now := time.Now()
	s.led.freed[d.id] = now
	l := s.led.leases[d.id]
	if l == nil {
		return
	}
	delete(s.led.leases, d.id)
	delete(l.held, d.id)
	id := d.id
	if l.logged {
		s.led.usage.add(usageRec{T: now.UnixMilli(), Ev: "end", Lease: l.id, Device: &id, How: endReleased, DurMS: now.Sub(l.since).Milliseconds()})
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
		for i, id := range l.devices {
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
// was down: its ends are written with the time it was found gone.
// held maps device ids to a descriptor of their held lock file.
func (s *Server) adoptLeases(open map[uint64]*openLease, held map[int]int) {
	now := time.Now()
	byFile := map[procscan.FileID]*openLease{}
	for _, ol := range open {
		for i, ino := range ol.rec.Inodes {
			if i < len(ol.rec.Devices) {
				byFile[procscan.FileID{Dev: ol.rec.FSDev, Ino: ino}] = ol
			}
		}
	}
	adopted := map[uint64]*ledgerEntry{}
	var unknown []int
	for _, id := range slices.Sorted(maps.Keys(held)) {
		fid, err := procscan.ID(held[id])
		ol := byFile[fid]
		if err != nil || ol == nil || !ol.held[id] || !slices.Contains(ol.rec.Devices, id) {
			unknown = append(unknown, id)
			continue
		}
		l := adopted[ol.rec.Lease]
		if l == nil {
			r := ol.rec
			l = &ledgerEntry{id: r.Lease, kind: r.Kind, uid: r.UID, user: r.User, pid: r.PID, pidStart: r.PIDStart, task: r.Task,
				service: r.Service, tty: r.TTY, rhost: r.RHost, claimed: r.Claimed, pool: r.Pool, since: time.UnixMilli(r.T),
				adopted: true, held: map[int]bool{}, logged: true}
			adopted[r.Lease] = l
		}
		l.devices = append(l.devices, id)
		l.files = append(l.files, fid)
		l.held[id] = true
		delete(ol.held, id)
		s.adoptDevice(id, l)
		s.log.Printf("npu %d: lease of %s (%s) from before this start goes on", id, l.user, kindName(l))
	}
	for _, ol := range open {
		for _, id := range slices.Sorted(maps.Keys(ol.held)) {
			id := id
			s.led.usage.add(usageRec{T: now.UnixMilli(), Ev: "end", Lease: ol.rec.Lease, Device: &id, How: endGone,
				DurMS: now.UnixMilli() - ol.rec.T})
		}
	}
	if len(unknown) > 0 {
		s.findHolders(unknown, held, now)
	}
}

// findHolders makes a lease of each held device the log does not know,
// for whoever a scan of /proc shows holding it.
func (s *Server) findHolders(ids []int, held map[int]int, now time.Time) {
	targets := procscan.Targets{Files: map[procscan.FileID]bool{}}
	files := map[int]procscan.FileID{}
	for _, id := range ids {
		if fid, err := procscan.ID(held[id]); err == nil {
			files[id] = fid
			targets.Files[fid] = true
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
	for _, id := range ids {
		fid, ok := files[id]
		if !ok {
			continue
		}
		l := &ledgerEntry{id: s.newLeaseID(), kind: client.KindHeld, since: now, adopted: true, pool: s.poolOf[id],
			devices: []int{id}, files: []procscan.FileID{fid}, held: map[int]bool{id: true}}
		pids := res.Files[fid]
		if len(pids) == 0 {
			s.log.Printf("npu %d is held by a lease from before this start, and no process shows holding it", id)
		} else if pi := res.Info[pids[0]]; pi != nil {
			l.uid, l.pid, l.pidStart = pi.UID, pi.PID, pi.Start
			l.user = s.led.names.name(pi.UID)
			s.log.Printf("npu %d is held by a lease from before this start with no record of its grant: held by pid %d (%s)", id, pi.PID, l.user)
		}
		rec := l.record("start")
		rec.Found = true
		s.led.usage.add(rec)
		l.logged = true
		s.adoptDevice(id, l)
	}
}

// maxFindScans bounds the scans findHolders does for the holders of the
// leases found at start.
const maxFindScans = 64

// adoptDevice makes held device id part of lease l: counted against its
// user's max_devices, released through the watcher as any other lease.
func (s *Server) adoptDevice(id int, l *ledgerEntry) {
	d := s.devs[id]
	s.led.leases[id] = l
	d.since = l.since
	if l.user != "" {
		d.leased, d.holder = true, l.uid
		s.held[l.uid]++
	}
}

func kindName(l *ledgerEntry) string {
	switch l.kind {
	case client.KindTask:
		return fmt.Sprintf("task %d", l.task)
	case client.KindHeld:
		return "grant unknown"
	}
	return l.kind
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
