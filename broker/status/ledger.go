package status

import (
	"fmt"
	"log"
	"maps"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/broker/slurmjobs"
	"github.com/npurun/npurun/internal/fileid"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/wire"
)

// What status knows of each lease, beside the lease table's record of its
// grant (lease.Lease: who it was granted to, kind, user, the pid from
// SO_PEERCRED, task id, login session, when, and which lock files it
// holds): who /proc shows holding it now. Status joins the two, and where
// they disagree /proc wins and the broker says so in its log. Starts and
// ends go to the accounting log (usage.go). The ledger follows the table:
// a lease is entered as it is granted (Started) or adopted, and its
// devices leave as the table reports them released (Ended), in whichever
// order those two reach the ledger.

// Table is what the ledger reads of the lease table: copies, taken under
// the table's lock, which the ledger never holds its own around.
type Table interface {
	// Snapshot copies the devices, their leases and reservations, and
	// the line with places and reasons.
	Snapshot() lease.Snapshot
	// Reason says why w waits beyond its turn (its user's cap), if it
	// does.
	Reason(w *lease.Waiter) string
	// SetExternal tells the table what processes outside any lease use
	// of device id, in MiB, to count against its room for shares.
	SetExternal(id int, mib int64)
}

// Tasks is what the ledger reads of the tasks: read-only, each call
// under the task room's own lock, which the ledger never holds its own
// around.
type Tasks interface {
	// Supervisor is the pid and start time of task id's supervisor, zero
	// while it has none: the process its lease is held by.
	Supervisor(id uint64) (pid int, start uint64)
	// Counts counts the tasks by state, as clients see the states.
	Counts() map[string]int
	// CPULine is the line of tasks that need no device, waiting for a
	// CPU slot: the first max of them in service order, and how many
	// wait.
	CPULine(max int) (first []*lease.Waiter, n int)
}

// Jobs is what the ledger asks a Slurm node's room (broker/slurmjobs) at
// start, of held devices the accounting log does not know.
type Jobs interface {
	// Adoptable returns the leases of the jobs whose records name the
	// held lock files (held: device id -> its held lock file); poolOf
	// names a device's pool.
	Adoptable(held map[int]fileid.ID, poolOf func(int) string) []*lease.Lease
	// JobUser asks Slurm whose job id is.
	JobUser(id uint32) (uid uint32, user string, err error)
}

// Adopter takes up, at start, the leases held from before (the lease
// table, before it is in service): the ledger tells it the lease ids its
// log used, asks it for new ones, and hands it each lease it adopts.
type Adopter interface {
	NoteID(id uint64)
	NewID() uint64
	PoolOf(id int) string
	Adopt(l *lease.Lease) error
	// AdoptShare puts l, the record of a share found held at start
	// (Snapshot's found), in found's place: same device, file and
	// declaration, and who holds it as the accounting log says.
	AdoptShare(found, l *lease.Lease) error
}

// Config configures a Ledger.
type Config struct {
	Policy    *policy.Config    // [status], [usage], the pools, [broker] metrics_listen
	Inventory *npu.Inventory    // the devices and the nodes watched for unleased use
	StateDir  string            // where the accounting log goes unless [usage] log names a file
	Scanner   *procscan.Scanner // reads /proc
	Table     Table
	Tasks     Tasks
	Jobs      Jobs // a Slurm node's jobs; nil without [slurm]
	// Account looks uid up in the user database (for [restrict] and the
	// exempt accounts of unleased use); known is false for an account
	// the database does not know.
	Account func(uid uint32) (name string, groups []string, known bool)
	Log     *log.Logger
	// Repeat logs a line that a lasting cause repeats, at a bounded rate.
	Repeat func(format string, args ...any)
	// Idle acts on leases idle past [idle] after (idle.go); nil: they
	// are only reported.
	Idle IdleOwner
}

// Ledger is the status room.
//
// Lock order: refreshMu, then the task room's lock (a look at the holders
// asks Tasks for supervisors), then mu; any other room's lock, then mu or
// limitMu (the broker tells the ledger of grants holding its own). mu and
// limitMu are never held together, and always last: the ledger calls no
// other room, no log and no system call that may wait while it holds
// either (log lines said under mu wait in notes until it is let go:
// unlock).
type Ledger struct {
	// cfg is the policy: replaced, never changed, by SetPolicy.
	cfg atomic.Pointer[policy.Config]

	// Set by Open, never changed.
	inv       *npu.Inventory
	log       *log.Logger
	repeat    func(format string, args ...any)
	table     Table
	tasks     Tasks
	account   func(uid uint32) (string, []string, bool)
	idle      IdleOwner           // acts on the [idle] policy's judgements; nil: none
	scanner   *procscan.Scanner   // safe for concurrent use
	usage     *usageLog           // the accounting log: a writer goroutine of its own
	nodes     map[uint64]npu.Node // the device and control nodes watched, by device number
	metrics   *metrics
	metricsLn net.Listener  // [broker] metrics_listen, nil when off
	kick      chan struct{} // asks the background scan for a scan soon
	names     nameCache     // uid -> user name: its own lock

	refreshMu sync.Mutex // one look at the holders at a time

	// limitMu guards logLimit alone, the accounting log's limit on lease
	// records per user (usagelimit.go): a grant's start goes to the log
	// without a wait for mu. Taken alone.
	limitMu  sync.Mutex
	logLimit logLimit

	mu        sync.Mutex
	leases    map[int]*entry           // by device id, while held: whole leases
	shares    map[int][]*entry         // by device id, while held: the shares of a device (lease.Lease.Mem), in grant order
	extSeen   map[int]map[int]bool     // device -> pid: the processes outside any lease the last scan saw on a shared device (memory.go)
	extSet    map[int]int64            // device -> MiB: what the table was told of outside use
	capacity  map[int]int64            // device -> what its shares may declare, MiB: from Open's snapshot
	taskPeaks map[uint64]int64         // task id -> the peak of its share, once ended (memory.go)
	early     map[*lease.Lease][]ended // ends heard before their lease's start (Ended)
	refreshed time.Time                // when the holders were last looked at
	notes     []string                 // log lines said under mu, logged by unlock

	// the background scan (scan.go)
	lastScan   *scanInfo
	seen       map[useKey]*use       // device nodes used without a lease, by process and node
	streaks    map[streakKey]*streak // how long each account's use of a node has gone on
	lastJudged time.Time             // the start of the last scan judged
	reported   []*use                // those past the grace window, as status shows them

	// watchers (board.go)
	gen     uint64
	changed chan struct{} // closed at the next change; nil while nobody waits

	// the leases past their user's limit, summed (usagelimit.go)
	sums usageSums

	containers containerNames // container id -> its name, as the runtime told (containers.go)

	// the last utilization sample (util.go)
	util     map[int]npu.Util // the devices the tool answered for
	utilErr  map[int]string   // why it did not, for the others
	utilAt   time.Time        // when; zero before the first
	utilNone bool             // the vendor's tool is not there: nothing sampled

	// the figures kept across a restart (utilstate.go): the sampling's
	// alone, no lock
	utilPath  string // the file; "" without a state directory
	utilSaved []byte // what it holds, its time left out; nil: unknown
}

// entry is one grant while any of its devices is held.
type entry struct {
	*lease.Lease              // the table's record of the grant
	pid          int          // the process granted it; for a task, its supervisor once known
	pidStart     uint64       // against pid reuse: taken when /proc first shows it holding the lease; 0 until then
	files        []fileid.ID  // the lease's lock files, in the order of its devices
	held         map[int]bool // devices not yet released
	logged       bool         // its start is in the accounting log; else it is summed (usagelimit.go)

	holders map[int][]*procscan.Proc // per device: who /proc shows holding it, from the last look
	who     map[uint32]string        // the names of the holders' users, as looked up with them
	checked time.Time                // when that look was
	said    map[string]bool          // disagreements already logged

	// the container holding it: its grant's, or the runtime's word, which
	// re-kinds an inline lease (contained; containers.go)
	container *wire.ContainerRef
	contained bool
	// containerPID is the container's first process, as root's runtime
	// told it once runc had made it: where Refresh looks for the lease's
	// holders at once, the process granted the lease (npurun, the
	// runtime) being gone; 0 where not told.
	containerPID int

	mem *memUse // a share's use of its device's memory, as the vendor's tool showed it (memory.go)

	util *leaseUtil // what the utilization samples said of it (util.go); nil before the first
}

// ended is a device's end heard before its lease's start.
type ended struct {
	id int
	at time.Time
}

// maxEarly bounds the leases whose ends wait for their starts: a lease is
// started by the broker right after the table commits it, so there are
// only ever a few.
const maxEarly = 4096

// newEntry is the ledger's entry for lease l, its devices all held.
func newEntry(l *lease.Lease) *entry {
	e := &entry{Lease: l, pid: l.PID, pidStart: l.PIDStart, held: make(map[int]bool, len(l.Devices)), container: l.Container}
	for i, id := range l.Devices {
		e.held[id] = true
		if i < len(l.Files) {
			e.files = append(e.files, l.Files[i])
		}
	}
	return e
}

// kind is e's kind as the wire and the accounting log name it.
func (e *entry) kind() string {
	if e.contained {
		return wire.KindContainer
	}
	return string(e.Kind)
}

// fileOf returns the lock file of device id in e.
func (e *entry) fileOf(id int) (fileid.ID, bool) {
	if i := slices.Index(e.Devices, id); i >= 0 && i < len(e.files) {
		return e.files[i], true
	}
	return fileid.ID{}, false
}

// Open prepares the ledger: the device nodes to watch, the metrics
// endpoint, the accounting log (read back for the leases still open), and
// the leases found held at start (held: device id -> its held lock file),
// each taken up by adopter. It returns once every held device has its
// lease adopted or recorded as found, with the accounting log's writer,
// the background scan and the sums' writer started.
func Open(c Config, held map[int]fileid.ID, adopter Adopter) *Ledger {
	g := &Ledger{inv: c.Inventory, log: c.Log, repeat: c.Repeat, table: c.Table, tasks: c.Tasks,
		account: c.Account, idle: c.Idle, scanner: c.Scanner, nodes: map[uint64]npu.Node{}, kick: make(chan struct{}, 1),
		leases: map[int]*entry{}, shares: map[int][]*entry{}, early: map[*lease.Lease][]ended{}, seen: map[useKey]*use{},
		streaks: map[streakKey]*streak{}, logLimit: logLimit{}, sums: usageSums{}}
	g.cfg.Store(c.Policy)
	if g.repeat == nil {
		g.repeat = g.log.Printf
	}
	g.metrics = newMetrics(g)
	g.listenMetrics()
	nodes, notes := g.inv.WatchNodes()
	for _, note := range notes {
		g.log.Print(note)
	}
	for _, nd := range nodes {
		g.nodes[nd.Number] = nd
	}

	path := usagePath(g.policy().Usage.Log, c.StateDir)
	if g.policy().Usage.Log != "" {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			g.log.Printf("usage log %s: %v", path, err)
		}
	}
	g.usage = newUsageLog(path, g.policy().Usage.MaxSize, g.policy().Usage.Keep, g.log, g.openRecords)
	recs, err := readUsage(path)
	if err != nil {
		g.log.Printf("usage log: %v; leases held from before this start are recorded as found", err)
	}
	for _, r := range recs {
		adopter.NoteID(r.Lease)
	}
	g.adoptLeases(openLeases(recs), held, adopter, c.Jobs)
	g.utilPath = utilStatePath(c.StateDir)
	g.restoreUtil(g.utilPath)
	g.capacity = map[int]int64{}
	for _, d := range g.table.Snapshot().Devices {
		if d.Capacity > 0 {
			g.capacity[d.ID] = d.Capacity
		}
	}
	go g.usage.run()
	go g.sumLoop()
	go g.scanLoop()
	return g
}

// unlock lets mu go, then logs what was said under it.
func (g *Ledger) unlock() {
	notes := g.notes
	g.notes = nil
	g.mu.Unlock()
	for _, n := range notes {
		g.log.Print(n)
	}
}

// sayLocked logs a line once mu is let go.
func (g *Ledger) sayLocked(format string, args ...any) {
	g.notes = append(g.notes, fmt.Sprintf(format, args...))
}

// Started records lease l, just begun by handover h (its grant
// delivered): the accounting log, the metrics, the ledger. The caller may
// hold its own room's lock. The start is queued for the log before the
// ledger's lock is taken: the holder has its grant by now, and its start
// waits for nothing the ledger does (a scan's results taken in, a board).
func (g *Ledger) Started(l *lease.Lease, h *lease.Handover) {
	e := newEntry(l)
	now := l.Since
	waited := now.Sub(h.W.Queued)
	g.limitMu.Lock()
	logged := g.logLimit.allow(l.UID, now)
	g.limitMu.Unlock()
	if logged {
		rec := e.record("start")
		rec.WaitedMS = waited.Milliseconds()
		g.usage.add(rec)
		e.logged = true
	}
	g.metrics.granted(e.kind(), waited)
	for i := range l.Devices {
		if at := h.Freed(i); !at.IsZero() && h.W.Queued.Before(at) {
			g.metrics.handoff(now.Sub(at))
		}
	}
	g.mu.Lock()
	defer g.unlock()
	ends := g.early[l]
	delete(g.early, l)
	for _, id := range l.Devices {
		if !slices.ContainsFunc(ends, func(x ended) bool { return x.id == id }) {
			g.putLocked(id, e)
		}
	}
	for _, x := range ends {
		g.endLocked(e, x.id, x.at)
	}
	g.refreshed = time.Time{} // the next status looks at the new lease's holders
	g.changedLocked()
}

// Ended records that device id of lease l was released at at: the lease
// table's watcher saw the lock go. It may come before the lease's start
// (Started): the end then waits for it.
func (g *Ledger) Ended(l *lease.Lease, id int, at time.Time) {
	g.mu.Lock()
	defer g.unlock()
	e := g.heldLocked(id, l)
	if e == nil {
		if len(g.early) < maxEarly || g.early[l] != nil {
			g.early[l] = append(g.early[l], ended{id: id, at: at})
		}
		return
	}
	g.endLocked(e, id, at)
}

// endLocked records the end of device id of e at now.
func (g *Ledger) endLocked(e *entry, id int, now time.Time) {
	g.dropLocked(id, e)
	delete(e.held, id)
	g.notePeakLocked(e)
	if e.logged {
		rec := usageRec{T: now.UnixMilli(), Ev: "end", Lease: e.ID, Device: &id, How: endReleased, DurMS: now.Sub(e.Since).Milliseconds()}
		if e.mem != nil {
			rec.Peak = e.mem.peak
		}
		rec.Util, rec.IdleMS = e.util.figures()
		if e.util != nil && !e.util.idle.reclaimed.IsZero() {
			rec.How = endReclaimed
		}
		g.usage.add(rec)
	} else {
		g.sums.add(e, now)
	}
	g.changedLocked()
}

// record is e as a line of the accounting log.
func (e *entry) record(ev string) usageRec {
	r := usageRec{T: e.Since.UnixMilli(), Ev: ev, Lease: e.ID, Kind: e.kind(), User: e.User, UID: e.UID, Pool: e.Pool,
		Devices: e.Devices, Task: e.Task, PID: e.pid, PIDStart: e.pidStart, Service: e.Service, TTY: e.TTY, RHost: e.RHost, Claimed: e.Claimed,
		SlurmJob: e.SlurmJob, Container: e.container, Mem: e.Mem, Share: e.Share, Backfill: backfillInfo(e.Lease), LimitMS: e.Limit.Milliseconds()}
	for _, f := range e.files {
		r.FSDev = f.Dev
		r.Inodes = append(r.Inodes, f.Ino)
	}
	return r
}

// entryLocked is the ledger's entry of lease l while any of its devices
// is held; nil once none is.
func (g *Ledger) entryLocked(l *lease.Lease) *entry {
	for _, id := range l.Devices {
		if e := g.heldLocked(id, l); e != nil {
			return e
		}
	}
	return nil
}

// heldLocked is the entry of lease l on device id: its whole lease or one
// of its shares; nil if l holds it not (or no more).
func (g *Ledger) heldLocked(id int, l *lease.Lease) *entry {
	if e := g.leases[id]; e != nil && e.Lease == l {
		return e
	}
	for _, e := range g.shares[id] {
		if e.Lease == l {
			return e
		}
	}
	return nil
}

// putLocked records e as held on device id: its whole lease, or a share.
func (g *Ledger) putLocked(id int, e *entry) {
	if e.Mem > 0 {
		if !slices.Contains(g.shares[id], e) {
			g.shares[id] = append(g.shares[id], e)
		}
		return
	}
	g.leases[id] = e
}

// dropLocked records that e holds device id no more.
func (g *Ledger) dropLocked(id int, e *entry) {
	if g.leases[id] == e {
		delete(g.leases, id)
	}
	if i := slices.Index(g.shares[id], e); i >= 0 {
		if g.shares[id] = slices.Delete(g.shares[id], i, i+1); len(g.shares[id]) == 0 {
			delete(g.shares, id)
		}
	}
}

// holdsLocked tells whether e holds device id, whole or as a share.
func (g *Ledger) holdsLocked(id int, e *entry) bool {
	return g.leases[id] == e || slices.Contains(g.shares[id], e)
}

// FirstHolder notes process pid, started at start, as lease l's first
// holder, where a look at its holders looks first (a Slurm job's extern
// step, which holds the job's lease), and has the next status look again.
func (g *Ledger) FirstHolder(l *lease.Lease, pid int, start uint64) {
	g.mu.Lock()
	defer g.unlock()
	if e := g.entryLocked(l); e != nil {
		e.pid, e.pidStart = pid, start
		g.refreshed = time.Time{}
	}
}

// Holders returns the processes that the last look at lease l's holders
// showed holding its devices (copies); none once the ledger holds it no
// more.
func (g *Ledger) Holders(l *lease.Lease) []procscan.Proc {
	g.mu.Lock()
	defer g.unlock()
	var out []procscan.Proc
	if e := g.entryLocked(l); e != nil {
		for _, id := range e.Devices {
			for _, h := range e.holders[id] {
				out = append(out, *h)
			}
		}
	}
	return out
}

// openRecords are the "open" records of the leases held now, for a fresh
// accounting log.
func (g *Ledger) openRecords() []usageRec {
	g.mu.Lock()
	defer g.unlock()
	var out []usageRec
	for _, e := range g.uniqueLocked() {
		e.logged = true // its end goes to the log now, to close this record
		r := e.record("open")
		// Only the devices still held: the others have their ends.
		r.Devices, r.Inodes = nil, nil
		for i, id := range e.Devices {
			if e.held[id] {
				r.Devices = append(r.Devices, id)
				r.Inodes = append(r.Inodes, e.files[i].Ino)
			}
		}
		out = append(out, r)
	}
	return out
}

// uniqueLocked returns each held lease once, by its first device.
func (g *Ledger) uniqueLocked() []*entry {
	var out []*entry
	for _, id := range g.inv.IDs {
		if e := g.leases[id]; e != nil && !slices.Contains(out, e) {
			out = append(out, e)
		}
		for _, e := range g.shares[id] {
			if !slices.Contains(out, e) {
				out = append(out, e)
			}
		}
	}
	return out
}

// adoptLeases takes up, at start, the leases held from before: a held
// device whose lock file is one that an open lease of the log names goes
// on as that lease (holders, max_devices, the log); a held device the log
// does not know becomes a lease found now, of whoever /proc shows holding
// it, unless it is a Slurm job's (jobs). An open lease whose devices are free by now ended while the broker
// was down: its ends are written with the time it was found gone. Each
// lease is adopted by the lease table, which releases it through its
// watchers as any other. held maps device ids to their held lock file.
func (g *Ledger) adoptLeases(open map[uint64]*openLease, held map[int]fileid.ID, a Adopter, jobs Jobs) {
	now := time.Now()
	byFile := map[fileid.ID]*openLease{}
	for _, ol := range open {
		for i, ino := range ol.rec.Inodes {
			if i < len(ol.rec.Devices) {
				byFile[fileid.ID{Dev: ol.rec.FSDev, Ino: ino}] = ol
			}
		}
	}
	adopted := map[uint64]*lease.Lease{}
	var order []*lease.Lease
	var unknown []int
	for _, id := range slices.Sorted(maps.Keys(held)) {
		fid := held[id]
		ol := byFile[fid]
		if fid == (fileid.ID{}) || ol == nil || !ol.held[id] || !slices.Contains(ol.rec.Devices, id) {
			unknown = append(unknown, id)
			continue
		}
		l := adopted[ol.rec.Lease]
		if l == nil {
			r := ol.rec
			l = &lease.Lease{ID: r.Lease, Pool: r.Pool, Since: time.UnixMilli(r.T), Adopted: true, Holder: r.holder()}
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
		g.adopt(e, a)
		for _, id := range l.Devices {
			g.log.Printf("npu %d: lease of %s (%s) from before this start goes on", id, l.User, kindName(e))
		}
	}
	g.adoptShares(byFile, a) // before the ends of the leases gone: a share held is not
	for _, ol := range open {
		for _, id := range slices.Sorted(maps.Keys(ol.held)) {
			id := id
			g.usage.add(usageRec{T: now.UnixMilli(), Ev: "end", Lease: ol.rec.Lease, Device: &id, How: endGone,
				DurMS: now.UnixMilli() - ol.rec.T})
		}
	}
	if jobs != nil && len(unknown) > 0 {
		unknown = g.adoptJobs(unknown, held, a, jobs)
	}
	if len(unknown) > 0 {
		g.findHolders(unknown, held, now, a, jobs)
	}
}

// adoptJobs adopts the Slurm jobs' leases that the Slurm room's records
// name among the held devices ids the accounting log does not know (its
// records of their starts were summed or lost), and returns the devices
// left unknown.
func (g *Ledger) adoptJobs(ids []int, held map[int]fileid.ID, a Adopter, jobs Jobs) []int {
	unknown := map[int]fileid.ID{}
	for _, id := range ids {
		unknown[id] = held[id]
	}
	for _, l := range jobs.Adoptable(unknown, a.PoolOf) {
		e := newEntry(l)
		g.usage.add(e.record("start"))
		e.logged = true
		g.adopt(e, a)
		for _, id := range l.Devices {
			delete(unknown, id)
		}
	}
	return slices.Sorted(maps.Keys(unknown))
}

// findHolders makes a lease of each held device the log does not know,
// for whoever a scan of /proc shows holding it: a Slurm job's where that
// is the job's extern step (findJobs).
func (g *Ledger) findHolders(ids []int, held map[int]fileid.ID, now time.Time, a Adopter, jobs Jobs) {
	targets := procscan.Targets{Files: map[fileid.ID]bool{}}
	for _, id := range ids {
		if fid := held[id]; fid != (fileid.ID{}) {
			targets.Files[fid] = true
		}
	}
	// A sweep, not a scan: every process read to its end whatever the
	// background scan's budgets, so that a user's many descriptors
	// elsewhere do not hide a holder.
	res, err := g.scanner.Sweep(targets)
	if err != nil {
		g.log.Printf("find the holders of npu %s: %v", npu.FormatIDs(ids), err)
		return
	}
	if jobs != nil {
		ids = g.findJobs(ids, held, res, now, a, jobs)
	}
	for _, id := range ids {
		fid := held[id]
		if fid == (fileid.ID{}) {
			continue
		}
		l := &lease.Lease{ID: a.NewID(), Holder: lease.Holder{Kind: lease.Found}, Since: now, Adopted: true,
			Pool: a.PoolOf(id), Devices: []int{id}, Files: []fileid.ID{fid}}
		pids := res.Files[fid]
		if len(pids) == 0 {
			g.log.Printf("npu %d is held by a lease from before this start, and no process shows holding it", id)
		} else if pi := res.Info[pids[0]]; pi != nil {
			l.UID, l.PID, l.PIDStart = pi.UID, pi.PID, pi.Start
			l.User = g.names.name(pi.UID)
			g.log.Printf("npu %d is held by a lease from before this start with no record of its grant: held by pid %d (%s)", id, pi.PID, l.User)
			if ref := oneContainer(res, pids); ref != nil {
				l.Kind, l.Container = lease.Container, ref.Label()
			}
		}
		e := newEntry(l)
		rec := e.record("start")
		rec.Found = true
		g.usage.add(rec)
		e.logged = true
		g.adopt(e, a)
	}
}

// findJobs makes a Slurm job's lease of the held devices ids, neither
// the log nor the Slurm room's records know, whose holders (res) include
// the job's extern step (a root "slurmstepd: [N.extern]"), one lease per
// job; its user is the other holders', else Slurm's (squeue). It returns
// the devices left.
func (g *Ledger) findJobs(ids []int, held map[int]fileid.ID, res *procscan.Result, now time.Time, a Adopter, jobs Jobs) []int {
	var left []int
	found := map[uint32]*lease.Lease{}
	for _, id := range ids {
		fid := held[id]
		var job uint32
		var user, extern *procscan.Proc
		for _, pid := range res.Files[fid] {
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
		if fid == (fileid.ID{}) || job == 0 {
			left = append(left, id)
			continue
		}
		l := found[job]
		if l == nil {
			l = &lease.Lease{ID: a.NewID(), Holder: lease.Holder{Kind: lease.Slurm, SlurmJob: job, PID: extern.PID, PIDStart: extern.Start},
				Since: now, Adopted: true, Pool: a.PoolOf(id)}
			found[job] = l
		}
		l.Devices, l.Files = append(l.Devices, id), append(l.Files, fid)
		if user != nil && l.User == "" {
			l.UID, l.User = user.UID, g.names.name(user.UID)
		}
	}
	for _, job := range slices.Sorted(maps.Keys(found)) {
		l := found[job]
		if l.User == "" {
			uid, name, err := jobs.JobUser(job)
			if err != nil {
				g.log.Printf("job %d: its user: %v", job, err)
			}
			l.UID, l.User = uid, name
		}
		g.log.Printf("%s is held by job %d of %s, whose lease has no record: taken up as the job's", g.inv.Vendor.Format(l.Devices), job, l.User)
		e := newEntry(l)
		rec := e.record("start")
		rec.Found = true
		g.usage.add(rec)
		e.logged = true
		g.adopt(e, a)
	}
	return left
}

// adopt enters lease e, held since before this start, in the ledger, and
// has the lease table take it up: it counts against its user's
// max_devices, and is released through the table's watchers as any other.
// The ledger has it first, so that its end, whenever it comes, finds it.
func (g *Ledger) adopt(e *entry, a Adopter) {
	g.mu.Lock()
	for _, id := range e.Devices {
		g.leases[id] = e
	}
	g.unlock()
	if err := a.Adopt(e.Lease); err != nil {
		g.log.Print(err)
		g.mu.Lock()
		for _, id := range e.Devices {
			if g.leases[id] == e {
				delete(g.leases, id)
			}
		}
		g.unlock()
	}
}

func kindName(e *entry) string {
	switch e.kind() {
	case wire.KindTask:
		return fmt.Sprintf("task %d", e.Task)
	case wire.KindSlurm:
		return fmt.Sprintf("job %d", e.SlurmJob)
	case wire.KindHeld:
		return "grant unknown"
	}
	return e.kind()
}

// Name is the user name of uid, for log lines about its processes.
func (g *Ledger) Name(uid uint32) string { return g.names.name(uid) }

// lookupName is the name of uid in the user database, or "uid N".
func lookupName(uid uint32) string {
	if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
		return u.Username
	}
	return "uid " + strconv.FormatUint(uint64(uid), 10)
}

// nameTTL is how long a user name is kept.
const nameTTL = 30 * time.Second

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
	if ok && time.Since(e.at) < nameTTL {
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

// CommandLine writes a process's command line for people: its arguments,
// or its name in brackets as ps(1) does for a process without any.
func CommandLine(pi *procscan.Proc) string {
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

// policy is the configuration in force (SetPolicy).
func (g *Ledger) policy() *policy.Config { return g.cfg.Load() }

// SetPolicy takes up a reloaded configuration: [status] (the scan's
// interval and grace, who is exempt, whose commands are shown) and the
// pools the board and the metrics name, from the next look at them. What
// the room opened at start ([usage]'s log, [broker] metrics_listen) stays,
// which is why a reload refuses a change to them.
func (g *Ledger) SetPolicy(cfg *policy.Config) { g.cfg.Store(cfg) }
