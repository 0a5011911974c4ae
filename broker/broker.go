// Package broker is the npubroker daemon: it owns the device locks, queues the requests and hands out leases.
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
	"strings"
	"sync"
	"time"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/client"
	_ "github.com/npurun/npurun/broker/client/jsoncodec" // messages beyond the lease exchange
	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/broker/tasklife"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
)

// Defaults of a production install.
const (
	DefaultRunDir = "/run/npurun"
	DefaultConfig = "/etc/npurun/npurun.conf"
)

// progressDelay is how long position updates are gathered before they are
// sent, so that a burst of grants costs one update per waiter, not one per
// grant.
const progressDelay = 50 * time.Millisecond

// Options configure a Server.
type Options struct {
	Config    *policy.Config
	Inventory *npu.Inventory
	RunDir    string // lock files go to RunDir/locks
	StateDir  string // the task spool; "" for the config's
	Socket    string // the socket path, told to tasks and their supervisors
	Cgroup    string // where tasks' control groups go; "" for the config's ([tasks] cgroup)
	Log       *log.Logger
}

// Server is a running broker.
type Server struct {
	cfg   *policy.Config
	inv   *npu.Inventory
	locks string
	log   *log.Logger
	rlog  *rateLog // log, for lines that a lasting cause repeats (lograte.go)
	users accounts

	acc *access // device access of restricted accounts (access.go): its own lock

	pools  map[string][]int // pool name -> ids
	poolOf map[int]string   // device id -> pool name

	socket       string
	self         string         // this program, beside which npurun-supervise is looked for first
	supBin       *supervisorBin // npurun-supervise, open: every task runs under it (supervisorbin.go); nil until found
	unprivileged bool           // not root: tasks only for our own uid, no credential change
	proc         procfs.FS
	boot         string   // this boot's id, against pids of an earlier boot
	cpuSlots     []int    // ids of the CPU slots: 0..cpu_slots-1
	stateClaim   *os.File // held for the broker's life: no other broker replays this spool
	cg           *cgroups // where tasks' control groups go; nil: none (see cgroup.go)
	cgMode       string   // what was asked for: auto, off or a directory
	cgReady      bool     // cg was set up (once the state directory is ours)

	mu            sync.Mutex
	here          bool          // tasks granted are launched by the scheduler's caller (scheduleHereLocked)
	launches      []grantedTask // those tasks, meanwhile
	devs          []*device     // indexed by physical id; nil where not managed
	nfree         int
	held          map[uint32]int // devices held per uid, from this broker's grants
	q             *lease.Queue   // waiters for devices: leases and tasks
	conns         int
	fdKeep        int         // descriptors kept from connections (fdlimit.go), set once by New
	nofile        nofileCache // RLIMIT_NOFILE, as last read
	userConns     map[uint32]int
	connsOf       map[uint32]map[*conn]struct{} // each user's connections
	unread        map[uint32]int                // bytes each user's connections left unread, as last seen
	leaseWaits    map[uint32]int                // waiting npurun requests per uid
	pending       bool                          // a progress report is arranged ...
	progressAt    time.Time                     // ... for then,
	progressTimer *time.Timer                   // by this timer

	// Tasks: the table (nil while the journal cannot be opened, taskErr
	// says why) and, for each task not ended, what the broker holds.
	life      *tasklife.Life
	taskErr   error
	jobs      map[uint64]*task
	running   map[uint32]int // tasks starting or running per uid: the table's own count
	cpuq      *lease.Queue   // --no-device tasks waiting for a CPU slot
	cpuFree   []bool
	loading   bool           // taking up the journal's tasks
	warm      int            // supervisors started for tasks still waiting
	arming    map[string]int // per pool: submissions being recorded armed (firstTaskLocked)
	idle      idlePool       // idle supervisors, one per user at most (idle.go)
	paused    *pause         // task starts are stopped, and why
	pauseWait time.Duration  // how long the current pause waits before trying again

	unresolved  map[uint64]*task // waiting tasks whose account could not be looked up (lookupLaterLocked)
	lookupTimer bool             // a lookup of theirs is arranged
	lookupWait  time.Duration    // how long it waits

	led ledger // leases as granted, their holders in /proc, unleased use, accounting (leases.go)
}

// New prepares a broker: the lock directory, the lock files, and the
// occupancy found in them (a device whose lock is held stays held).
func New(o Options) (*Server, error) {
	if o.Log == nil {
		o.Log = StderrLog(os.Stderr)
	}
	s := &Server{
		cfg:          o.Config,
		inv:          o.Inventory,
		locks:        filepath.Join(o.RunDir, "locks"),
		log:          o.Log,
		rlog:         &rateLog{log: o.Log},
		socket:       o.Socket,
		unprivileged: os.Geteuid() != 0,
		pools:        map[string][]int{},
		poolOf:       map[int]string{},
		held:         map[uint32]int{},
		q:            lease.NewQueue(),
		userConns:    map[uint32]int{},
		connsOf:      map[uint32]map[*conn]struct{}{},
		unread:       map[uint32]int{},
		leaseWaits:   map[uint32]int{},
		jobs:         map[uint64]*task{},
		running:      map[uint32]int{},
		boot:         bootID(),
		cpuq:         lease.NewQueue(),
		cpuFree:      make([]bool, o.Config.Tasks.CPUSlots),
	}
	s.acc = newAccess(s)
	for i := range s.cpuFree {
		s.cpuFree[i] = true
		s.cpuSlots = append(s.cpuSlots, i)
	}
	var err error
	if s.proc, err = procfs.NewFS("/proc"); err != nil {
		return nil, err
	}
	if s.self, err = os.Executable(); err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	for _, p := range o.Config.Pools {
		ids := p.IDs
		if ids == nil {
			ids = o.Inventory.IDs
		}
		for _, id := range ids {
			if !slices.Contains(o.Inventory.IDs, id) {
				return nil, fmt.Errorf("pool %q names npu %d, which is not among the devices managed (%s)", p.Name, id, npu.FormatIDs(o.Inventory.IDs))
			}
		}
		s.pools[p.Name] = ids
		for _, id := range ids {
			s.poolOf[id] = p.Name
		}
	}
	if err := prepareDir(s.locks, lockDirMode); err != nil {
		return nil, err
	}
	maxID := 0
	for _, id := range s.inv.IDs {
		maxID = max(maxID, id)
	}
	s.devs = make([]*device, maxID+1)
	var free []int
	freeFD := map[int]int{} // devices free at start: their old lock files
	held := map[int]int{}   // devices held from before this start: their lock files
	for _, id := range s.inv.IDs {
		d := &device{id: id, path: LockPath(s.locks, id), fd: -1, spare: -1, watch: make(chan int, 1)}
		fd, isFree, err := tryLock(d.path)
		if err != nil {
			return nil, err
		}
		s.devs[id] = d
		go s.watch(d)
		if isFree {
			free = append(free, id)
			freeFD[id] = fd
		} else {
			d.since = time.Now()
			s.log.Printf("npu %d is held by a lease from before this start; waiting for its release", id)
			held[id] = fd // to its watcher once its lease is taken up
		}
	}
	if s.inv.Note != "" {
		s.log.Print(s.inv.Note)
	}
	// Device access: a free device's node is cleaned before the device
	// is put in service, and one whose node cannot be is not, until it
	// is.
	failed := s.acc.start(free)
	for _, id := range free {
		// Free, but descriptors of leases from before this start may
		// still reach the file: the device starts on a fresh one.
		d, fd := s.devs[id], freeFD[id]
		if err := failed[id]; err != nil {
			go func() {
				s.acc.revokeUntilDone(d.id, err)
				s.renew(d, fd, nil)
			}()
			continue
		}
		if err := s.renewOnce(d, fd, nil); err != nil {
			s.rlog.Printf("npu %d: %v; out of service until a fresh lock file can be made", id, err)
			go s.renew(d, fd, nil)
		}
	}
	if err := s.writeSessionPolicy(o.RunDir); err != nil {
		return nil, err
	}
	s.cgMode = o.Cgroup
	if s.cgMode == "" {
		s.cgMode = o.Config.Tasks.Cgroup
	}
	stateDir := o.StateDir
	if stateDir == "" {
		stateDir = o.Config.Tasks.StateDir
	}
	// The state directory is this broker's for its life: the journal and
	// the accounting log are read and written by one broker only. A
	// directory that cannot be had now leaves leases served (tasks try again).
	if err := s.claimState(stateDir); errors.Is(err, ErrClaimed) {
		return nil, err
	}
	if err := s.initLedger(stateDir, held); err != nil {
		return nil, err
	}
	for id, fd := range held {
		s.devs[id].watch <- fd
	}
	if err := s.openTasks(stateDir); err != nil {
		return nil, err
	}
	s.fdReserve()
	return s, nil
}

// watch is device d's watcher, for the broker's lifetime: given a second
// open of d's lock file while a lease holds it, it makes the fresh lock
// file for the next lease, then waits in flock until the lease's process
// tree is gone; then the lease is over, and d is free once the fresh file
// is in place.
func (s *Server) watch(d *device) {
	for fd := range d.watch {
		d.ended.Store(nil)
		// The next lease's lock file is made while this one runs, not
		// after: a lease's end, when waiters are many and descriptors
		// may be short, then needs no new descriptor.
		ahead := s.prepareAhead(d)
		if err := flock(fd, false); err != nil {
			// Nothing else can be done with this device; keep it out of
			// use rather than risk a double grant.
			s.log.Printf("npu %d: wait for release: %v; device taken out of service", d.id, err)
			unix.Close(fd)
			if next := ahead(); next != nil {
				next.discard()
			}
			continue
		}
		if fid, err := procscan.ID(fd); err == nil {
			d.ended.Store(&fid)
		}
		next := ahead()
		s.mu.Lock()
		s.leaseEndLocked(d)
		if d.leased {
			if s.held[d.holder]--; s.held[d.holder] <= 0 {
				delete(s.held, d.holder)
			}
		}
		d.leased, d.origin = false, nil
		s.mu.Unlock()
		s.acc.Close(d.id) // before the device can be granted again; fail closed: granted to nobody meanwhile
		s.renew(d, fd, next)
	}
}

// prepareAhead makes device d's next lock file while its lease runs,
// trying again at growing intervals while it cannot (out of descriptors,
// a full /run). The function it returns, called once the lease has ended,
// stops the tries and gives the file made, or nil.
func (s *Server) prepareAhead(d *device) func() *freshLock {
	next, err := prepareLock(d.path)
	if err == nil {
		return func() *freshLock { return next }
	}
	s.rlog.Printf("npu %d: %v; trying again while its lease runs", d.id, err)
	stop, made := make(chan struct{}), make(chan *freshLock, 1)
	go func() {
		for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
			select {
			case <-stop:
				made <- nil
				return
			case <-time.After(wait):
			}
			if next, err := prepareLock(d.path); err == nil {
				made <- next
				return
			}
		}
	}()
	return func() *freshLock {
		select {
		case next := <-made:
			return next
		default:
		}
		close(stop)
		return <-made
	}
}

// renew makes d free on a fresh lock file, next if it was made already;
// old is the lock of the lease that ended, closed once the new file is in
// place. While no fresh file can be made (out of descriptors, a full /run)
// d stays out of service: handing out the old file again would let an
// earlier lease's descriptor take it.
func (s *Server) renew(d *device, old int, next *freshLock) {
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		err := s.renewOnce(d, old, next)
		if err == nil {
			return
		}
		next = nil
		s.rlog.Printf("npu %d: %v; out of service until a fresh lock file can be made", d.id, err)
		time.Sleep(wait)
	}
}

// renewOnce tries once to make d free on a fresh lock file.
func (s *Server) renewOnce(d *device, old int, next *freshLock) error {
	if next == nil {
		var err error
		if next, err = prepareLock(d.path); err != nil {
			return err
		}
	}
	if err := next.place(d.path); err != nil {
		next.discard()
		return err
	}
	unix.Close(old)
	s.mu.Lock()
	d.fd, d.spare = next.locked, next.spare
	s.nfree++
	starts := s.scheduleHereLocked()
	s.mu.Unlock()
	s.launchAll(starts)
	return nil
}

// releasedLocked hands device d, now leased to uid, to its watcher. The
// caller has taken d.fd, the locked descriptor, for the lease, and has
// opened the lease's devices to a restricted uid (access.Allow, once for
// all of them: each call reads every node's ACL).
func (s *Server) releasedLocked(d *device, uid uint32) {
	d.leased, d.holder, d.since = true, uid, time.Now()
	s.nfree--
	s.held[uid]++
	d.watch <- d.spare
	d.spare = -1
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
	c, err := client.Dial(path)
	if err != nil {
		return false
	}
	defer c.Close()
	if c.Send(&client.Request{Op: client.OpPing}) != nil {
		return false
	}
	r, _, err := c.Recv(staleWait)
	return err == nil && r.Type == client.TypePong
}

// Serve accepts connections until ctx is done.
func (s *Server) Serve(ctx context.Context, ln *net.UnixListener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	s.serveMetrics(ctx)
	defer s.led.usage.flush(2 * time.Second)
	defer s.writeSums(time.Time{}) // every lease it knows in the log, before the last flush
	defer s.letIdleGo(time.Second) // a broker that stops leaves no idle supervisor
	defer s.disarmTasks()
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

// disarmTasks, as the broker stops, disarms the waiting tasks durably
// (tasklife): a clean stop starts nothing more, and a machine restarted
// before the next broker must not take them for tasks that may have
// started.
func (s *Server) disarmTasks() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.life != nil {
		s.life.Stop()
	}
}

// poolName resolves the pool a request names; "" is the default pool.
func (s *Server) poolName(name string) string {
	if name == "" {
		return s.cfg.DefaultPool
	}
	return name
}

func poolList(s *Server) string {
	var names []string
	for _, p := range s.cfg.Pools {
		names = append(names, p.Name)
	}
	return strings.Join(names, ", ")
}
