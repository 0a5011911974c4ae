// Package journal is the life of a detached task, from its submission to its end, and the journal that lets it outlive the broker.
package journal

// Every transition of a task's life is one function in this file. The
// broker decides when (it schedules: the queue, the devices, the
// supervisors); a transition here says what it does to the task, writes
// its record to the journal, and applies it. Replaying the journal at
// start applies the same records through the same functions, so that a
// broker that restarts rebuilds the table it had.
//
//	            submit ("task")
//	                │
//	                ▼          settle: an --after task has not ended yet
//	 ┌─────────  pending ◀───────────────────────────────▶ blocked
//	 │             │  ▲                                      │
//	 │       grant │  │ ungrant: its start could not be      │
//	 │    (memory) │  │ recorded, or its supervisor cannot   │
//	 │             ▼  │ be started for now                   │
//	 │          starting ── end: failed, its supervisor      │
//	 │             │        could not be started at all      │
//	 │             │ start ("start", with the supervisor's   │
//	 │             │ pid: only then may it get its go-ahead) │
//	 │             ▼                                         │
//	 │          running ── lose ("end") ──▶ lost             │
//	 │             │ └─ unstart ──▶ pending  │               │
//	 │             │    ("unstart": its      │               │
//	 │             │    supervisor never got │               │
//	 │             │    its go-ahead, and    │               │
//	 │             │    will not run it)     │ a late report │
//	 │             ▼                         ▼               │
//	 └── end ─▶  done · failed · cancelled ◀──────── end ────┘
//	 ("end": cancelled, or failed            │
//	  without running)                       ▼
//	                          forget (no record: replay forgets alike)
//
// The rules the table keeps:
//
//   - Only a start record, with its supervisor's pid, makes a task running
//     on disk. A starting task is pending in the journal and in every
//     rewrite of it; a broker that dies then runs it again later.
//   - A running task goes back to pending only on its supervisor's word
//     that it never got its go-ahead, and will not run it (Unstart): a
//     broker killed between a start record and its go-ahead loses no
//     task, and a task still runs at most once.
//   - A start record is durable before the go-ahead, unless its task is
//     armed: then it need only be written (in the file, as a broker that
//     restarts reads it; only the machine's crash can lose it), and its
//     sync follows in the background, off the task's start. A task is
//     armed by a durable arm record naming this boot, made while it waits
//     (for the first task in line, whose supervisor is started ahead). A
//     replay in another boot cannot tell whether an armed task that is
//     pending on disk started before the crash: it fails, never run
//     twice. A broker that stops cleanly, and one that starts in the same
//     boot, disarm every task durably, so that only a crash of the machine
//     loses a task this way.
//   - A record is durable before its transition is applied, and a
//     transition whose record could not be written did not happen (a
//     refused cancel leaves the task waiting). Only ends that a replay
//     derives anyway are applied at once and recorded in the background:
//     a dependency that did not succeed, a supervisor found gone.
//   - A task submitted again at another's end (an out-of-memory retry:
//     EndRetried) is in the end's own record: no end is durable without
//     its retry, and a replay of the end yields it, once.
//   - An ended task keeps no environment: it is dropped when the end is
//     applied, live or replayed, and the journal is rewritten soon after,
//     so that the secrets it held leave the disk too.
//   - Ids never repeat: the highest id given is in every rewrite. A new
//     journal starts again at 1, so it gets a tag of its own (also in every
//     rewrite), which names its tasks' default logs beside their ids: a
//     new task never writes to, nor reads, an older task's log.
//   - A submission's token (Sub.Token, the client's) names one task of its
//     user while the task is kept: ByToken finds it, live and after a
//     replay, and a submission being recorded with it is known as such.
//     Tokens are kept with their tasks only, and forgotten with them.
//   - A waiting task may be held (Hold: a "hold" record): it keeps its
//     place in line and settles as ever, but is never granted until a
//     release (a "hold" record with held false). A hold disarms it, and a
//     held task is not armed: it may wait for long. An end, or a start,
//     ends the hold.
//   - Ended tasks are forgotten oldest end first: beyond keep-per-user for
//     their user, and beyond keep in all (the user who has the most ended
//     tasks kept loses one first, so one user's churn cannot push out
//     another's results). A task that a waiting task names in --after is
//     never forgotten: the waiting task must find it.

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/npurun/npurun/wire"
)

// The states of a task, as clients see them, and starting, which they see
// as running.
const (
	Pending   = wire.StatePending
	Blocked   = wire.StateBlocked
	Starting  = "starting"
	Running   = wire.StateRunning
	Done      = wire.StateDone
	Failed    = wire.StateFailed
	Cancelled = wire.StateCancelled
	Lost      = wire.StateLost
)

// transitions is the table of the states a task may move to from each
// state ("" is a task not yet in the table). It is the whole state
// machine: every change of state is checked against it.
var transitions = map[string][]string{
	"":       {Pending, Running, Done, Failed, Cancelled, Lost}, // submit; replay of a rewrite: any state a task has on disk
	Pending:  {Blocked, Starting, Running, Failed, Cancelled},   // running: replay of a start record
	Blocked:  {Pending, Failed, Cancelled},
	Starting: {Pending, Running, Failed},
	Running:  {Done, Failed, Cancelled, Lost, Pending}, // pending: Unstart
	Lost:     {Done, Failed, Cancelled},                // its supervisor reported after all
}

// allowed tells whether a task may move from one state to another.
func allowed(from, to string) bool { return slices.Contains(transitions[from], to) }

// ended tells whether state is an end.
func ended(state string) bool {
	switch state {
	case Done, Failed, Cancelled, Lost:
		return true
	}
	return false
}

// Task is a detached task: its submission, resolved at submit time, and
// what became of it. Its exported fields are its journal record, written
// and read as a type of the journal's own (diskTask, record.go).
type Task struct {
	ID      uint64
	UID     uint32
	User    string
	Sub     wire.Submission
	Argv    []string // resolved: --run is [shell, -c, string]
	Log     string   // resolved
	TimeSec int64    // resolved with the policy's default

	State     string
	Submitted int64 // Unix ms
	Started   int64
	Ended     int64
	Devices   []int
	Slot      int    // CPU slot of a --no-device task, -1 otherwise
	PID       int    // its supervisor
	PIDStart  uint64 // the supervisor's start, clock ticks since boot
	Boot      string // the boot it started in (/proc/sys/kernel/random/boot_id)
	ArmBoot   string // waiting: the boot it was armed in (see the rules above)
	StartMono int64  // CLOCK_MONOTONIC ms at its start, in that boot
	Status    *wire.Status
	Reason    string
	Held      bool   // waiting: held by its owner (Hold), never granted until released
	From      uint64 // submitted again from this ended task (requeue)
	Notify    string // resolved: its own, or the policy's at its submission

	busy   bool   // its cancel is being recorded: nothing else may move it
	endSeq uint64 // order of its end among the ended tasks kept
}

// IsEnded tells whether the task has ended.
func (t *Task) IsEnded() bool { return ended(t.State) }

// IsWaiting tells whether the task waits: pending or blocked.
func (t *Task) IsWaiting() bool { return t.State == Pending || t.State == Blocked }

// Busy tells whether the task's cancel is being recorded.
func (t *Task) Busy() bool { return t.busy }

// Shown is the state clients see: a starting task is running.
func (t *Task) Shown() string {
	if t.State == Starting {
		return Running
	}
	return t.State
}

// Outcome says how an ended task ended, for the reasons of its dependents.
func (t *Task) Outcome() string {
	switch {
	case t.State == Cancelled:
		return "was cancelled"
	case t.Status != nil && t.Status.Exit != nil:
		return fmt.Sprintf("failed with exit status %d", *t.Status.Exit)
	case t.Status != nil && t.Status.Signal != "":
		return "was killed by " + t.Status.Signal
	case t.Status != nil && t.Status.Reason != "":
		return t.State + ": " + t.Status.Reason
	case t.Reason != "":
		return t.State + ": " + t.Reason
	}
	return t.State
}

// onDisk is the task as the journal may hold it: a starting task has no
// durable start, so it is pending there; blocked is decided again at
// start.
func (t *Task) onDisk() *Task {
	c := *t
	c.busy, c.endSeq = false, 0
	switch c.State {
	case Starting:
		c.State, c.Started, c.Devices, c.Slot = Pending, 0, nil, -1
		c.PID, c.PIDStart, c.Boot, c.StartMono = 0, 0, "", 0
	case Blocked:
		c.State = Pending
	}
	return &c
}

// Record is one line of the journal.
type Record struct {
	Op        string      `json:"op"`             // see the op constants
	Task      *Task       `json:"task,omitempty"` // task: the task; end: its retry, submitted with the end (EndRetried)
	ID        uint64      `json:"id,omitempty"`
	Time      int64       `json:"time,omitempty"`
	Devices   []int       `json:"devices,omitempty"`
	Slot      int         `json:"slot,omitempty"`
	PID       int         `json:"pid,omitempty"`
	PIDStart  uint64      `json:"pid_start,omitempty"`
	Boot      string      `json:"boot,omitempty"`
	StartMono int64       `json:"start_mono,omitempty"`
	State     string      `json:"state,omitempty"`
	Status    *diskStatus `json:"status,omitempty"` // the journal's own type, not the wire's (record.go)
	Reason    string      `json:"reason,omitempty"`
	Pad       string      `json:"pad,omitempty"` // a probe's size
	Tag       string      `json:"tag,omitempty"` // ids: the journal's tag
	Held      bool        `json:"held,omitempty"`
}

// The records of the journal.
const (
	opTask    = "task"    // a whole task: a submission, or a task as a rewrite carries it
	opStart   = "start"   // a task started: its devices and supervisor
	opEnd     = "end"     // a task ended
	opIDs     = "ids"     // the highest id given so far, and the journal's tag (first in a rewrite)
	opProbe   = "probe"   // a test that the journal can be written again; no change
	opArm     = "arm"     // a waiting task armed in a boot: its start need not be synced before its go-ahead
	opUnstart = "unstart" // a running task's supervisor never got its go-ahead: the task waits again
	opDisarm  = "disarm"  // every task disarmed: the broker stopped cleanly, or started in the boot they were armed in
	opHold    = "hold"    // a waiting task held in its place (held), or released
)

// Options configure a Life.
type Options struct {
	// Lock is the broker's lock. Every method is called with it held; the
	// transitions that write the journal release it while they wait for
	// the disk and take it again before they return, so anything the
	// caller read before may have changed by then.
	Lock sync.Locker
	// Keep is how many ended tasks are kept, all users together, and
	// KeepPerUser how many of one user's.
	Keep, KeepPerUser int
	// Ended, when set, is called (with the lock held) when a task ends,
	// once the end is applied and before ended tasks are forgotten, so that
	// the tasks waiting for it can be settled. It is not called during a
	// replay. It may call Settle and EndNow, not the transitions that
	// write durably.
	Ended func(*Task)
	Log   *log.Logger
	// Boot is this boot's id ("" if unknown: no task is armed). A replay
	// fails the tasks armed in another boot, and disarms the others.
	Boot string
}

// Life is the table of tasks and its journal.
type Life struct {
	mu          sync.Locker
	j           *journal
	boot        string
	closing     bool // Stop has run: nothing is armed, no start made unsynced any more
	log         *log.Logger
	keep, keepU int
	onEnd       func(*Task)

	tasks      map[uint64]*Task
	order      []uint64 // ids, ascending; forgotten ones are skipped, and swept now and then
	gone       int      // forgotten ids still in order
	sorted     bool     // order is sorted (a replay appends, then sorts)
	nextID     uint64   // the highest id given
	tag        string   // the journal's, made when it is new
	waiting    map[uint32]int
	running    map[uint32]int
	submitting map[uint32]int
	live       int                 // tasks not ended
	endedBy    map[uint32][]uint64 // per uid, in the order they ended
	nEnded     int
	endSeq     uint64
	namedBy    map[uint64]map[uint64]struct{} // id → the waiting tasks that name it in --after
	tokens     map[tokenKey]uint64            // a submission's token → its task, while the task is kept
	recording  map[tokenKey]struct{}          // tokens of submissions being recorded
	replaying  bool

	compacting  bool
	lastSize    int64         // the journal's size after the last rewrite
	lastDone    time.Time     // when the last rewrite ended
	lastTook    time.Duration // how long it took
	failBackoff time.Duration // after a failed rewrite, wait this long before another
	secretEnds  uint64        // ends of tasks whose environment is in the journal
	secretsOut  uint64        // of those, the ones a rewrite has taken off the disk
	secretWait  time.Duration // secretDelay
	timerSet    bool

	afterCompact func() // when set (by tests), called with the lock held after each rewrite
}

// How the journal is compacted: when it has grown to compactGrowth times
// its size after the last rewrite plus compactSlack (so that rewriting
// costs at most a third of what was appended), and, while the environment
// of an ended task is still in it, secretDelay after the last rewrite (or
// nine times as long as that one took, so that rewrites take at most a
// tenth of the time).
const (
	compactGrowth = 4
	compactSlack  = 4 << 20
	maxBackoff    = time.Minute
)

// secretDelay is the wait before a rewrite that takes an ended task's
// environment off the disk (a table's own, which tests shorten).
const secretDelay = 5 * time.Second

func newLife(dir string, o Options) *Life {
	lg := o.Log
	if lg == nil {
		lg = log.New(os.Stderr, "npubroker: ", 0)
	}
	return &Life{
		mu: o.Lock, j: newJournal(dir), log: lg, boot: o.Boot, keep: o.Keep, keepU: o.KeepPerUser, onEnd: o.Ended,
		tasks: map[uint64]*Task{}, sorted: true,
		waiting: map[uint32]int{}, running: map[uint32]int{}, submitting: map[uint32]int{},
		endedBy: map[uint32][]uint64{}, namedBy: map[uint64]map[uint64]struct{}{}, secretWait: secretDelay,
		tokens: map[tokenKey]uint64{}, recording: map[tokenKey]struct{}{},
	}
}

// Open prepares the state directory dir, replays its journal and rewrites
// it compactly. A line of the journal that cannot be read is reported and
// skipped; the journal as it was is kept beside it (journal.damaged.TIME)
// before the rewrite replaces it. A rewrite that fails (a full disk) leaves
// the journal as it is, its torn last line cut off, and the table carries
// on with it.
func Open(dir string, o Options) (*Life, error) {
	if err := prepareDir(dir); err != nil {
		return nil, err
	}
	l := newLife(dir, o)
	l.replaying = true
	res, err := replay(l.j.path(), l.apply)
	var disarm []*Record
	if err == nil {
		disarm = l.disarmReplayed()
	}
	l.replaying = false
	if err != nil {
		return nil, err
	}
	if l.tag == "" {
		// A new journal (or one older than tags). The rewrite below
		// keeps the tag; should it fail, the next start makes another,
		// which is as good: the ids go on from the tasks kept.
		if l.tag, err = newTag(); err != nil {
			return nil, err
		}
	}
	if !l.sorted {
		slices.Sort(l.order)
		l.order = slices.Compact(l.order)
		l.sorted = true
	}
	for uid := range l.endedBy {
		l.trim(uid) // the caps may be smaller than before the restart
	}
	l.sweep()
	for _, d := range res.damaged {
		l.log.Printf("journal damaged: %s", d)
	}
	rewrite := true
	if len(res.damaged) > 0 {
		name, err := keepDamaged(dir)
		if err != nil {
			l.log.Printf("%v; the journal is not rewritten", err)
			rewrite = false
		} else {
			l.log.Printf("the journal as it was is kept as %s", name)
		}
	}
	if rewrite {
		recs := l.snapshot()
		size, err := l.j.rewrite(encoder(recs), len(recs))
		if err == nil {
			l.lastSize, l.lastDone, l.secretsOut = size, time.Now(), l.secretEnds
			return l, nil
		}
		l.log.Printf("%v; carrying on with the journal as it is", err)
	}
	if err := l.j.appendTo(res.end); err != nil {
		return nil, err
	}
	l.j.records = res.records
	if len(disarm) > 0 {
		// Not rewritten: the arm records are still there.
		if err := l.writeUnlocked(disarm...); err != nil {
			l.log.Printf("disarm the tasks armed before the restart: %v; if the machine crashes before they start, they fail", err)
		}
	}
	return l, nil
}

// Close closes the journal, once the records queued are written.
func (l *Life) Close() error { return l.j.close() }

// Stop, as the broker stops, disarms the armed tasks durably: no start is
// made unsynced from now on. The caller holds the lock.
func (l *Life) Stop() {
	l.closing = true
	armed := false
	for _, t := range l.tasks {
		if t.ArmBoot != "" {
			armed = true
			break
		}
	}
	if armed {
		if err := l.writeDisarm(); err != nil {
			l.log.Printf("disarm the waiting tasks: %v; if the machine restarts before the broker does, they fail", err)
		}
	}
}

// reasonArmed is the reason of a task found armed in another boot.
const reasonArmed = "the machine restarted while it may have been starting; it is not run again, so that it runs at most once"

// disarmReplayed, at the end of a replay, fails the waiting tasks armed in
// another boot (their start may have been written and lost with the
// machine) and disarms every task. It returns the records that say so, for
// a journal that is not rewritten; none if no task was armed.
func (l *Life) disarmReplayed() []*Record {
	var ids []uint64
	for id, t := range l.tasks {
		if t.ArmBoot != "" {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	slices.Sort(ids)
	var recs []*Record
	now := time.Now().UnixMilli()
	for _, id := range ids {
		if t := l.tasks[id]; t.IsWaiting() && t.ArmBoot != l.boot {
			r := &Record{Op: opEnd, ID: id, Time: now, State: Failed, Reason: reasonArmed}
			l.applyEnd(r)
			recs = append(recs, r)
		}
	}
	r := &Record{Op: opDisarm}
	_ = l.apply(r)
	return append(recs, r)
}

// writeDisarm makes a disarm record durable and applies it.
func (l *Life) writeDisarm() error {
	rec := &Record{Op: opDisarm}
	if err := l.write(rec); err != nil {
		return err
	}
	return l.apply(rec)
}

// Arm arms waiting task t in this boot, durably, so that its start need
// not wait for the disk (see the rules above). It does nothing when t is
// armed already, no longer waiting, or the boot is unknown.
func (l *Life) Arm(t *Task) error {
	if l.boot == "" || l.closing || !t.IsWaiting() || t.ArmBoot == l.boot || t.busy || t.Held {
		return nil
	}
	rec := &Record{Op: opArm, ID: t.ID, Boot: l.boot}
	if err := l.write(rec); err != nil {
		return err
	}
	err := l.applied(rec)
	l.disarmIfStopped()
	return err
}

// SubmitArmed is Submit for a task that will be the first waiting in its
// pool, the one the broker arms: armed in its submission record, so that
// a start right after it (an empty line) waits for the disk once, not
// twice. A task with --after is submitted unarmed: it waits for others.
func (l *Life) SubmitArmed(t *Task) error {
	armed := l.boot != "" && !l.closing && len(t.Sub.After) == 0
	if armed {
		t.ArmBoot = l.boot
	}
	if err := l.Submit(t); err != nil {
		return err
	}
	if armed {
		l.disarmIfStopped()
	}
	return nil
}

// disarmIfStopped follows an arm written while Stop ran: the lock was let
// go for the write, Stop found the task not (yet) armed, and any disarm it
// wrote may lie before the arm in the journal. Without one more disarm
// after it, a clean stop and a restart of the machine would fail a task
// that never started.
func (l *Life) disarmIfStopped() {
	if !l.closing {
		return
	}
	if err := l.writeDisarm(); err != nil {
		l.log.Printf("disarm the waiting tasks: %v; if the machine restarts before the broker does, they fail", err)
	}
}

// Armed tells whether t's start may be made without waiting for the disk.
func (l *Life) Armed(t *Task) bool {
	return l.boot != "" && !l.closing && t.ArmBoot == l.boot
}

// TagLen is the length of a journal's tag.
const TagLen = 8

// newTag makes a journal's tag: TagLen random hexadecimal digits.
func newTag() (string, error) {
	b := make([]byte, TagLen/2)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("make the journal's tag: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// Tag is the journal's tag, which names its tasks' default logs beside
// their ids (ids start again with a new journal; its tag does not).
func (l *Life) Tag() string { return l.tag }

// tokenKey is a submission's token, which names a task of one user.
type tokenKey struct {
	uid   uint32
	token string
}

// ByToken is uid's task submitted with token, if it is kept; recording
// tells that a submission with that token is being recorded (its fate is
// not known yet).
func (l *Life) ByToken(uid uint32, token string) (t *Task, recording bool) {
	k := tokenKey{uid, token}
	if _, ok := l.recording[k]; ok {
		return nil, true
	}
	if id, ok := l.tokens[k]; ok {
		return l.tasks[id], false
	}
	return nil, false
}

// Get is task id, nil if there is none.
func (l *Life) Get(id uint64) *Task { return l.tasks[id] }

// Each calls fn for each task in id order until it returns false.
func (l *Life) Each(fn func(*Task) bool) {
	for _, id := range l.order {
		if t := l.tasks[id]; t != nil && !fn(t) {
			return
		}
	}
}

// EachAfter is Each from the first task whose id is above after: a page of
// a listing starts where the last one stopped without walking what came
// before.
func (l *Life) EachAfter(after uint64, fn func(*Task) bool) {
	if after == ^uint64(0) {
		return
	}
	i, _ := slices.BinarySearch(l.order, after+1)
	for _, id := range l.order[i:] {
		if t := l.tasks[id]; t != nil && !fn(t) {
			return
		}
	}
}

// Waiting is how many tasks uid has waiting, pending or blocked, with its
// submissions being recorded.
func (l *Life) Waiting(uid uint32) int { return l.waiting[uid] + l.submitting[uid] }

// AnyWaiting tells whether any task waits.
func (l *Life) AnyWaiting() bool { return len(l.waiting) > 0 }

// RunningByUser is how many tasks each uid has starting or running. The map
// is the table's own, kept up to date: read it, never change it.
func (l *Life) RunningByUser() map[uint32]int { return l.running }

// Live is how many tasks have not ended, with the submissions being
// recorded.
func (l *Life) Live() int {
	n := l.live
	for _, k := range l.submitting {
		n += k
	}
	return n
}

// Dependents are the waiting tasks that name id in --after, in id order.
func (l *Life) Dependents(id uint64) []*Task {
	var out []*Task
	for d := range l.namedBy[id] {
		if t := l.tasks[d]; t != nil {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b *Task) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Writable is nil when the journal can be written as far as is known, or
// why it cannot.
func (l *Life) Writable() error {
	_, _, err := l.j.stats()
	return err
}

// --- transitions ---

// NewID gives the next task id; ids never repeat.
func (l *Life) NewID() uint64 {
	l.nextID++
	return l.nextID
}

// Submit records t, a new task with an id from NewID, then adds it to the
// table, pending. The tasks its --after names must exist: they are kept
// from now on, while t waits.
func (l *Life) Submit(t *Task) error {
	if t.ID == 0 || t.ID > l.nextID || l.tasks[t.ID] != nil {
		return fmt.Errorf("submit task %d: not a new id", t.ID)
	}
	for _, dep := range t.Sub.After {
		if l.tasks[dep] == nil {
			return fmt.Errorf("submit task %d: no task %d", t.ID, dep)
		}
	}
	var tok tokenKey
	if t.Sub.Token != "" {
		tok = tokenKey{t.UID, t.Sub.Token}
		if _, ok := l.recording[tok]; ok {
			return fmt.Errorf("submit task %d: a submission with its token is being recorded", t.ID)
		}
		if _, ok := l.tokens[tok]; ok {
			return fmt.Errorf("submit task %d: its token names task %d", t.ID, l.tokens[tok])
		}
		l.recording[tok] = struct{}{}
		defer delete(l.recording, tok) // applied (indexed) or failed by then
	}
	t.State = Pending
	l.name(t)
	l.submitting[t.UID]++
	rec := &Record{Op: opTask, Task: t}
	// Nobody else sees t yet, and the tasks it names are kept: it is
	// encoded without the lock, the largest record by far.
	l.mu.Unlock()
	data, err := encode(rec)
	l.mu.Lock()
	if err == nil {
		err = l.writeEncoded(data, 1)
	}
	if l.submitting[t.UID]--; l.submitting[t.UID] <= 0 {
		delete(l.submitting, t.UID)
	}
	if err != nil {
		l.unname(t)
		return err
	}
	return l.applied(rec)
}

// Settle decides where a waiting task stands with its --after tasks: it
// may be queued (true, pending), or it waits for them (blocked), or it will
// never run because one of them did not succeed (failed).
func (l *Life) Settle(t *Task) bool {
	if !t.IsWaiting() || t.busy {
		return false
	}
	for _, dep := range t.Sub.After {
		d := l.tasks[dep]
		switch {
		case d == nil:
			l.EndNow(t, Failed, fmt.Sprintf("dependency %d is unknown", dep))
			return false
		case d.State == Done:
			continue
		case d.IsEnded():
			l.EndNow(t, Failed, fmt.Sprintf("dependency %d %s", dep, d.Outcome()))
			return false
		default:
			l.move(t, Blocked)
			return false
		}
	}
	l.move(t, Pending)
	return true
}

// Grant gives a pending task its devices (or CPU slot): it is starting.
// Nothing is recorded: on disk it stays pending until Start.
func (l *Life) Grant(t *Task, devices []int, slot int, now time.Time) error {
	if t.Held {
		return fmt.Errorf("grant task %d: it is held", t.ID)
	}
	if t.State != Pending || t.busy {
		return fmt.Errorf("grant task %d: it is %s", t.ID, t.State)
	}
	l.move(t, Starting)
	t.Started, t.Devices, t.Slot = now.UnixMilli(), devices, slot
	return nil
}

// Hold records that waiting task t is held in its place (held) or
// released, then applies it. It does nothing when t is so already. On an
// error nothing has changed. The caller keeps a task it holds from being
// granted while the record is written (its waiter held first).
func (l *Life) Hold(t *Task, held bool) error {
	if !t.IsWaiting() || t.busy {
		return fmt.Errorf("hold task %d: it is %s", t.ID, t.Shown())
	}
	if t.Held == held {
		return nil
	}
	rec := &Record{Op: opHold, ID: t.ID, Held: held}
	if err := l.write(rec); err != nil {
		return err
	}
	return l.applied(rec)
}

// Ungrant puts a starting task back to pending: its start could not be
// recorded, or its supervisor could not be started for now.
func (l *Life) Ungrant(t *Task) {
	if t.State != Starting {
		return
	}
	l.move(t, Pending)
	t.Started, t.Devices, t.Slot = 0, nil, -1
	t.PID, t.PIDStart, t.Boot, t.StartMono = 0, 0, "", 0
}

// Start records that a starting task's supervisor, pid (started at
// pidStart ticks since boot, in boot), is to run it; mono is the
// monotonic clock's reading in ms. Once it returns nil, and only then, the
// supervisor may be given its go-ahead. On an error the task is still
// starting: the caller ungrants it.
func (l *Life) Start(t *Task, pid int, pidStart uint64, boot string, mono int64) error {
	if t.State != Starting {
		return fmt.Errorf("start task %d: it is %s", t.ID, t.State)
	}
	rec := &Record{Op: opStart, ID: t.ID, Time: t.Started, Devices: t.Devices, Slot: t.Slot,
		PID: pid, PIDStart: pidStart, Boot: boot, StartMono: mono}
	var err error
	if l.Armed(t) {
		err = l.writeWritten(rec)
	} else {
		err = l.write(rec)
	}
	if err != nil {
		return err
	}
	return l.applied(rec)
}

// Unstart records that running task t never started: its supervisor, the
// one of its start record (pid), says it never got its go-ahead (a broker
// died between the start record and the go-ahead) and will not run it.
// Then t is pending again, as before its grant. On an error nothing has
// changed.
func (l *Life) Unstart(t *Task, pid int) error {
	if t.State != Running || t.PID != pid || pid == 0 {
		return fmt.Errorf("unstart task %d: it is %s with supervisor %d, not %d", t.ID, t.State, t.PID, pid)
	}
	rec := &Record{Op: opUnstart, ID: t.ID, PID: pid}
	if err := l.write(rec); err != nil {
		return err
	}
	return l.applied(rec)
}

// End records that t ended as state, then applies it: a running task's
// report (or a failure to start it), a waiting task's cancel. While a
// waiting task's end is being recorded it is busy: Settle and Grant leave
// it alone. On an error nothing has changed.
func (l *Life) End(t *Task, state string, st *wire.Status, reason string) error {
	return l.EndRetried(t, state, st, reason, nil)
}

// EndRetried is End for a task submitted again with its end: retry, a new
// task with an id from NewID, naming no --after task and no token (an
// out-of-memory retry), goes into the journal in the end's own record, so
// that the end is never durable without it: a broker killed after the
// write, before anything else, replays both. Once it returns nil, retry is
// in the table, pending; on an error nothing has changed.
func (l *Life) EndRetried(t *Task, state string, st *wire.Status, reason string, retry *Task) error {
	if !ended(state) || !allowed(t.State, state) || t.busy {
		return fmt.Errorf("end task %d as %s: it is %s", t.ID, state, t.State)
	}
	rec := &Record{Op: opEnd, ID: t.ID, Time: time.Now().UnixMilli(), State: state, Status: statusOnDisk(st), Reason: reason}
	if retry != nil {
		if retry.ID == 0 || retry.ID > l.nextID || l.tasks[retry.ID] != nil || len(retry.Sub.After) > 0 || retry.Sub.Token != "" {
			return fmt.Errorf("end task %d with retry %d: not a new task without --after or token", t.ID, retry.ID)
		}
		retry.State = Pending
		rec.Task = retry
		l.submitting[retry.UID]++ // counted against its user's caps meanwhile, as a submission is
		defer func() {
			if l.submitting[retry.UID]--; l.submitting[retry.UID] <= 0 {
				delete(l.submitting, retry.UID)
			}
		}()
	}
	t.busy = t.IsWaiting()
	err := l.write(rec)
	t.busy = false
	if err != nil {
		return err
	}
	return l.applied(rec)
}

// EndNow ends t at once and records it in the background: for ends that a
// replay would derive again (a dependency that did not succeed, a
// supervisor found gone), so that the record's fate does not matter.
func (l *Life) EndNow(t *Task, state, reason string) {
	if !ended(state) || !allowed(t.State, state) {
		return
	}
	rec := &Record{Op: opEnd, ID: t.ID, Time: time.Now().UnixMilli(), State: state, Reason: reason}
	if data, err := encode(rec); err == nil {
		if tk, err := l.j.enqueue(data, 1); err == nil {
			go func() {
				if err := l.j.wait(tk); err != nil {
					l.log.Printf("task %d: %v", t.ID, err)
				}
				l.j.release(tk)
			}()
		}
	}
	l.apply(rec)
	l.maybeCompact()
}

// probeSize is the size of the record that tests the journal: larger than
// a start record, so that a journal with room for a probe has room for a
// start.
const probeSize = 1 << 10

// Recover tests whether the journal can be written again: with a record
// that changes nothing, or, after a failed sync, by rewriting it.
func (l *Life) Recover() error {
	if l.Writable() != nil {
		if l.compacting {
			return errors.New("a rewrite of the journal is under way")
		}
		return l.compact()
	}
	return l.write(&Record{Op: opProbe, Time: time.Now().UnixMilli(), Pad: strings.Repeat(".", probeSize)})
}

// write makes recs durable, with the lock released while the disk works.
func (l *Life) write(recs ...*Record) error { return l.writeRecs(false, recs...) }

// writeWritten is write for a record that need only be in the file: its
// sync follows in the background.
func (l *Life) writeWritten(rec *Record) error { return l.writeRecs(true, rec) }

func (l *Life) writeRecs(written bool, recs ...*Record) error {
	data, err := encode(recs...)
	if err != nil {
		return err
	}
	return l.writeTo(data, len(recs), written)
}

// writeUnlocked is write for Open, which runs without the lock.
func (l *Life) writeUnlocked(recs ...*Record) error {
	data, err := encode(recs...)
	if err != nil {
		return err
	}
	tk, err := l.j.enqueue(data, len(recs))
	if err != nil {
		return err
	}
	defer l.j.release(tk)
	return l.j.wait(tk)
}

// writeEncoded is write for n records already encoded.
func (l *Life) writeEncoded(data []byte, n int) error { return l.writeTo(data, n, false) }

// writeTo writes n records already encoded, durably or, with written set,
// only into the file.
func (l *Life) writeTo(data []byte, n int, written bool) error {
	if len(data) > maxRecord {
		return fmt.Errorf("journal record of %d bytes, more than %d", len(data), maxRecord)
	}
	tk, err := l.j.enqueue(data, n)
	if err != nil {
		return err
	}
	l.mu.Unlock()
	if written {
		err = l.j.waitWritten(tk)
	} else {
		err = l.j.wait(tk)
	}
	l.mu.Lock()
	l.j.release(tk) // applied before the lock is let go again
	return err
}

func encode(recs ...*Record) ([]byte, error) {
	var b bytes.Buffer
	for _, r := range recs {
		j, err := json.Marshal(r)
		if err != nil {
			return nil, err
		}
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.Bytes(), nil
}

// encoder writes recs as encode does, one at a time.
func encoder(recs []*Record) func(io.Writer) error {
	return func(w io.Writer) error {
		enc := json.NewEncoder(w) // as json.Marshal, and a newline
		for _, r := range recs {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
}

// applied applies a record just made durable, then compacts the journal
// if it is due.
func (l *Life) applied(r *Record) error {
	err := l.apply(r)
	l.maybeCompact()
	return err
}

// --- applying records: the live path and the replay alike ---

// apply applies one record to the table. A record that no longer applies
// (its task forgotten, or already moved on: a record both in a rewrite
// and carried after it) changes nothing.
func (l *Life) apply(r *Record) error {
	switch r.Op {
	case opTask:
		return l.applyTask(r.Task)
	case opStart:
		l.applyStart(r)
	case opUnstart:
		l.applyUnstart(r)
	case opEnd:
		l.applyEnd(r)
	case opIDs:
		l.nextID = max(l.nextID, r.ID)
		if r.Tag != "" {
			l.tag = r.Tag
		}
	case opArm:
		if t := l.tasks[r.ID]; t != nil && t.IsWaiting() {
			t.ArmBoot = r.Boot
		}
	case opDisarm:
		for _, t := range l.tasks {
			t.ArmBoot = ""
		}
	case opHold:
		if t := l.tasks[r.ID]; t != nil && t.IsWaiting() {
			t.Held = r.Held
			if t.Held {
				t.ArmBoot = "" // it may wait for long: see the rules above
			}
		}
	case opProbe:
	default:
		return fmt.Errorf("unknown record %q", r.Op)
	}
	return nil
}

func (l *Life) applyTask(t *Task) error {
	if t == nil || t.ID == 0 {
		return errors.New("task record without a task")
	}
	l.nextID = max(l.nextID, t.ID)
	if l.tasks[t.ID] != nil {
		return nil
	}
	state := t.State
	switch {
	case state == Running && t.PID == 0:
		// Written by a broker that compacted a task as running before
		// its start was recorded: it never got its go-ahead.
		state = Pending
	case state == Blocked || state == Starting || state == "":
		state = Pending
	case !allowed("", state):
		return fmt.Errorf("task %d in unknown state %q", t.ID, t.State)
	}
	t.State = ""
	if state == Pending {
		t.Started, t.Devices, t.Slot, t.PID, t.PIDStart = 0, nil, -1, 0, 0
	}
	l.tasks[t.ID] = t
	if t.Sub.Token != "" {
		l.tokens[tokenKey{t.UID, t.Sub.Token}] = t.ID
	}
	if l.sorted && len(l.order) > 0 && l.order[len(l.order)-1] > t.ID {
		if l.replaying {
			l.sorted = false
			l.order = append(l.order, t.ID)
		} else {
			i, _ := slices.BinarySearch(l.order, t.ID)
			l.order = slices.Insert(l.order, i, t.ID)
		}
	} else {
		l.order = append(l.order, t.ID)
	}
	l.move(t, state)
	if state == Pending {
		l.name(t)
	}
	if ended(state) {
		t.Sub.Env = nil
		l.noteEnded(t)
	}
	return nil
}

func (l *Life) applyStart(r *Record) {
	t := l.tasks[r.ID]
	if t == nil || (t.State != Pending && t.State != Starting) {
		return
	}
	t.ArmBoot, t.Held = "", false
	l.move(t, Running)
	t.Started, t.Devices, t.Slot = r.Time, r.Devices, r.Slot
	t.PID, t.PIDStart, t.Boot, t.StartMono = r.PID, r.PIDStart, r.Boot, r.StartMono
	l.unname(t)
}

func (l *Life) applyUnstart(r *Record) {
	t := l.tasks[r.ID]
	if t == nil || t.State != Running || t.PID != r.PID {
		return
	}
	l.move(t, Pending)
	t.Started, t.Devices, t.Slot = 0, nil, -1
	t.PID, t.PIDStart, t.Boot, t.StartMono = 0, 0, "", 0
	l.name(t)
}

func (l *Life) applyEnd(r *Record) {
	t := l.tasks[r.ID]
	if t == nil || !ended(r.State) || !allowed(t.State, r.State) {
		return
	}
	if t.State == Lost {
		l.unnoteEnded(t) // it ends again, now
	}
	if t.IsWaiting() || t.State == Starting {
		l.unname(t)
	}
	t.ArmBoot, t.Held = "", false
	l.move(t, r.State)
	t.Ended, t.Reason = r.Time, r.Reason
	if r.Status != nil {
		t.Status = r.Status.wire()
	}
	if len(t.Sub.Env) > 0 {
		t.Sub.Env = nil // its secrets do not outlive it
		l.secretEnds++
	}
	l.noteEnded(t)
	if r.Task != nil {
		// Its retry (EndRetried), submitted in the same record: applied
		// only with the end, so that a record applied twice (carried
		// after a rewrite that has it) makes no second task.
		if err := l.applyTask(r.Task); err != nil {
			l.log.Printf("task %d: its retry: %v", t.ID, err)
		}
	}
	if !l.replaying && l.onEnd != nil {
		l.onEnd(t)
	}
	l.trim(t.UID)
}

// move changes t's state, keeping the counts, after checking the table.
func (l *Life) move(t *Task, to string) {
	from := t.State
	if from == to {
		return
	}
	if !allowed(from, to) {
		panic(fmt.Sprintf("journal: task %d: %s → %s is not a transition", t.ID, from, to))
	}
	count := func(m map[uint32]int, d int) {
		if m[t.UID] += d; m[t.UID] <= 0 {
			delete(m, t.UID)
		}
	}
	switch from {
	case Pending, Blocked:
		count(l.waiting, -1)
	case Starting, Running:
		count(l.running, -1)
	}
	switch to {
	case Pending, Blocked:
		count(l.waiting, 1)
	case Starting, Running:
		count(l.running, 1)
	}
	if from != "" && !ended(from) && ended(to) {
		l.live--
	}
	if from == "" && !ended(to) {
		l.live++
	}
	t.State = to
}

// --- dependencies and forgetting ---

// name registers t, waiting, with the tasks it names in --after.
func (l *Life) name(t *Task) {
	for _, dep := range t.Sub.After {
		if l.namedBy[dep] == nil {
			l.namedBy[dep] = map[uint64]struct{}{}
		}
		l.namedBy[dep][t.ID] = struct{}{}
	}
}

// unname undoes name: t waits no more. A task it named may be forgotten
// now.
func (l *Life) unname(t *Task) {
	for _, dep := range t.Sub.After {
		by, ok := l.namedBy[dep]
		if !ok {
			continue
		}
		delete(by, t.ID)
		if len(by) == 0 {
			delete(l.namedBy, dep)
			if d := l.tasks[dep]; d != nil && d.IsEnded() {
				l.trim(d.UID)
			}
		}
	}
}

func (l *Life) noteEnded(t *Task) {
	l.endSeq++
	t.endSeq = l.endSeq
	l.endedBy[t.UID] = append(l.endedBy[t.UID], t.ID)
	l.nEnded++
}

func (l *Life) unnoteEnded(t *Task) {
	by := l.endedBy[t.UID]
	if i := slices.Index(by, t.ID); i >= 0 {
		l.endedBy[t.UID] = slices.Delete(by, i, i+1)
		l.nEnded--
	}
}

// trim forgets ended tasks beyond what is kept: uid's beyond its own
// cap, then anyone's beyond the global one, taken from whoever has the
// most.
func (l *Life) trim(uid uint32) {
	for len(l.endedBy[uid]) > l.keepU && l.forgetOldest(uid) {
	}
	for l.nEnded > l.keep {
		users := make([]uint32, 0, len(l.endedBy))
		for u := range l.endedBy {
			users = append(users, u)
		}
		sort.Slice(users, func(i, j int) bool {
			a, b := len(l.endedBy[users[i]]), len(l.endedBy[users[j]])
			return a > b || (a == b && users[i] < users[j])
		})
		forgot := false
		for _, u := range users {
			if forgot = l.forgetOldest(u); forgot {
				break
			}
		}
		if !forgot {
			return // all named by waiting tasks
		}
	}
}

// forgetOldest forgets uid's task that ended first and that no waiting
// task names; false if there is none.
func (l *Life) forgetOldest(uid uint32) bool {
	by := l.endedBy[uid]
	for i, id := range by {
		if len(l.namedBy[id]) > 0 {
			continue
		}
		by = slices.Delete(by, i, i+1)
		if len(by) == 0 {
			delete(l.endedBy, uid)
		} else {
			l.endedBy[uid] = by
		}
		l.nEnded--
		if t := l.tasks[id]; t != nil && t.Sub.Token != "" {
			k := tokenKey{t.UID, t.Sub.Token}
			if l.tokens[k] == id {
				delete(l.tokens, k)
			}
		}
		delete(l.tasks, id)
		l.gone++
		if l.gone > 64 && l.gone > len(l.order)/2 {
			l.sweep()
		}
		return true
	}
	return false
}

// sweep drops forgotten ids from order.
func (l *Life) sweep() {
	keep := l.order[:0]
	for _, id := range l.order {
		if l.tasks[id] != nil {
			keep = append(keep, id)
		}
	}
	clear(l.order[len(keep):])
	l.order, l.gone = keep, 0
}

// --- compaction ---

// snapshot is the table as the journal may hold it: the highest id, the
// tasks not ended in id order, then the ended ones in the order they
// ended, each as a replay would rebuild it.
func (l *Life) snapshot() []*Record {
	recs := []*Record{{Op: opIDs, ID: l.nextID, Tag: l.tag}}
	var done []*Task
	l.Each(func(t *Task) bool {
		if t.IsEnded() {
			done = append(done, t)
		} else {
			recs = append(recs, &Record{Op: opTask, Task: t.onDisk()})
		}
		return true
	})
	slices.SortFunc(done, func(a, b *Task) int { return cmp.Compare(a.endSeq, b.endSeq) })
	for _, t := range done {
		recs = append(recs, &Record{Op: opTask, Task: t.onDisk()})
	}
	return recs
}

// maybeCompact starts a rewrite in the background when one is due.
func (l *Life) maybeCompact() {
	if l.replaying || l.compacting {
		return
	}
	size, _, broken := l.j.stats()
	if broken != nil {
		return // Recover rewrites it, when the broker tries again
	}
	since := time.Since(l.lastDone)
	if l.failBackoff > 0 && since < l.failBackoff {
		l.later(l.failBackoff - since)
		return
	}
	due := size >= compactGrowth*l.lastSize+compactSlack
	if l.secretEnds != l.secretsOut {
		if wait := max(l.secretWait, 9*l.lastTook) - since; wait > 0 {
			l.later(wait)
		} else {
			due = true
		}
	}
	if due {
		l.compacting = true
		go func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if err := l.compact(); err != nil {
				l.log.Print(err)
			}
		}()
	}
}

// later checks again whether a rewrite is due after d.
func (l *Life) later(d time.Duration) {
	if l.timerSet {
		return
	}
	l.timerSet = true
	time.AfterFunc(d, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.timerSet = false
		l.maybeCompact()
	})
}

// compact rewrites the journal from a snapshot taken now, with the lock
// released while the file is written; records made durable meanwhile are
// carried over.
func (l *Life) compact() error {
	l.compacting = true
	recs := l.snapshot()
	gen := l.secretEnds
	l.j.beginCapture()
	l.mu.Unlock()
	start := time.Now()
	size, err := l.j.rewrite(encoder(recs), len(recs))
	took := time.Since(start)
	l.mu.Lock()
	l.compacting = false
	l.lastDone, l.lastTook = time.Now(), took
	if err != nil {
		l.failBackoff = min(max(2*l.failBackoff, time.Second), maxBackoff)
		return err
	}
	l.failBackoff = 0
	l.lastSize = size
	l.secretsOut = max(l.secretsOut, gen)
	if l.afterCompact != nil {
		l.afterCompact()
	}
	return nil
}

// String names the task for messages.
func (t *Task) String() string { return "task " + strconv.FormatUint(t.ID, 10) }
