package tasks

import (
	"errors"
	"sync"
	"time"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/tasks/journal"
	"github.com/npurun/npurun/wire"
)

// Runner is one way of running granted tasks. The room owns a task's
// life (package journal: the journal, a start at most once), its place in
// line, its grant and its time limit; the runner owns its processes: it readies
// a task's start, runs it once the start is recorded, stops and kills it,
// measures it, and tells the room when its process is gone (Host.Gone).
// The local runner (package local: supervisors on this machine, warm and idle
// ones, control groups) is the one of today; another way of running a
// task (a Slurm batch job) is a sibling implementing this interface, not
// a branch inside the local one.
//
// The room calls each method holding its lock, which the runner shares
// (Host), except where "unlocked" says it holds none; a method that must
// wait returns a function for the room to call without the lock.
type Runner interface {
	// Open readies the runner, unlocked, once the state directory dir is
	// the broker's: the local runner finds its supervisor program and
	// sets up the tasks' control groups. An error wrapping ErrFatal
	// stops the broker; another leaves tasks unavailable, and Open is
	// called again later.
	Open(dir string) error
	// TakeUp takes up what the runner left of the tasks not ended as the
	// journal has them at the broker's start (their control groups), and
	// lets go what it left of any other.
	TakeUp(live []*Task)
	// Adopt takes up task t, found running at the broker's start: it
	// tells whether its process is still there, and then calls Host.Gone
	// once it has exited.
	Adopt(t *Task) bool

	// Warm readies waiting task t's start ahead of its grant, from its
	// Spec (spec makes it). It tells false when it readies no more now
	// (it readies a few at most). The function it returns readies t,
	// unlocked.
	Warm(t *Task, spec func() *wire.Spec) (ready func(), ok bool)
	// Warmed tells whether t's start is readied (Warm), and whether it is
	// ready already.
	Warmed(t *Task) (warm, ready bool)
	// Unwarm lets t's readied start go: t will not start now.
	Unwarm(t *Task)
	// Prepare gets granted task t's start ready: the one Warm readied,
	// unless fresh, or a new one (from the Spec spec makes). The function
	// it returns waits for it, unlocked, and gives the process that will
	// run t, or why not (passing tells whether that passes).
	Prepare(t *Task, spec func() *wire.Spec, fresh bool) func() (Proc, error)
	// Release tells p, which Prepare gave, that t will not start under it.
	Release(t *Task, p Proc)
	// GoAhead, unlocked, once t's start is recorded, starts t under p:
	// its devices' variables in goAhead and their lock descriptors fds,
	// which p keeps (the room closes its own copies after).
	GoAhead(t *Task, p Proc, goAhead *wire.Spec, fds []int) error
	// Gone tells whether p has exited.
	Gone(p Proc) bool
	// Unstarted tells that t's process never got its go-ahead (its own
	// word): t waits again.
	Unstarted(t *Task)

	// Stop asks running task t to stop (the supervisor: SIGTERM to its
	// processes, SIGKILL after the grace), as soon as it can take it.
	Stop(t *Task)
	// Kill ends what is left of running task t at once. It may let the
	// lock go meanwhile (a look through /proc).
	Kill(t *Task)
	// Usage is what t used: CPU time and peak memory, where measured.
	Usage(t *Task) (cpu time.Duration, peak int64)
	// Notice readies running task t's notify command's run with spec (a
	// Spec whose Notice says what to tell), as its submitter, where
	// the task's processes run, for wire.NotifyFor at most. The function
	// it returns runs it, unlocked, without waiting for its end; nil: it
	// runs none now (too many are running).
	Notice(t *Task, spec *wire.Spec) func()
	// Ended lets go what the runner holds for t, which has ended: nothing
	// of it runs on.
	Ended(t *Task)
	// Close, unlocked, as the broker stops, lets every readied process go,
	// waiting up to d for each kind.
	Close(d time.Duration)
}

// What a runner's Prepare may fail with that passes: the task waits and
// its start is tried again later.
var (
	// ErrLookup is a submitter that could not be asked about (the user
	// database cannot be read now).
	ErrLookup = errors.New("the user database cannot be read now")
	// ErrCgroup is a task's control group that cannot be made now: the
	// task waits rather than run outside it.
	ErrCgroup = errors.New("no control group for the task")
	// ErrStartTime is a supervisor whose start time could not be read
	// from /proc (out of descriptors or memory): let go, and started
	// again later.
	ErrStartTime = errors.New("its start time cannot be read from /proc")
)

// Proc is the process that runs a task: the start record names it
// (package journal), and only it may report the task's end.
type Proc interface {
	Process() (pid int, start uint64)
}

// Host is the room as its runner sees it. The runner takes its lock
// (the room's: the room's and the journal's) from its own goroutines.
type Host interface {
	sync.Locker
	// Gone tells, with the lock held, that process pid of task t has
	// exited: a task still running under it is lost.
	Gone(t *Task, pid int)
	// Paused tells, with the lock held, that task starts are paused:
	// nothing is readied for later meanwhile.
	Paused() bool
	// Known tells, with the lock held, whether task id is known and has
	// not ended.
	Known(id uint64) bool
	// Lookup looks up an account, unlocked.
	Lookup(uid uint32) *Account
}

// host is the room as Host.
type host Room

func (h *host) Lock()                      { h.mu.Lock() }
func (h *host) Unlock()                    { (*Room)(h).unlock() }
func (h *host) Gone(t *Task, pid int)      { (*Room)(h).goneLocked(t, pid) }
func (h *host) Paused() bool               { return h.paused != nil }
func (h *host) Known(id uint64) bool       { return h.jobs[id] != nil }
func (h *host) Lookup(uid uint32) *Account { return h.accounts.Lookup(uid) }

// Task is a task that has not ended, and what the room holds for it.
type Task struct {
	*journal.Task
	acct      *Account      // the submitter, as looked up at submission
	w         *lease.Waiter // its place in line (kept while it starts, to put it back)
	inLine    bool          // w is in a queue
	waits     []Watcher     // watchers waiting for its end
	cancel    bool          // a cancel came while it was starting or running
	cancelBy  string        // who cancelled it
	overran   bool          // the broker killed it for overrunning its time limit
	launching bool          // launch is giving it its go-ahead
	lookupErr error         // its account could not be looked up: it waits out of line (lookupLaterLocked)
	run       any           // the runner's own
}

// RunnerData is what t's runner holds for it (SetRunnerData); nil until
// it holds something.
func (t *Task) RunnerData() any { return t.run }

// SetRunnerData keeps v, the runner's own, with t, under the room's lock.
func (t *Task) SetRunnerData(v any) { t.run = v }

// Account is t's submitter's account as looked up when it was submitted
// or taken up; nil if it was not yet.
func (t *Task) Account() *Account { return t.acct }

// Cancelled tells whether a cancel came for t while it was starting or
// running: its runner stops it as soon as it can.
func (t *Task) Cancelled() bool { return t.cancel }
