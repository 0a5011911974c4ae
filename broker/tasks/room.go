package tasks

import (
	"errors"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/leaseend"
	"github.com/npurun/npurun/broker/tasks/journal"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/wire"
)

// Owner is the room's owner (the broker): what the room asks of it,
// always holding no lock of the room's.
type Owner interface {
	// Serve asks for the lease table's line to be served (the owner
	// calls Schedule): a task came into line, was let go by a hold, or
	// ended and so left room under its user's caps.
	Serve()
}

// Watcher waits for tasks' ends (task-submit wait): a connection, for
// the broker.
type Watcher interface {
	// TaskEnded tells that a task waited for has ended, as info shows
	// it (full: the watcher was allowed to wait for it). It is called
	// holding no lock of the room's.
	TaskEnded(info wire.TaskInfo)
}

// Account is what the user database says of a submitter, as the broker
// looked it up.
type Account struct {
	Name   string
	Groups []string // names, for the policy's limits
	GID    uint32   // primary group
	GIDs   []uint32 // supplementary groups, as initgroups sets them
	Home   string
	Shell  string // login shell, for a --run task
	Known  bool   // found in the user database; else a stand-in
	// Err is why the user database gave no answer now (out of
	// descriptors, a name service unreachable), nil when it answered:
	// what depends on the account waits until it does.
	Err error
	// ShellErr is why the login shell could not be looked up now.
	ShellErr error
}

// Accounts looks up accounts: the broker's cache of the user database. A
// task taken up from the journal is settled with its account under the
// room's lock: Lookup must take no lock of the room's.
type Accounts interface {
	Lookup(uid uint32) *Account
}

// Outside is an allocator of devices outside the line (Slurm's, on a
// Slurm node: the broker's Slurm room), as the room asks it of its
// tasks' requests. It is called under the room's lock: it must take no
// lock that comes before it (the broker's).
type Outside interface {
	// Refusal refuses a request that names devices that are not the
	// line's to give; nil where it does not.
	Refusal(devices []int) error
	// Why is what the allocator says of waiter w, which waits in a pool
	// of its (Waiter.External); why, what the line says, where it says
	// nothing.
	Why(w *lease.Waiter, why string) string
}

// Config configures a Room.
type Config struct {
	Policy    *policy.Config
	Inventory *npu.Inventory
	Table     *lease.Table // the line tasks wait in with every other request
	Owner     Owner
	Accounts  Accounts
	// Ender ends a task's lease at the task's end, whoever holds its
	// descriptors then; nil: its lock alone ends it.
	Ender  *leaseend.Ender
	Socket string // the broker's socket, told to tasks and supervisors
	// Claim takes the state directory for the broker's life, once: two
	// brokers replaying one journal would run the same task twice. An
	// error wrapping ErrFatal (another broker's) stops the broker.
	Claim func(dir string) error
	Log   *log.Logger
	// Outside allocates devices outside the line (Slurm); nil: none.
	Outside Outside
	// DevicePeak is the most device memory the processes of task id's
	// share were seen to use, in MiB (the status room's, from the vendor's
	// tool); 0 where unknown. nil: never known.
	DevicePeak func(id uint64) int64
	// Runner makes the runner of the tasks granted (package local: the
	// local one, supervisors on this machine), given the room as its Host.
	Runner func(Host) Runner
}

// ErrFatal marks an error of Open that must stop the broker: its state
// directory is another broker's (Config.Claim), or control groups named
// for its tasks cannot be had (Runner.Open).
var ErrFatal = errors.New("cannot start")

// Room is the task room.
//
// Lock order: the owner's lock (Server.mu), then mu, then an outside
// allocator's (Outside: the Slurm room's), then the lease table's, then
// the access room's. The owner calls Schedule, Unwatch and
// the views holding its own lock; every other method is called holding
// none, and the room calls its owner and its watchers holding none of
// its own: what they are told is gathered under mu and told once it is
// let go (unlock). The journal (package journal) and the runner
// share mu, and let it go while they wait (the disk, a process, /proc).
type Room struct {
	// cfg is the policy: replaced, never changed, by SetPolicy.
	cfg atomic.Pointer[policy.Config]

	// Set by New, never changed.
	inv      *npu.Inventory
	table    *lease.Table
	owner    Owner
	accounts Accounts
	ender    *leaseend.Ender
	socket   string
	claim    func(dir string) error
	log      *log.Logger
	run      Runner
	outside  Outside               // nil: none
	devPeak  func(id uint64) int64 // Config.DevicePeak
	boot     string                // this boot's id, against pids of an earlier boot
	cpuSlots []int                 // ids of the CPU slots: 0..cpu_slots-1
	unpriv   bool                  // not root: tasks only for our own uid, no credential change

	mu sync.Mutex
	// The task table (nil while the journal cannot be opened, taskErr
	// says why) and, for each task not ended, what the room holds.
	life       *journal.Life
	taskErr    error
	jobs       map[uint64]*Task
	running    map[uint32]int // tasks starting or running per uid: the table's own count
	cpuq       *lease.Queue   // --no-device tasks waiting for a CPU slot
	cpuFree    []bool
	loading    bool                // taking up the journal's tasks
	arming     map[string]int      // per pool: submissions being recorded armed (firstTaskLocked)
	paused     *pause              // task starts are stopped, and why
	pauseWait  time.Duration       // how long the current pause waits before trying again
	watching   map[Watcher][]*Task // the tasks each watcher waits for
	unresolved map[uint64]*Task    // waiting tasks whose account could not be looked up (lookupLaterLocked)
	lookupSet  bool                // a lookup of theirs is arranged
	lookupWait time.Duration       // how long it waits
	out        outbox              // what to tell once mu is let go
}

// outbox is what the room tells its owner and watchers once its lock
// is let go.
type outbox struct {
	serve bool
	ended []endNote
}

type endNote struct {
	w    Watcher
	info wire.TaskInfo
}

// New makes the room; Open takes up the journal.
func New(c Config) *Room {
	room := &Room{inv: c.Inventory, table: c.Table, owner: c.Owner, accounts: c.Accounts,
		ender: c.Ender, socket: c.Socket, claim: c.Claim, log: c.Log, devPeak: c.DevicePeak,
		boot: BootID(), unpriv: os.Geteuid() != 0,
		jobs: map[uint64]*Task{}, running: map[uint32]int{}, cpuq: lease.NewQueue(),
		cpuFree: make([]bool, c.Policy.Tasks.CPUSlots), watching: map[Watcher][]*Task{}}
	room.cfg.Store(c.Policy)
	for i := range room.cpuFree {
		room.cpuFree[i] = true
		room.cpuSlots = append(room.cpuSlots, i)
	}
	if room.log == nil {
		room.log = log.Default()
	}
	room.outside = c.Outside
	room.run = c.Runner((*host)(room))
	return room
}

// unlock lets mu go, then tells the watchers and the owner what happened
// meanwhile. It is how every method called holding no lock of the
// owner's ends; those the owner calls under its lock let mu go plainly.
func (room *Room) unlock() {
	out := room.out
	room.out = outbox{}
	room.mu.Unlock()
	for _, e := range out.ended {
		e.w.TaskEnded(e.info)
	}
	if out.serve {
		room.owner.Serve()
	}
}

// serveLocked asks for the line to be served once mu is let go.
func (room *Room) serveLocked() { room.out.serve = true }

// Stop, as the broker stops, disarms the waiting tasks durably
// (package journal): a clean stop starts nothing more, and a machine restarted
// before the next broker must not take them for tasks that may have
// started.
func (room *Room) Stop() {
	room.mu.Lock()
	defer room.unlock()
	if room.life != nil {
		room.life.Stop()
	}
}

// Close, as the broker stops, lets the runner's ready processes go (warm
// and idle supervisors), waiting up to d.
func (room *Room) Close(d time.Duration) { room.run.Close(d) }

// What status reads: copies, each taken under mu.

// Supervisor is the pid and start time of task id's supervisor, zero
// while it has none: the process its lease is held by.
func (room *Room) Supervisor(id uint64) (pid int, start uint64) {
	if room == nil {
		return 0, 0
	}
	room.mu.Lock()
	defer room.mu.Unlock()
	if room.life == nil {
		return 0, 0
	}
	if t := room.life.Get(id); t != nil {
		return t.PID, t.PIDStart
	}
	return 0, 0
}

// Counts counts the tasks by state, as clients see the states.
func (room *Room) Counts() map[string]int {
	n := map[string]int{}
	if room == nil {
		return n
	}
	room.mu.Lock()
	defer room.mu.Unlock()
	if room.life == nil {
		return n
	}
	room.life.Each(func(t *journal.Task) bool {
		n[t.Shown()]++
		return true
	})
	return n
}

// CPULine is the line of the tasks that need no device, waiting for a CPU
// slot: the first max of them in service order, and how many wait. A
// Waiter is shared, not copied: of its fields only Held changes.
func (room *Room) CPULine(max int) (first []*lease.Waiter, n int) {
	if room == nil {
		return nil, 0
	}
	room.mu.Lock()
	defer room.mu.Unlock()
	ws := room.cpuq.Waiters()
	return append([]*lease.Waiter(nil), ws[:min(max, len(ws))]...), len(ws)
}

// policy is the configuration in force (SetPolicy).
func (room *Room) policy() *policy.Config { return room.cfg.Load() }

// SetPolicy takes up a reloaded configuration: the tasks submitted from
// now on are checked against its limits and time limits, those waiting
// for a CPU slot are counted under its limits, and those
// launched from now on run with its [tasks] settings (kill_grace,
// cpu_threads, idle_priority); what the room set up at start (the CPU
// slots, the journal's keep_ended, the control groups) stays, which is why
// a reload refuses a change to them. then, if not nil, is called holding
// the room's lock, after the change: a task that joins the line meanwhile
// does so under one policy or the other, never between (the broker
// reconfigures the lease table's line in then).
func (room *Room) SetPolicy(cfg *policy.Config, then func()) {
	room.mu.Lock()
	defer room.mu.Unlock()
	room.cfg.Store(cfg)
	// The CPU slots' line counts its users under the new limits
	// (max_running_tasks), as the lease table's does (then).
	for _, w := range room.cpuq.Waiters() {
		if t := taskOf(w); t != nil && t.acct != nil {
			room.cpuq.SetLimit(w.UID, cfg.LimitFor(t.acct.Name, t.acct.Groups))
		}
	}
	if then != nil {
		then()
	}
}
