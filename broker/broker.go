// Package broker is the npubroker daemon: it owns the device locks, queues
// the requests and hands out leases. It is only what runs in npubroker: the
// listener, the peer's identity (SO_PEERCRED, its one source), the
// protocol's handlers (decode, call a room, answer), device access, and the
// wiring of its rooms, whose locks it takes in the order written on Server.
// No other program may import it or a package under it.
package broker

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/leaseend"
	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/broker/slurmjobs"
	"github.com/npurun/npurun/broker/status"
	"github.com/npurun/npurun/broker/tasks"
	"github.com/npurun/npurun/broker/tasks/local"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/wire"
	_ "github.com/npurun/npurun/wire/jsoncodec" // messages beyond the lease exchange
)

// Defaults of a production install.
const (
	DefaultRunDir = "/run/npurun"
	DefaultConfig = "/etc/npurun/npurun.conf"
)

// DrainFile is the file of the state directory that keeps the drained
// devices across restarts (lease.Config.DrainFile).
const DrainFile = "drained.json"

// progressDelay is how long position updates are gathered before they are
// sent, so that a burst of grants costs one update per waiter, not one per
// grant.
const progressDelay = 50 * time.Millisecond

// Options configure a Server.
type Options struct {
	Config *policy.Config
	// ConfigPath is the file Config was read from, read again by a
	// reload (SIGHUP, npubroker reload); "" refuses reloads.
	ConfigPath string
	Inventory  *npu.Inventory
	RunDir     string // lock files go to RunDir/locks
	StateDir   string // the task spool; "" for the config's
	Socket     string // the socket path, told to tasks and their supervisors
	Cgroup     string // where tasks' control groups go; "" for the config's ([tasks] cgroup)
	Self       string // the broker's executable, beside which npurun-supervise is looked for first; "" for this program
	Log        *log.Logger
}

// Server is a running broker: the wiring of its rooms and the protocol
// handlers.
//
// Lock order, where two locks are held together: the status room's
// refreshMu, then the task room's (a look at the holders asks the tasks
// for supervisors: taskView); Server.mu, then the task room's (package
// tasks: the broker serves the line under Server.mu, and the room starts
// the tasks among its grants); Server.mu or the task room's, then the
// Slurm room's (package slurmjobs, on a Slurm node: a waiting task's
// reason is Slurm's placeholder's); any of those, then the lease table's
// (package lease); any of those, then access.mu (a grant opens its
// devices, a task's end closes them); any, then accounts.mu. The status
// room's mu or its limitMu (the broker tells it of grants and changes:
// status.Ledger's Started, Changed; the two never together) comes after
// all of these: the status room calls no room holding it, and reads the
// table and the tasks (tableView, taskView) holding none of its own. The
// lease table calls the broker (tableOwner) and its gate (access) holding
// no lock of its own, the Slurm room calls the broker (slurmOwner)
// holding none of its own, and the task room calls the broker
// (taskRoomOwner, a connection waiting for a task's end) holding none of
// its own, so no room's lock is ever held under one that comes after it
// here; a release goes from the table to the status room (Ended) without
// Server.mu. A request that is not to wait lets Server.mu go while it
// waits for the lease ends under way (awaitEndsLocked): their watchers
// take it to serve the line. The task room's journal (package tasks/journal) and its
// runner share its lock. TestRoomsLockOrder runs all of them at once under -race.
type Server struct {
	// cfg is the policy, read without a lock (policy) and replaced, never
	// changed, by a reload (reload.go), which hands each room its copy.
	cfg     atomic.Pointer[policy.Config]
	cfgPath string   // the configuration file a reload reads; "" for none
	flagged struct { // what the command line set over the file's [tasks] (Options): a reload leaves them be
		stateDir, cgroup bool
	}
	runDir string     // where the session-policy file goes
	reload sync.Mutex // one reload at a time; taken before every other lock, and never under one
	// healthWake tells watchHealth that a reload may have changed
	// [devices] health_interval (a send that never waits).
	healthWake chan struct{}
	// utilWake tells the utilization sampling that a reload may have
	// changed [status] util_interval or [devices] fake_util.
	utilWake chan struct{}
	// capacityAsk tells askCapacities that a share request came that a
	// device whose memory is not known yet could serve (a send that
	// never waits: the lease table's Config.Ask).
	capacityAsk chan struct{}

	inv   *npu.Inventory
	log   *log.Logger
	rlog  *rateLog // log, for lines that a lasting cause repeats (lograte.go)
	users accounts

	table  *lease.Table   // the devices, their lock files, the line, caps and grants: its own lock
	acc    *access        // device access of restricted accounts (access.go), the table's gate: its own lock
	tasks  *tasks.Room    // the tasks: their journal, line, start and end; its own lock
	status *status.Ledger // what status reports: the ledger, holders, the scan, usage, metrics; its own lock

	scanner *procscan.Scanner // reads /proc: for the status room, and for the ender
	ender   *leaseend.Ender   // ends a lease when its holders end, whatever became of its descriptors

	// slurm is a Slurm node's room ([slurm]; slurm.go): its own lock,
	// after Server.mu's and the task room's; nil without [slurm].
	slurm *slurmjobs.Room

	stateClaim *os.File // held for the broker's life: no other broker replays this spool

	// limits are the timers of the leases with time limits (timelimit.go),
	// stopped when the lease ends: a timer of a century is not kept for a
	// lease gone a second after its start.
	limitsMu sync.Mutex
	limits   map[*lease.Lease]*time.Timer

	mu         sync.Mutex
	places     []lease.Place // the line, as the last progress report read it (reused)
	conns      int
	fdKeep     int         // descriptors kept from connections (fdlimit.go), set once by New
	nofile     nofileCache // RLIMIT_NOFILE, as last read
	userConns  map[uint32]int
	connsOf    map[uint32]map[*conn]struct{} // each user's connections
	unread     map[uint32]int                // bytes each user's connections left unread, as last seen
	leaseWaits map[uint32]int                // waiting npurun requests per uid
	// byPlaceholder: the connection of each npurun granted a lease
	// through a placeholder allocation (allocate mode), by its Slurm job,
	// while it stays open: told when Slurm ends the job (slurmOwner.End)
	byPlaceholder map[uint32]*conn
	pending       bool        // a progress report is arranged ...
	progressAt    time.Time   // ... for then,
	progressTimer *time.Timer // by this timer

}

// New prepares a broker: the lock directory, the lock files, and the
// occupancy found in them (a device whose lock is held stays held).
func New(o Options) (*Server, error) {
	if o.Log == nil {
		o.Log = StderrLog(os.Stderr)
	}
	s := &Server{
		inv:           o.Inventory,
		log:           o.Log,
		rlog:          &rateLog{log: o.Log},
		userConns:     map[uint32]int{},
		connsOf:       map[uint32]map[*conn]struct{}{},
		unread:        map[uint32]int{},
		leaseWaits:    map[uint32]int{},
		byPlaceholder: map[uint32]*conn{},
		limits:        map[*lease.Lease]*time.Timer{},
		cfgPath:       o.ConfigPath,
		healthWake:    make(chan struct{}, 1),
		utilWake:      make(chan struct{}, 1),
		runDir:        o.RunDir,
	}
	s.capacityAsk = make(chan struct{}, 1)
	s.cfg.Store(o.Config)
	s.acc = newAccess(s)
	var err error
	if s.scanner, err = procscan.New("/proc", os.Getpid()); err != nil {
		return nil, fmt.Errorf("read /proc: %w", err)
	}
	self := o.Self
	if self == "" {
		if self, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("find own executable: %w", err)
		}
	}
	pools := tablePools(s.policy(), s.inv.IDs)
	lockDir := filepath.Join(o.RunDir, "locks")
	var external chan struct{} // the Slurm room's, in allocate mode
	if s.policy().Slurm.Active() && s.policy().Slurm.Mode == policy.ModeAllocate {
		external = make(chan struct{}, 1)
	}
	s.flagged.stateDir, s.flagged.cgroup = o.StateDir != "", o.Cgroup != ""
	stateDir := o.StateDir
	if stateDir == "" {
		stateDir = o.Config.Tasks.StateDir
	}
	capacity, unknown := s.shareCapacities(pools)
	if s.table, err = lease.Open(lease.Config{
		Dir: lockDir, IDs: s.inv.IDs, Pools: pools, DefaultPool: s.policy().DefaultPool,
		Vendor: s.inv.Vendor, Gate: s.acc, Owner: (*tableOwner)(s), Log: s.log, Repeat: s.rlog.Printf, External: external,
		DrainFile: filepath.Join(stateDir, DrainFile), Capacity: capacity, Unknown: unknown, Ask: s.capacityAsk,
	}); err != nil {
		return nil, err
	}
	s.table.SetBackfill(s.policy().Scheduling.Backfill)
	if s.inv.Note != "" {
		s.log.Print(s.inv.Note)
	}
	// Device access: a free device's node is cleaned before the device
	// is put in service, and one whose node cannot be is not, until it
	// is.
	found := s.table.Found()
	shared := map[int]bool{} // shares found held: their users' entries stay
	for _, d := range s.table.Snapshot().Devices {
		shared[d.ID] = len(d.Leases) > 0
	}
	var free []int
	for _, id := range s.inv.IDs {
		if _, held := found[id]; !held && !shared[id] {
			free = append(free, id)
		}
	}
	failed := s.acc.start(free)
	if err := s.writeSessionPolicy(o.RunDir); err != nil {
		return nil, err
	}
	cgMode := o.Cgroup
	if cgMode == "" {
		cgMode = o.Config.Tasks.Cgroup
	}
	// The state directory is this broker's for its life: the journal and
	// the accounting log are read and written by one broker only. A
	// directory that cannot be had now leaves leases served (tasks try again).
	if err := s.claimState(stateDir); errors.Is(err, ErrClaimed) {
		return nil, err
	}
	if err := s.openSlurm(stateDir, lockDir, []string{"SLURM_CONF=" + os.Getenv("SLURM_CONF")}, external); err != nil {
		return nil, err
	}
	s.status = status.Open(status.Config{Policy: s.policy(), Inventory: s.inv, StateDir: stateDir, Scanner: s.scanner,
		Table: (*tableView)(s), Tasks: (*taskView)(s), Account: s.users.nameGroups, Log: s.log, Repeat: s.rlog.Printf,
		Jobs: s.slurmJobs(), Idle: (*idleOwner)(s)}, found, s.table)
	s.closeToSharers()
	// The task room, before the table is in service: a device that comes
	// into service serves the line, tasks' and all.
	s.ender = leaseend.New(leaseend.Config{Table: s.table, Access: s.acc, Holders: s.scanner, Vendor: s.inv.Vendor,
		Describe: s.describeHolder, Grace: func() time.Duration { return s.policy().Tasks.KillGrace }, Log: s.log})
	tc := tasks.Config{
		Policy: s.policy(), Inventory: s.inv, Table: s.table, Owner: (*taskRoomOwner)(s), Accounts: taskAccounts{&s.users},
		Ender: s.ender, Socket: o.Socket, Claim: s.claimTasks, Log: s.log,
		// The local runner: supervisors on this machine.
		Runner: func(h tasks.Host) tasks.Runner { return local.New(h, self, cgMode, s.log) },
	}
	tc.DevicePeak = func(id uint64) int64 { return s.status.TaskPeak(id) }
	if s.slurm != nil {
		tc.Outside = (*slurmOutside)(s) // Slurm's devices, its placeholders' reasons
	}
	s.tasks = tasks.New(tc)
	s.table.Start(failed)
	s.followAdopted()
	if s.slurm != nil {
		s.slurm.Resume((*slurmOwner)(s))
	}
	if err := s.tasks.Open(stateDir); err != nil {
		return nil, err
	}
	s.fdReserve()
	return s, nil
}

// followAdopted follows, at start, each lease taken up from before it
// that a process tree holds (an npurun's, a login's, a container's, one
// found with no record), as grantLocked follows those it grants: it ends
// once its holders are gone, whatever became of its descriptors, or at
// its time limit (the accounting log keeps it). A task's ends with the
// task, a Slurm job's with the job.
func (s *Server) followAdopted() {
	var done []*lease.Lease
	for _, d := range s.table.Snapshot().Devices {
		for _, l := range d.Leases {
			if !l.Adopted || slices.Contains(done, l) {
				continue
			}
			done = append(done, l)
			switch l.Kind {
			case lease.Inline, lease.Login, lease.Container, lease.Found:
				s.ender.Follow(l)
				if l.Limit > 0 { // npurun --time: its limit runs on (a task's is its supervisor's)
					s.armTimeLimit(l, max(l.Limit-s.policy().Tasks.KillGrace, 0))
				}
			}
		}
	}
}

// closeToSharers closes, at start, each device that holds shares found
// from before it to all but their users, once the accounting log has
// named them (status.Open): a share that ended while no broker ran left
// its user's entry, which no end to come would take, as the device's next
// share end might be far off. A device with a share whose holder is not
// known keeps its entries as they are, rather than take one from a share
// held; so does one of a whole lease, until its end. It is called before
// the table is in service, holding no lock.
func (s *Server) closeToSharers() {
	for _, d := range s.table.Snapshot().Devices {
		var keep []uint32
		known := len(d.Leases) > 0
		for _, l := range d.Leases {
			if l.Mem == 0 || l.User == "" {
				known = false
				break
			}
			keep = append(keep, l.UID)
		}
		if !known {
			continue
		}
		s.acc.startShared(d.ID, keep)
	}
}

// tableOwner is the broker as the lease table's owner: what the table
// tells it, it hears holding no lock of the table's.
type tableOwner Server

// Released records the end of lease l on device id in the status room
// (the ledger, the accounting log), which knows itself which devices of l
// are held, and takes an end heard before the lease's start (Started, under
// Server.mu) as well: Server.mu is not needed. The Slurm room hears of it
// after.
func (o *tableOwner) Released(l *lease.Lease, id int, at time.Time, last bool) {
	o.status.Ended(l, id, at)
	if last {
		o.ender.Released(l) // its follow ends
		(*Server)(o).stopTimeLimit(l)
	}
	if o.slurm != nil {
		o.slurm.Released(l, id, last)
	}
}

// Freed serves the line: a device came into service. The tasks it grants
// are launched here, on the table's goroutine that freed the device: a
// goroutine started for the launch would cost a wake-up on the path from
// a lease's end to the next task's start (tasks.Room.Schedule).
func (o *tableOwner) Freed() {
	s := (*Server)(o)
	if s.slurm != nil {
		s.slurm.Freed() // a job's Prolog may wait for the device
	}
	s.mu.Lock()
	starts := s.serveLocked(true)
	s.mu.Unlock()
	s.tasks.Launch(starts)
}

// Listen opens the broker's socket at path. A socket file left by a broker
// that is gone is replaced; one that answers is an error.
func Listen(path string) (*net.UnixListener, error) {
	if answers(path) {
		return nil, fmt.Errorf("listen %s: another broker is serving there", path)
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err == nil {
		if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			return nil, fmt.Errorf("listen %s: exists and is not a socket", path)
		}
		if err := unix.Unlink(path); err != nil {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	// Everyone may connect: identity comes from SO_PEERCRED and the
	// policy decides what each user gets. The mode is set by the umask at
	// bind, not by a chmod of the path afterwards, which would follow
	// whatever the path names by then. (The broker starts no other thread
	// that creates files while it listens.)
	old := unix.Umask(0o111)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	return ln, nil
}

// staleWait is how long a broker that accepts a connection has to answer
// a ping before its socket counts as stale.
const staleWait = time.Second

// answers tells whether a broker serves at path. A connection alone does
// not tell: a process the dead broker was starting can hold its listening
// socket for a moment after it died, accepting nothing.
func answers(path string) bool {
	c, err := wire.Dial(path)
	if err != nil {
		return false
	}
	defer c.Close()
	if c.Send(&wire.Request{Op: wire.OpPing}) != nil {
		return false
	}
	r, _, err := c.Recv(staleWait)
	return err == nil && r.Type == wire.TypePong
}

// Serve accepts connections until ctx is done.
func (s *Server) Serve(ctx context.Context, ln *net.UnixListener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	s.status.ServeMetrics(ctx)
	hctx, endHealth := context.WithCancel(ctx)
	defer endHealth()
	go s.watchHealth(hctx)                  // [devices] health_interval
	go s.status.WatchUtil(hctx, s.utilWake) // [status] util_interval
	go s.askCapacities(hctx)                // a shared device's memory the vendor's tool could not say at start
	defer s.status.Stop()                   // every lease it knows in the accounting log, written
	defer s.tasks.Close(time.Second)        // a broker that stops leaves no idle supervisor
	defer s.tasks.Stop()                    // nor a task armed
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("accept: %w", err)
			}
			// Out of descriptors, a client gone before it was accepted:
			// the broker serves on.
			s.rlog.Printf("accept: %v", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		s.handle(c) // on this goroutine as far as it is quick
	}
}

// policy is the configuration in force: the one read at start, or the
// last a reload took.
func (s *Server) policy() *policy.Config { return s.cfg.Load() }
