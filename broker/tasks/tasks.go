package tasks

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/refusal"
	"github.com/npurun/npurun/broker/tasks/journal"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
)

// The operations of task-submit and of the supervisors: submit, show,
// wait, cancel, list, and the supervisors' reports. Each is called by the
// broker's protocol handler, which has read the request and the peer's
// credentials, holding no lock; the answer is data and a refusal.Refusal,
// which the handler turns into its reply.

// What a task operation may be refused for: a refusal.Refusal wraps one,
// and the broker maps it to its answer (errors.Is), in the one mapping of
// the lease table's and the task room's refusals to wire codes. A request
// the lease table refuses (its pool, its devices) comes back with the
// table's reason.
var (
	ErrBadRequest = errors.New("bad request") // malformed: the connection is closed after the answer
	ErrDenied     = errors.New("denied")      // the policy, or the asker's identity, refuses it
	ErrTooMany    = errors.New("too many")    // a cap is reached
	ErrNoSuchTask = errors.New("no such task")
	ErrBusy       = errors.New("busy")  // not now: ask again
	ErrSpool      = errors.New("spool") // the journal cannot be written now, or tasks are unavailable
	// ErrLeft is a submission whose submitter left before it was
	// recorded: it is not, and nobody reads an answer.
	ErrLeft = errors.New("the submitter left")
)

// Caps on what one submission and one watcher may hold.
const (
	maxEnvBytes     = 32 << 10 // environment, all variables together
	maxCommandBytes = 16 << 10 // argv, or the --run string
	maxPathBytes    = 4096     // cwd, log
	maxNotifyBytes  = 4096     // the notify command
	maxReasonBytes  = 1024     // a supervisor's reason
	maxAfter        = 1024     // --after ids
	maxWaitsPerConn = 64
	maxTimeSec      = wire.MaxTimeSec
	// A task's show reply and its supervisor's Spec must fit in one
	// message, with room for what is added later (a reason, devices).
	replyRoom = 8 << 10
	specRoom  = 1 << 10
)

// Info is t as asker may see it; full, for its owner and root, includes
// its command, directory, environment, log and the reason it ended (which
// names paths and programs). Another user sees that it exists, whose it
// is, its state and how it ended, and its command where [status]
// show_commands shows others' (Listing). pos is its place in line.
func Info(t *journal.Task, full bool, pos int) wire.TaskInfo {
	ti := wire.TaskInfo{
		ID: t.ID, User: t.User, UID: t.UID, Name: t.Sub.Name, State: t.Shown(),
		N: t.Sub.N, Pool: t.Sub.Pool, Mem: t.Sub.Mem, OOMRetries: t.Sub.OOMRetries, RetryOf: t.Sub.RetryOf, NoDevice: t.Sub.NoDevice, Devices: t.Devices,
		After: t.Sub.After, TimeSec: t.TimeSec, Position: pos,
		Submitted: t.Submitted, Started: t.Started, Ended: t.Ended, Held: t.Held, From: t.From,
		NeverRan: t.Started == 0 && (t.State == journal.Failed || t.State == journal.Cancelled),
	}
	if len(t.Devices) == 0 && len(t.Sub.Devices) > 0 {
		ti.Devices = t.Sub.Devices
	}
	if t.Status != nil {
		ti.Exit, ti.Signal = t.Status.Exit, t.Status.Signal
		ti.CPUMs, ti.MemPeak, ti.DevPeak = t.Status.CPUMs, t.Status.MemPeak, t.Status.DevicePeak
	}
	if full {
		ti.Command, ti.Cwd, ti.Env, ti.Log = command(t), t.Sub.Cwd, t.Sub.Env, t.Log
		ti.Token = t.Sub.Token
		ti.Reason = t.Reason
		if t.Status != nil && t.Status.Reason != "" {
			ti.Reason = t.Status.Reason
		}
	}
	return ti
}

// Listing is t as a listing shows it to asker: whole to its owner and
// root (Info's full); to another user, with its command where shows says
// another's command may be shown (npubroker status's rule, [status]
// show_commands), but never its directory, environment, log or reason.
func Listing(t *journal.Task, asker uint32, shows func(asker, owner uint32) bool, pos int) wire.TaskInfo {
	full := asker == t.UID || asker == 0
	ti := Info(t, full, pos)
	if !full && shows(asker, t.UID) {
		ti.Command = command(t)
	}
	return ti
}

func command(t *journal.Task) string {
	if t.Sub.Shell != "" {
		return t.Sub.Shell
	}
	parts := make([]string, len(t.Sub.Argv))
	for i, a := range t.Sub.Argv {
		parts[i] = shellQuote(a)
	}
	return strings.Join(parts, " ")
}

func shellQuote(s string) string {
	if s != "" && !strings.ContainsFunc(s, needsQuote) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// needsQuote tells whether r is not among the characters a word of a
// command shows unquoted (a list names each task's command).
func needsQuote(r rune) bool {
	return r >= utf8.RuneSelf || !bareChar[r]
}

var bareChar = func() (t [utf8.RuneSelf]bool) {
	for _, c := range "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%" {
		t[c] = true
	}
	return t
}()

// Unavailable says why tasks cannot be taken up now (the journal cannot
// be opened, the supervisor program is missing or untrusted), nil when
// they can. A submission with a token (token) is asked to ask again, not
// told of a spool: whether an earlier submission with the token was
// recorded cannot be told now.
func (room *Room) Unavailable(token bool) error {
	room.mu.Lock()
	defer room.mu.Unlock()
	return room.unavailableLocked(token)
}

func (room *Room) unavailableLocked(token bool) error {
	if room.life != nil {
		return nil
	}
	r := refusal.New(ErrSpool, "leases are served meanwhile; the broker tries again by itself (see npubroker(8))", "tasks are unavailable: %v", room.taskErr)
	if token {
		r.Err = ErrBusy
	}
	return r
}

// taskFor is task id as asker uid may name it: its own, or anyone's for
// root.
func (room *Room) taskFor(uid uint32, id uint64) (*journal.Task, error) {
	if err := room.unavailableLocked(false); err != nil {
		return nil, err
	}
	t := room.life.Get(id)
	if t == nil || (t.UID != uid && uid != 0) {
		return nil, refusal.New(ErrNoSuchTask, "", "no task %d", id)
	}
	return t, nil
}

// jobFor is taskFor, and the task's entry in the line (nil: none, as for
// an ended task): the one lookup of what is asked of a task by id (show,
// wait, hold, release, cancel).
func (room *Room) jobFor(uid uint32, id uint64) (*journal.Task, *Task, error) {
	t, err := room.taskFor(uid, id)
	if err != nil {
		return nil, nil, err
	}
	return t, room.jobs[t.ID], nil
}

// infoLocked is task t, whose entry in the line is j (nil: none), as its
// owner sees it, with its place in line and why it waits.
func (room *Room) infoLocked(t *journal.Task, j *Task) wire.TaskInfo {
	ti := Info(t, true, room.positionLocked(j))
	if j != nil && t.IsWaiting() {
		ti.Reason = room.waitReasonLocked(j)
	}
	return ti
}

// Show is task id as its owner (uid, or root) sees it, with its place in
// line and why it waits.
func (room *Room) Show(uid uint32, id uint64) (wire.TaskInfo, error) {
	room.mu.Lock()
	defer room.unlock()
	t, j, err := room.jobFor(uid, id)
	if err != nil {
		return wire.TaskInfo{}, err
	}
	return room.infoLocked(t, j), nil
}

// Wait has w told of task id's end (Watcher.TaskEnded), for asker uid.
// A task that has ended is returned at once; else nil, and w is told
// later (once, however often it asks).
func (room *Room) Wait(w Watcher, uid uint32, id uint64) (*wire.TaskInfo, error) {
	room.mu.Lock()
	defer room.unlock()
	t, j, err := room.jobFor(uid, id)
	if err != nil {
		return nil, err
	}
	if t.IsEnded() || j == nil {
		ti := Info(t, true, 0)
		return &ti, nil
	}
	if slices.Contains(j.waits, w) {
		return nil, nil
	}
	if len(room.watching[w]) >= maxWaitsPerConn {
		return nil, refusal.New(ErrTooMany, "", "one connection waits for at most %d tasks", maxWaitsPerConn)
	}
	j.waits = append(j.waits, w)
	room.watching[w] = append(room.watching[w], j)
	return nil, nil
}

// Unwatch forgets w, which is closed, in the tasks it waits for. The owner
// may call it holding its lock.
func (room *Room) Unwatch(w Watcher) {
	room.mu.Lock()
	defer room.mu.Unlock()
	for _, t := range room.watching[w] {
		if i := slices.Index(t.waits, w); i >= 0 {
			t.waits = slices.Delete(t.waits, i, i+1)
		}
	}
	delete(room.watching, w)
}

// unwatchLocked forgets that w waits for t, which has ended.
func (room *Room) unwatchLocked(w Watcher, t *Task) {
	ts := room.watching[w]
	if i := slices.Index(ts, t); i >= 0 {
		ts = slices.Delete(ts, i, i+1)
	}
	if len(ts) == 0 {
		delete(room.watching, w)
	} else {
		room.watching[w] = ts
	}
}

// Cancel serves a cancel of task id by asker uid, named who. A waiting
// task ends cancelled once that is recorded, and not otherwise; a
// starting or running one is asked to stop. The answer says what became
// of it.
func (room *Room) Cancel(uid uint32, who string, id uint64) (wire.TaskInfo, error) {
	room.mu.Lock()
	defer room.unlock()
	t, j, err := room.jobFor(uid, id)
	if err != nil {
		return wire.TaskInfo{}, err
	}
	switch {
	case t.Busy():
		return wire.TaskInfo{}, refusal.New(ErrBusy, "", "task %d is being cancelled already", t.ID)
	case t.IsWaiting() && j != nil:
		if err := room.cancelLocked(j, who); err != nil {
			return wire.TaskInfo{}, refusal.New(ErrSpool, "", "the broker could not record the cancel, so task %d still waits: %v", t.ID, err)
		}
	case (t.State == journal.Starting || t.State == journal.Running) && j != nil:
		j.cancelBy = who
		room.stopLocked(j)
	}
	return Info(t, true, 0), nil
}

// cancelLocked ends a waiting task as cancelled by who, once that is
// recorded; meanwhile it keeps its place in line but is not started. If
// the record cannot be made, it waits on as before.
func (room *Room) cancelLocked(j *Task, who string) error {
	if j.w != nil {
		room.holdLocked(j, true)
	}
	err := room.life.End(j.Task, journal.Cancelled, nil, "cancelled by "+who)
	if err == nil {
		return nil
	}
	room.log.Printf("task %d: cancel: %v", j.ID, err)
	if j.w != nil {
		room.holdLocked(j, room.heldLocked(j))
	}
	room.settleLocked(j) // its --after tasks may have ended meanwhile
	room.serveLocked()
	return err
}

// Submitter is who submits: the peer's uid (SO_PEERCRED) and its account.
type Submitter struct {
	UID     uint32
	Account *Account
}

// Submitted is the answer to a submission.
type Submitted struct {
	ID       uint64
	State    string // as clients see it
	Existing bool   // an earlier submission with the same token made it
	Position int    // waiting in line: its place
	Pool     string // waiting in line: its pool
	Reason   string // starting, running, blocked or ended: says so
}

// Submit validates a submission, makes it durable, then queues it. What
// depends on the submission alone is checked before the lock is taken: a
// flood of oversized or malformed submissions costs the others nothing.
// left tells whether the submitter has gone (a quick look at its socket:
// it is called holding the lock); a submission it left is not recorded
// (ErrLeft).
func (room *Room) Submit(by Submitter, sub *wire.Submission, left func() bool) (*Submitted, error) {
	return room.submit(by, sub, left, 0)
}

// submit is Submit, of a task submitted again from ended task from (0:
// none).
func (room *Room) submit(by Submitter, sub *wire.Submission, left func() bool, from uint64) (*Submitted, error) {
	if err := room.Unavailable(sub != nil && sub.Token != ""); err != nil {
		return nil, err
	}
	t, err := room.resolve(by, sub)
	if err != nil {
		return nil, err
	}
	t.From = from
	room.mu.Lock()
	defer room.unlock()
	// A repeat of a submission (its answer was lost) is answered with the
	// task it made, before anything that could refuse it: a refusal must
	// mean that no task was made.
	if tok := t.Sub.Token; tok != "" {
		old, recording := room.life.ByToken(by.UID, tok)
		switch {
		case recording:
			return nil, refusal.New(ErrBusy, "ask again", "a submission with the same token is being recorded")
		case old != nil && (old.Sub.Shell != t.Sub.Shell || !slices.Equal(old.Sub.Argv, t.Sub.Argv) || old.Sub.Cwd != t.Sub.Cwd):
			return nil, refusal.New(ErrBadRequest, "a token names one submission: give another", "token %q names task %d, another command or directory", tok, old.ID)
		case old != nil:
			return room.submittedLocked(room.jobs[old.ID], old, true), nil
		}
	}
	if err := room.admitLocked(by, t, 0); err != nil {
		return nil, err
	}
	if left() {
		// Its submitter gave up on it (and may be asking again on
		// another connection, with its token): it is not recorded. The
		// check and the token's registration (Submit) are one step
		// under the lock, so a repeat either finds it being recorded or
		// finds it was not.
		room.log.Printf("task %d: its submitter left before it was recorded; not recorded", t.ID)
		return nil, ErrLeft
	}
	// Durable before it is acknowledged or run; the lock is let go
	// meanwhile. The first task waiting in its pool is armed with it (see
	// warmUp).
	submit, unarm := room.life.Submit, func() {}
	if pool := room.taskPool(t); room.firstTaskLocked(t) {
		// Counted until it is in line: another submission meanwhile
		// (the lock is let go for the disk) is not first.
		submit = room.life.SubmitArmed
		if room.arming == nil {
			room.arming = map[string]int{}
		}
		room.arming[pool]++
		unarm = func() {
			if room.arming[pool]--; room.arming[pool] == 0 {
				delete(room.arming, pool)
			}
		}
	}
	if err := submit(t.Task); err != nil {
		unarm()
		room.log.Printf("task %d: %v", t.ID, err)
		return nil, refusal.New(ErrSpool, "the broker's state directory may be full; leases are not affected", "the broker could not record the task: %v", err)
	}
	room.jobs[t.ID] = t
	room.settleLocked(t)
	unarm()
	testHook(room.log, hookBeforeSubmitReply, t.ID)
	// The answer says what became of it once the line is served: started
	// at once, or its place in line.
	room.unlock()
	room.mu.Lock()
	return room.submittedLocked(room.jobs[t.ID], t.Task, false), nil
}

// submittedLocked is the answer to a submission that made task t (j, what
// the room holds for it, nil once it has ended); existing tells that an
// earlier submission with the same token made it.
func (room *Room) submittedLocked(j *Task, t *journal.Task, existing bool) *Submitted {
	rep := &Submitted{ID: t.ID, State: t.Shown(), Existing: existing}
	switch t.State {
	case journal.Pending:
		if j != nil && j.inLine {
			rep.Position, rep.Pool = room.positionLocked(j), j.w.Pool
		}
	case journal.Starting, journal.Running:
		rep.Reason = "starting"
		if existing {
			rep.Reason = "running"
		}
		if len(t.Devices) > 0 {
			rep.Reason += " on " + room.inv.Vendor.Format(t.Devices)
		}
	case journal.Blocked:
		rep.Reason = "waits for task " + joinIDs(t.Sub.After)
	default:
		rep.Reason = t.State + ": " + t.Reason
		if t.Status != nil && t.Status.Reason != "" && t.Reason == "" {
			rep.Reason = t.State + ": " + t.Status.Reason
		}
	}
	return rep
}

// cpuPool is the pool of the --no-device tasks' waiters, for CPU slots.
const cpuPool = "cpu"

// firstTaskLocked tells whether t, not yet submitted, would be the first
// task waiting in its pool: none waits there, nor is being submitted armed.
func (room *Room) firstTaskLocked(t *Task) bool {
	pool := room.taskPool(t)
	if room.arming[pool] > 0 {
		return false
	}
	if t.Sub.NoDevice {
		return room.cpuq.Tasks(pool) == 0
	}
	return room.table.Tasks(pool) == 0
}

// taskPool is the pool t waits in.
func (room *Room) taskPool(t *Task) string {
	if t.Sub.NoDevice {
		return cpuPool
	}
	return room.table.PoolName(t.Sub.Pool)
}

// unknownID stands for a task's id until it gets one: no id is longer, so
// sizes counted with it bound those counted with the real one.
const unknownID = ^uint64(0)

// resolve checks a submission on its own, without the lock, and resolves
// it into a task (no id yet, its default log named with unknownID).
func (room *Room) resolve(by Submitter, sub *wire.Submission) (*Task, error) {
	bad := func(format string, args ...any) (*Task, error) {
		return nil, refusal.New(ErrBadRequest, "", format, args...)
	}
	acct := by.Account
	switch {
	case sub == nil:
		return bad("submit without a task")
	case (len(sub.Argv) == 0) == (sub.Shell == ""):
		return bad("a task needs either a command or a shell string, not both or neither")
	case !filepath.IsAbs(sub.Cwd):
		return bad("working directory %q is not absolute", sub.Cwd)
	case sub.Log != "" && !filepath.IsAbs(sub.Log):
		return bad("log %q is not absolute", sub.Log)
	case byteSize(sub.Env) > maxEnvBytes:
		return bad("environment of %d bytes, more than %d", byteSize(sub.Env), maxEnvBytes)
	case byteSize(sub.Argv)+len(sub.Shell) > maxCommandBytes:
		return bad("command of %d bytes, more than %d", byteSize(sub.Argv)+len(sub.Shell), maxCommandBytes)
	case len(sub.Notify) > maxNotifyBytes:
		return bad("notify command of %d bytes, more than %d", len(sub.Notify), maxNotifyBytes)
	case sub.Notify != "" && sub.NoNotify:
		return bad("a notify command and no notify exclude each other")
	case len(sub.Cwd) > maxPathBytes || len(sub.Log) > maxPathBytes:
		return bad("path longer than %d bytes", maxPathBytes)
	case sub.TimeSec < 0:
		return bad("negative time limit")
	case sub.TimeSec > maxTimeSec:
		// Checked before it is multiplied: 9223372037 s would wrap.
		return bad("time limit of %d seconds is out of range (at most %d, a century)", sub.TimeSec, maxTimeSec)
	case sub.N < 0:
		return bad("bad device count %d", sub.N)
	case sub.NoDevice && (sub.N != 0 || len(sub.Devices) > 0 || sub.Pool != ""):
		return bad("a --no-device task takes no device, count or pool")
	case wire.CheckName("task", sub.Name, wire.MaxTaskName) != nil:
		return bad("%v", wire.CheckName("task", sub.Name, wire.MaxTaskName))
	case len(sub.After) > maxAfter:
		return bad("--after names %d tasks, more than %d", len(sub.After), maxAfter)
	case len(sub.Token) > wire.MaxToken || strings.IndexFunc(sub.Token, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0:
		return bad("token of %d bytes: a token is at most %d bytes of printable ASCII, no space", len(sub.Token), wire.MaxToken)
	case acct.Unanswered() != nil:
		// Not an answer: the task would be recorded as "uid N", its log
		// under "/" (issue 15.3), or run without some of its groups.
		// Nothing is recorded; it is for the submitter to try again, as
		// for any passing shortage.
		return nil, refusal.New(ErrBusy, "try again in a moment", "the user database cannot be read now, so the task was not submitted: %v", acct.Unanswered())
	case sub.Shell != "" && acct.ShellErr != nil:
		return nil, refusal.New(ErrBusy, "try again in a moment", "the user database cannot be read now, so the task was not submitted: %v", acct.ShellErr)
	case sub.Log == "" && acct.Home == "":
		return nil, refusal.New(ErrBadRequest, "give --log FILE", "%s has no home directory, and a task's log goes under it unless --log names another", acct.Name)
	}
	if room.unpriv && by.UID != uint32(os.Geteuid()) {
		return nil, refusal.New(ErrDenied, "", "this broker runs unprivileged as uid %d and can run tasks for that uid only", os.Geteuid())
	}
	t := &Task{acct: acct, Task: &journal.Task{
		UID: by.UID, User: acct.Name, Sub: *sub, Submitted: time.Now().UnixMilli(), Slot: -1,
	}}
	t.Sub.Env = cleanEnv(sub.Env)
	after := slices.Clone(sub.After)
	slices.Sort(after)
	t.Sub.After = slices.Compact(after)
	if len(t.Sub.After) == 0 {
		t.Sub.After = nil
	}
	if sub.Shell != "" {
		t.Argv = []string{acct.Shell, "-c", sub.Shell}
	} else {
		t.Argv = slices.Clone(sub.Argv)
	}
	t.Log, t.Notify = sub.Log, sub.Notify
	if t.Log == "" {
		// Its size is all that counts until it has its id and the tag.
		t.Log = wire.DefaultLog(acct.Home, unknownID, strings.Repeat("f", journal.TagLen))
	}
	if err := room.checkSize(t.Task); err != nil {
		return nil, err
	}
	return t, nil
}

// Unanswered is why the user database gave no answer about the account
// now (Account.Err), nil when it answered.
func (a *Account) Unanswered() error { return a.Err }

// admitLocked checks a resolved task against the policy and the
// room's state, and gives it its id; it is not recorded yet. freed is
// how many tasks not ended its record ends (an out-of-memory retry's: the
// task it retries).
func (room *Room) admitLocked(by Submitter, t *Task, freed int) error {
	sub := &t.Sub
	acct := by.Account
	lim := room.policy().LimitFor(acct.Name, acct.Groups)
	limit := time.Duration(sub.TimeSec) * time.Second
	if limit == 0 {
		limit = room.policy().Tasks.TimeLimit
	}
	if limit == 0 {
		limit = room.policy().Tasks.MaxTime // a cap applies to tasks that name no limit too
	}
	if why := room.policy().Tasks.TimeRefusal(limit); why != "" {
		return refusal.New(ErrDenied, "", "%s", why)
	}
	t.TimeSec = int64(limit / time.Second)
	if t.Notify == "" && !sub.NoNotify && room.policy().Tasks.Notify != "" {
		t.Notify = room.policy().Tasks.Notify // resolved now: its journal record keeps it
		if err := room.checkSize(t.Task); err != nil {
			return err
		}
	}
	if room.life.Live()-freed >= room.policy().Tasks.MaxTasks {
		return refusal.New(ErrTooMany, "", "the broker holds %d tasks, its most", room.policy().Tasks.MaxTasks)
	}
	if n := room.life.Waiting(by.UID); lim.MaxQueued > 0 && n >= lim.MaxQueued {
		return refusal.New(ErrDenied, "", "%s has %s waiting, the limit (%s)", acct.Name, quantity.Count(n, "task", "tasks"), lim.Source)
	}
	for _, dep := range sub.After {
		d := room.life.Get(dep)
		if d == nil || (d.UID != by.UID && by.UID != 0) {
			return refusal.New(ErrNoSuchTask, "", "--after %d: no task %d", dep, dep)
		}
	}
	// Check the request now, so that a bad one is refused, not queued.
	if _, err := room.waiterLocked(t); err != nil {
		return err
	}
	t.ID = room.life.NewID()
	if sub.Log == "" {
		t.Log = wire.DefaultLog(acct.Home, t.ID, room.life.Tag())
	}
	return nil
}

// checkSize refuses a task whose messages would not fit: its show reply,
// and the Spec its supervisor reads, as encoded, where JSON writes a
// control character, <, > or & as 6 bytes. The sizes are counted, not
// encoded; replyLen and specLen bound the encodings from above
// (TestEncodedSizeBounds).
func (room *Room) checkSize(t *journal.Task) error {
	const why = "JSON writes each control character, <, > and & as 6 bytes"
	if n := replyLen(t); n+replyRoom > wire.MaxMessage {
		return refusal.New(ErrBadRequest, "", "task too large: its command, environment and paths take %d bytes encoded, more than %d (%s)", n, wire.MaxMessage-replyRoom, why)
	}
	if n := room.specLen(t); n+specRoom > wire.MaxMessage {
		return refusal.New(ErrBadRequest, "", "task too large: what its supervisor is given takes %d bytes encoded, more than %d (%s)", n, wire.MaxMessage-specRoom, why)
	}
	return nil
}

// Room for the field names, numbers and ids of a show reply and a Spec
// beside their strings.
const (
	replyFrame = 1 << 10
	specFrame  = 512
)

// replyLen bounds the size of t's show reply (full, with its environment).
func replyLen(t *journal.Task) int {
	return replyFrame + jsonListLen(t.Sub.Env) + jsonLen(command(t)) + jsonLen(t.Sub.Cwd) + jsonLen(t.Log) +
		jsonLen(t.Sub.Name) + jsonLen(t.User) + jsonLen(t.Sub.Pool) + 21*len(t.Sub.After) + 12*len(t.Sub.Devices)
}

// specLen bounds the size of t's Spec, with the variables the room adds.
func (room *Room) specLen(t *journal.Task) int {
	n := specFrame + jsonListLen(t.Sub.Env) + jsonListLen(t.Argv) + jsonLen(t.Sub.Cwd) + jsonLen(t.Log) + 2*jsonLen(room.socket) +
		jsonLen(t.Notify) + jsonLen(t.Sub.Name)
	if t.Sub.NoDevice {
		n += jsonListLen(npu.HiddenEnv()) + 3*(len("OPENBLAS_NUM_THREADS=")+24)
	}
	return n
}

// jsonLen is the length of s as encoding/json writes it, quotes included:
// \" \\ \n \r \t take 2 bytes, other control characters, <, > and & (HTML
// escaping), U+2028, U+2029 and each byte of invalid UTF-8 take 6.
func jsonLen(s string) int {
	n := 2
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t':
				n += 2
			case c < 0x20 || c == '<' || c == '>' || c == '&':
				n += 6
			default:
				n++
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || r == '\u2028' || r == '\u2029' {
			n += 6
		} else {
			n += size
		}
		i += size
	}
	return n
}

// jsonListLen is the length of a JSON array of strings.
func jsonListLen(list []string) int {
	n := 2
	for _, s := range list {
		n += jsonLen(s) + 1
	}
	return n
}

func byteSize(list []string) int {
	n := 0
	for _, s := range list {
		n += len(s) + 1
	}
	return n
}

// leakVars are variables of the submitter's environment a task must not
// inherit: they belong to a lease or a broker of the submitter's session,
// and the task gets its own.
var leakVars = []string{"NPURUN_LEASE", "NPURUN_DEVICES", "NPURUN_SOCKET", "NPURUN_TASK_ID",
	"ASCEND_RT_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"}

func cleanEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		name, _, ok := strings.Cut(kv, "=")
		if ok && name != "" && !slices.Contains(leakVars, name) {
			out = append(out, kv)
		}
	}
	return out
}

// Done takes a supervisor's report of task id's end. Only the task's
// supervisor may make it: the submitter's uid and the supervisor's pid,
// from SO_PEERCRED (uid, pid). The supervisor is answered once the end is
// recorded; if it cannot be, it is told so (ErrSpool) and reports again
// later.
func (room *Room) Done(uid uint32, pid int32, id uint64, st *wire.Status) error {
	room.mu.Lock()
	defer room.unlock()
	if err := room.unavailableLocked(false); err != nil {
		return err
	}
	t := room.life.Get(id)
	ok := t != nil && st != nil && uid == t.UID &&
		(t.State == journal.Running || t.State == journal.Lost) &&
		t.PID != 0 && int(pid) == t.PID
	if !ok {
		return refusal.New(ErrDenied, "", "not the supervisor of a running task %d", id)
	}
	if len(st.Reason) > maxReasonBytes {
		st.Reason = st.Reason[:maxReasonBytes] + "…"
	}
	// What the task used is the broker's to say, from its control group.
	st.CPUMs, st.MemPeak, st.DevicePeak = 0, 0, 0
	if j := room.jobs[id]; j != nil {
		cpu, peak := room.run.Usage(j)
		st.CPUMs, st.MemPeak = cpu.Milliseconds(), peak
	}
	if t.Sub.Mem > 0 && room.devPeak != nil {
		st.DevicePeak = room.devPeak(id)
	}
	state := wire.EndState(st)
	var retry *Task
	reason := ""
	if state == journal.Failed && st.OOM && t.Sub.Mem > 0 && t.Sub.OOMRetries > 0 {
		var err error
		retry, err = room.oomRetryLocked(t, st.DevicePeak)
		if errors.Is(err, ErrBusy) {
			// The user database cannot be read now: the end waits with
			// its retry, rather than go in without it.
			return refusal.New(ErrBusy, "report again later", "task %d ran out of device memory, and its retry cannot be submitted now: %v", id, err)
		}
		if err != nil {
			room.log.Printf("task %d ran out of device memory: its retry was not submitted: %v", id, err)
			reason = "out of device memory: not retried: " + err.Error()
		} else {
			reason = oomReason(retry.Sub.Mem)
		}
	}
	var rtask *journal.Task
	if retry != nil {
		rtask = retry.Task
	}
	if err := room.life.EndRetried(t, state, st, reason, rtask); err != nil {
		room.log.Printf("task %d: %v", id, err)
		return refusal.New(ErrSpool, "report again later", "the broker could not record the end of task %d: %v", id, err)
	}
	testHook(room.log, hookAfterEnd, id)
	if retry != nil {
		room.retriedLocked(id, retry)
	}
	return nil
}

// NotStarted takes a supervisor's word that its task never got its
// go-ahead: the broker that recorded its start died before sending it (or
// this one could not send it). Only the supervisor of the task's start
// record may say so (the submitter's uid and the supervisor's pid, from
// SO_PEERCRED), and it will never run the task after saying it: so the
// task, which never ran, goes back in line (at most once still holds), or
// ends cancelled if a cancel came meanwhile. The supervisor is answered
// once that is recorded; an error answer tells it there is nothing to undo
// (its task's start was never recorded: ErrDenied), ErrBusy or ErrSpool
// to ask again.
func (room *Room) NotStarted(uid uint32, pid int32, id uint64) error {
	room.mu.Lock()
	defer room.unlock()
	if err := room.unavailableLocked(false); err != nil {
		return err
	}
	t := room.life.Get(id)
	j := room.jobs[id]
	if t == nil || j == nil || uid != t.UID || t.State != journal.Running || t.PID == 0 || int(pid) != t.PID {
		return refusal.New(ErrDenied, "", "not the supervisor of a running task %d", id)
	}
	if j.launching {
		// Its go-ahead is being sent (or failed): launch is not done
		// with it yet.
		return refusal.New(ErrBusy, "ask again", "task %d is being started", id)
	}
	slot := t.Slot
	var err error
	if j.cancel {
		err = room.life.End(t, journal.Cancelled, nil, "cancelled by "+j.cancelBy+" before it started")
	} else if err = room.life.Unstart(t, int(pid)); err == nil {
		room.log.Printf("task %d never got its go-ahead (its supervisor %d says so): it waits again", id, pid)
		if slot >= 0 && slot < len(room.cpuFree) {
			room.cpuFree[slot] = true
		}
		j.overran = false
		room.run.Unstarted(j)
		if j.w != nil {
			// This broker's own grant, whose go-ahead it could not
			// send: back in the place it had.
			room.requeueLocked(j)
			room.serveLocked()
		} else {
			room.settleLocked(j) // adopted at a restart: it queues anew
		}
	}
	if err != nil {
		room.log.Printf("task %d: %v", id, err)
		return refusal.New(ErrSpool, "ask again later", "the broker could not record that task %d never started: %v", id, err)
	}
	return nil
}

func joinIDs(ids []uint64) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.FormatUint(id, 10)
	}
	return strings.Join(parts, ", ")
}

// waitReasonLocked says why a waiting task waits beyond its turn, if it
// does: the tasks it waits for, its user's cap on running tasks or on
// devices, task starts paused.
func (room *Room) waitReasonLocked(j *Task) string {
	if j.Held {
		return fmt.Sprintf("held: it keeps its place in line, and 'task-submit release %d' lets it start", j.ID)
	}
	if j.State == journal.Blocked {
		var ids []uint64
		for _, dep := range j.Sub.After {
			if d := room.life.Get(dep); d != nil && !d.IsEnded() {
				ids = append(ids, dep)
			}
		}
		return "waits for task " + joinIDs(ids) + " to succeed"
	}
	w := j.w
	switch {
	case j.lookupErr != nil:
		return "waits until the user database can be read: " + j.lookupErr.Error()
	case room.paused != nil:
		return "task starts are paused: " + room.paused.why.Error()
	case w == nil:
		return ""
	case w.Limit.MaxRunning > 0 && room.running[j.UID] >= w.Limit.MaxRunning:
		return fmt.Sprintf("%s runs %d of %s allowed (%s)", w.User, room.running[j.UID], quantity.Count(w.Limit.MaxRunning, "task", "tasks"), w.Limit.Source)
	case !j.Sub.NoDevice && room.outside != nil:
		return room.outside.Why(w, room.table.Reason(w))
	case !j.Sub.NoDevice:
		return room.table.Reason(w)
	}
	return ""
}

// positionLocked is a waiting task's place in its line, 0 otherwise.
func (room *Room) positionLocked(t *Task) int {
	if t == nil || !t.inLine {
		return 0
	}
	if !t.Sub.NoDevice {
		return room.table.Position(t.w)
	}
	pos := 0
	for _, w := range room.cpuq.Waiters() {
		if w.Pool == t.w.Pool {
			pos++
		}
		if w == t.w {
			return pos
		}
	}
	return 0
}

// Listings are served a page at a time: the client asks for the next page
// with the "next" of the last reply. Under the lock a page costs a bounded
// walk (listScan ids at most, from where the last page stopped) and
// shallow copies of at most listPage tasks; the broker puts their replies
// together and encodes them outside the lock, and sends them from the
// connection's goroutine. So a listing never holds the lock for long nor
// keeps more than one page in memory.
const (
	listScan = 4096
	listPage = 256

	listedFrame = 160 // a listed task's keys and numbers, about (Page)
)

// Listed is a task copied for a page of a listing, with its place in line.
type Listed struct {
	Task  journal.Task
	Pos   int
	Start time.Time // when it starts at the latest, waiting for devices (lease.Place.Start); zero: unknown
}

// Filter narrows a listing: with Ended, to the ended tasks alone, those
// that ended from Since (Unix ms) on.
type Filter struct {
	Ended bool
	Since int64
}

// keeps tells whether f lists t.
func (f Filter) keeps(t *journal.Task) bool {
	return !f.Ended || (t.IsEnded() && t.Ended >= f.Since)
}

// Page copies one page of a listing for asker uid into page (emptied
// first: its room is reused): its tasks (everyone's with all) with ids
// above after that f keeps, oldest first. more tells that others follow,
// from next.
func (room *Room) Page(uid uint32, all bool, after uint64, f Filter, page []Listed) (_ []Listed, next uint64, more bool, err error) {
	room.mu.Lock()
	defer room.unlock()
	if err := room.unavailableLocked(false); err != nil {
		return page[:0], 0, false, err
	}
	page = page[:0]
	scanned, size := 0, 0
	var inLine []*lease.Waiter
	room.life.EachAfter(after, func(t *journal.Task) bool {
		if scanned == listScan || len(page) == listPage || size > wire.MaxMessage {
			more = true
			return false
		}
		scanned++
		next = t.ID
		if (!all && t.UID != uid) || !f.keeps(t) {
			return true
		}
		page = append(page, Listed{Task: *t})
		if j := room.jobs[t.ID]; j != nil && j.inLine {
			inLine = append(inLine, j.w)
		}
		// A guess at its size, to stop copying once a message is full:
		// its keys and numbers (a pending task's take some 100 bytes) and
		// its strings as they are. The encoding decides: what does not
		// fit goes in the next page. (A guess far on the high side filled
		// a message only half, and a listing took twice the pages.)
		size += listedFrame + len(t.Sub.Name) + len(t.User) + len(t.Sub.Pool) + 12*(len(t.Devices)+len(t.Sub.Devices)) + 21*len(t.Sub.After)
		if t.UID == uid || uid == 0 {
			size += len(t.Sub.Shell) + byteSize(t.Sub.Argv) + len(t.Sub.Cwd) + len(t.Log) + len(t.Reason) + len(t.Sub.Token)
		}
		return true
	})
	if len(inLine) > 0 {
		pos := room.positionsOfLocked(inLine)
		starts := make(map[*lease.Waiter]time.Time, len(inLine))
		for _, w := range inLine {
			if t := taskOf(w); t != nil && !t.Sub.NoDevice {
				starts[w] = time.Time{}
			}
		}
		if len(starts) > 0 {
			room.table.Starts(starts)
		}
		for i := range page {
			if j := room.jobs[page[i].Task.ID]; j != nil && j.inLine {
				page[i].Pos, page[i].Start = pos[j.w], starts[j.w]
			}
		}
	}
	return page, next, more, nil
}

// positionsOfLocked is the place in line of each of ws, walking each line
// only as far as the last of them in it.
func (room *Room) positionsOfLocked(ws []*lease.Waiter) map[*lease.Waiter]int {
	want := make(map[*lease.Waiter]int, len(ws))
	inTable := make(map[*lease.Waiter]int, len(ws))
	left := 0 // in the CPU slots' queue
	for _, w := range ws {
		if t := taskOf(w); t != nil && t.Sub.NoDevice {
			want[w] = 0
			left++
		} else {
			inTable[w] = 0
		}
	}
	if len(inTable) > 0 {
		room.table.Positions(inTable)
	}
	if left > 0 {
		room.cpuq.Positions(want)
	}
	for w, pos := range inTable {
		want[w] = pos
	}
	return want
}

// Keeps tells whether the table keeps task id started at started (Unix
// ms, within a minute: the accounting log's time of its lease): ids start
// again with a new journal, so an id alone may name an older task.
func (room *Room) Keeps(id uint64, started int64) bool {
	room.mu.Lock()
	defer room.mu.Unlock()
	if room.life == nil {
		return false
	}
	t := room.life.Get(id)
	return t != nil && t.Started != 0 && t.Started-started < 60_000 && started-t.Started < 60_000
}
