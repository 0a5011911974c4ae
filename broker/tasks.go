package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/tasklife"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
)

// The broker's side of detached tasks: the operations of task-submit and
// of the supervisors, and the scheduling of tasks. What a task is and how
// its state changes is package tasklife's; the broker keeps, for each task
// that has not ended, what it needs to run it.

// task is a task that has not ended, and what the broker holds for it.
type task struct {
	*tasklife.Task
	acct      *account      // the submitter, as looked up at submission
	w         *lease.Waiter // its place in line (kept while it starts, to put it back)
	inLine    bool          // w is in a queue
	waits     []*conn       // connections waiting for its end
	cancel    bool          // a cancel came while it was starting or running
	heard     bool          // running: its supervisor spoke since its go-ahead (or was adopted), so it catches SIGTERM
	cancelBy  string        // who cancelled it
	overran   bool          // the broker killed it for overrunning its time limit
	launching bool          // launch is giving it its go-ahead
	sup       *supervisor   // its supervisor, once started (warm while it waits)
	cgroup    bool          // its control group may exist (cgroup.go)
	lookupErr error         // its account could not be looked up: it waits out of line (lookupLaterLocked)
}

// Caps on what one submission and one connection may hold.
const (
	maxEnvBytes     = 32 << 10 // environment, all variables together
	maxCommandBytes = 16 << 10 // argv, or the --run string
	maxPathBytes    = 4096     // cwd, log
	maxReasonBytes  = 1024     // a supervisor's reason
	maxAfter        = 1024     // --after ids
	maxWaitsPerConn = 64
	maxTimeSec      = client.MaxTimeSec
	// A task's show reply and its supervisor's Spec must fit in one
	// message, with room for what is added later (a reason, devices).
	replyRoom = 8 << 10
	specRoom  = 1 << 10
)

// info is t as asker may see it; full, for its owner and root, includes
// its command, directory, environment, log and the reason it ended (which
// names paths and programs). Another user sees that it exists, whose it
// is, its state and how it ended.
func info(t *tasklife.Task, full bool, pos int) client.TaskInfo {
	ti := client.TaskInfo{
		ID: t.ID, User: t.User, UID: t.UID, Name: t.Sub.Name, State: t.Shown(),
		N: t.Sub.N, Pool: t.Sub.Pool, NoDevice: t.Sub.NoDevice, Devices: t.Devices,
		After: t.Sub.After, TimeSec: t.TimeSec, Position: pos,
		Submitted: t.Submitted, Started: t.Started, Ended: t.Ended,
	}
	if len(t.Devices) == 0 && len(t.Sub.Devices) > 0 {
		ti.Devices = t.Sub.Devices
	}
	if t.Status != nil {
		ti.Exit, ti.Signal = t.Status.Exit, t.Status.Signal
		ti.CPUMs, ti.MemPeak = t.Status.CPUMs, t.Status.MemPeak
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

func command(t *tasklife.Task) string {
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
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// noTasksLocked is the reply to a task operation while tasks cannot be
// taken up: the journal cannot be opened, or the supervisor program is
// missing or untrusted.
func (s *Server) noTasksLocked() *client.Reply {
	return errReply(client.CodeSpool, "tasks are unavailable: "+s.taskErr.Error(),
		"leases are served meanwhile; the broker tries again by itself (see npubroker(8))")
}

// taskOp serves the task operations.
func (s *Server) taskOp(c *conn, req *client.Request) bool {
	s.mu.Lock()
	if s.life == nil {
		rep := s.noTasksLocked()
		if req.Op == client.OpSubmit && req.Task != nil && req.Task.Token != "" {
			// Not "spool": whether an earlier submission with this
			// token was recorded cannot be told now. Ask again.
			rep.Code = client.CodeBusy
		}
		c.sendLocked(rep)
		s.mu.Unlock()
		return true
	}
	s.mu.Unlock()
	switch req.Op {
	case client.OpSubmit:
		return s.submit(c, req.Task)
	case client.OpTaskDone:
		return s.taskDone(c, req.ID, req.Status)
	case client.OpNotStarted:
		return s.taskNotStarted(c, req.ID)
	case client.OpList:
		return s.list(c, req.All, req.After)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.life.Get(req.ID)
	if t == nil || (t.UID != c.uid && c.uid != 0) {
		c.sendLocked(errReply(client.CodeNoSuchTask, fmt.Sprintf("no task %d", req.ID), ""))
		return true
	}
	switch req.Op {
	case client.OpShow:
		ti := info(t, true, s.positionLocked(s.jobs[t.ID]))
		if j := s.jobs[t.ID]; j != nil && t.IsWaiting() {
			ti.Reason = s.waitReasonLocked(j)
		}
		c.sendLocked(&client.Reply{Type: client.TypeTasks, Tasks: []client.TaskInfo{ti}})
	case client.OpWait:
		j := s.jobs[t.ID]
		if t.IsEnded() || j == nil {
			c.sendLocked(&client.Reply{Type: client.TypeTasks, Tasks: []client.TaskInfo{info(t, true, 0)}})
		} else if !slices.Contains(c.waiting, j) {
			if len(c.waiting) >= maxWaitsPerConn {
				c.sendLocked(errReply(client.CodeTooMany, fmt.Sprintf("one connection waits for at most %d tasks", maxWaitsPerConn), ""))
				return false
			}
			j.waits = append(j.waits, c)
			c.waiting = append(c.waiting, j)
		}
	case client.OpCancel:
		return s.cancel(c, t)
	}
	return true
}

// cancel serves a cancel. A waiting task ends cancelled once that is
// recorded, and not otherwise; a starting or running one is asked to stop.
// The reply says what became of it.
func (s *Server) cancel(c *conn, t *tasklife.Task) bool {
	j := s.jobs[t.ID]
	switch {
	case t.Busy():
		c.sendLocked(errReply(client.CodeBusy, fmt.Sprintf("task %d is being cancelled already", t.ID), ""))
		return true
	case t.IsWaiting() && j != nil:
		if err := s.cancelLocked(j, c.acct.name); err != nil {
			c.sendLocked(errReply(client.CodeSpool, fmt.Sprintf("the broker could not record the cancel, so task %d still waits: %v", t.ID, err), ""))
			return true
		}
	case (t.State == tasklife.Starting || t.State == tasklife.Running) && j != nil:
		j.cancelBy = c.acct.name
		s.stopLocked(j)
	}
	c.sendLocked(&client.Reply{Type: client.TypeTasks, Tasks: []client.TaskInfo{info(t, true, 0)}})
	return true
}

// cancelLocked ends a waiting task as cancelled by who, once that is
// recorded; meanwhile it keeps its place in line but is not started. If
// the record cannot be made, it waits on as before.
func (s *Server) cancelLocked(j *task, who string) error {
	if j.w != nil {
		s.holdLocked(j, true)
	}
	err := s.life.End(j.Task, tasklife.Cancelled, nil, "cancelled by "+who)
	if err == nil {
		return nil
	}
	s.log.Printf("task %d: cancel: %v", j.ID, err)
	if j.w != nil {
		s.holdLocked(j, s.paused != nil)
	}
	s.settleLocked(j) // its --after tasks may have ended meanwhile
	s.scheduleLocked()
	return err
}

// submit validates a submission, makes it durable, then queues it. What
// depends on the submission alone is checked before the broker's lock is
// taken: a flood of oversized or malformed submissions costs the others
// nothing.
func (s *Server) submit(c *conn, sub *client.Submission) bool {
	t, rep := s.resolveTask(c, sub)
	if rep != nil {
		s.mu.Lock()
		c.sendLocked(rep)
		s.mu.Unlock()
		return rep.Code != client.CodeBadRequest
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// A repeat of a submission (its answer was lost) is answered with the
	// task it made, before anything that could refuse it: a refusal must
	// mean that no task was made.
	if tok := t.Sub.Token; tok != "" {
		old, recording := s.life.ByToken(c.uid, tok)
		switch {
		case recording:
			c.sendLocked(errReply(client.CodeBusy, "a submission with the same token is being recorded", "ask again"))
			return true
		case old != nil && (old.Sub.Shell != t.Sub.Shell || !slices.Equal(old.Sub.Argv, t.Sub.Argv) || old.Sub.Cwd != t.Sub.Cwd):
			c.sendLocked(errReply(client.CodeBadRequest, fmt.Sprintf("token %q names task %d, another command or directory", tok, old.ID), "a token names one submission: give another"))
			return false
		case old != nil:
			c.sendLocked(s.submittedLocked(s.jobs[old.ID], old, true))
			return true
		}
	}
	if rep := s.admitTaskLocked(c, t); rep != nil {
		c.sendLocked(rep)
		return rep.Code != client.CodeBadRequest
	}
	if c.peerGone() {
		// Its submitter gave up on it (and may be asking again on
		// another connection, with its token): it is not recorded. The
		// check and the token's registration (Submit) are one step
		// under the lock, so a repeat either finds it being recorded or
		// finds it was not.
		s.log.Printf("task %d: its submitter left before it was recorded; not recorded", t.ID)
		return false
	}
	// Durable before it is acknowledged or run; the lock is let go
	// meanwhile. The first task waiting in its pool is armed with it (see
	// warmUp).
	submit := s.life.Submit
	if pool := s.taskPool(t); s.firstTaskLocked(t) {
		// Counted until it is in line: another submission meanwhile
		// (the lock is let go for the disk) is not first.
		submit = s.life.SubmitArmed
		if s.arming == nil {
			s.arming = map[string]int{}
		}
		s.arming[pool]++
		defer func() {
			if s.arming[pool]--; s.arming[pool] == 0 {
				delete(s.arming, pool)
			}
		}()
	}
	if err := submit(t.Task); err != nil {
		s.log.Printf("task %d: %v", t.ID, err)
		c.sendLocked(errReply(client.CodeSpool, "the broker could not record the task: "+err.Error(),
			"the broker's state directory may be full; leases are not affected"))
		return true
	}
	s.jobs[t.ID] = t
	s.settleLocked(t)
	s.testHook(hookBeforeSubmitReply, t.ID)
	c.sendLocked(s.submittedLocked(t, t.Task, false))
	return true
}

// submittedLocked is the answer to a submission that made task t (j, what
// the broker holds for it, nil once it has ended); existing tells that an
// earlier submission with the same token made it.
func (s *Server) submittedLocked(j *task, t *tasklife.Task, existing bool) *client.Reply {
	rep := &client.Reply{Type: client.TypeSubmitted, ID: t.ID, State: t.Shown(), Existing: existing}
	switch t.State {
	case tasklife.Pending:
		if j != nil && j.inLine {
			rep.Position, rep.Pool = s.positionLocked(j), j.w.Pool
		}
	case tasklife.Starting, tasklife.Running:
		rep.Reason = "starting"
		if existing {
			rep.Reason = "running"
		}
		if len(t.Devices) > 0 {
			rep.Reason += " on " + s.inv.Vendor.Format(t.Devices)
		}
	case tasklife.Blocked:
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
func (s *Server) firstTaskLocked(t *task) bool {
	pool := s.taskPool(t)
	if s.arming[pool] > 0 {
		return false
	}
	if t.Sub.NoDevice {
		return s.cpuq.Tasks(pool) == 0
	}
	return s.table.Tasks(pool) == 0
}

// taskPool is the pool t waits in.
func (s *Server) taskPool(t *task) string {
	if t.Sub.NoDevice {
		return cpuPool
	}
	return s.table.PoolName(t.Sub.Pool)
}

// unknownID stands for a task's id until it gets one: no id is longer, so
// sizes counted with it bound those counted with the real one.
const unknownID = ^uint64(0)

// resolveTask checks a submission on its own, without the broker's lock,
// and resolves it into a task (no id yet, its default log named with
// unknownID).
func (s *Server) resolveTask(c *conn, sub *client.Submission) (*task, *client.Reply) {
	bad := func(format string, args ...any) (*task, *client.Reply) {
		return nil, errReply(client.CodeBadRequest, fmt.Sprintf(format, args...), "")
	}
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
	case len(sub.Name) > 200:
		return bad("name longer than 200 bytes")
	case len(sub.After) > maxAfter:
		return bad("--after names %d tasks, more than %d", len(sub.After), maxAfter)
	case len(sub.Token) > client.MaxToken || strings.IndexFunc(sub.Token, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0:
		return bad("token of %d bytes: a token is at most %d bytes of printable ASCII, no space", len(sub.Token), client.MaxToken)
	case c.acct.unanswered() != nil:
		// Not an answer: the task would be recorded as "uid N", its log
		// under "/" (issue 15.3), or run without some of its groups.
		// Nothing is recorded; it is for the submitter to try again, as
		// for any passing shortage.
		return nil, errReply(client.CodeBusy, fmt.Sprintf("the user database cannot be read now, so the task was not submitted: %v", c.acct.unanswered()), "try again in a moment")
	case sub.Shell != "" && c.acct.shellErr != nil:
		return nil, errReply(client.CodeBusy, fmt.Sprintf("the user database cannot be read now, so the task was not submitted: %v", c.acct.shellErr), "try again in a moment")
	case sub.Log == "" && c.acct.home == "":
		return nil, errReply(client.CodeBadRequest, fmt.Sprintf("%s has no home directory, and a task's log goes under it unless --log names another", c.acct.name), "give --log FILE")
	}
	if s.unprivileged && c.uid != uint32(os.Geteuid()) {
		return nil, errReply(client.CodeDenied, fmt.Sprintf("this broker runs unprivileged as uid %d and can run tasks for that uid only", os.Geteuid()), "")
	}
	t := &task{acct: c.acct, Task: &tasklife.Task{
		UID: c.uid, User: c.acct.name, Sub: *sub, Submitted: time.Now().UnixMilli(), Slot: -1,
	}}
	t.Sub.Env = cleanEnv(sub.Env)
	after := slices.Clone(sub.After)
	slices.Sort(after)
	t.Sub.After = slices.Compact(after)
	if len(t.Sub.After) == 0 {
		t.Sub.After = nil
	}
	if sub.Shell != "" {
		t.Argv = []string{c.acct.shell, "-c", sub.Shell}
	} else {
		t.Argv = slices.Clone(sub.Argv)
	}
	t.Log = sub.Log
	if t.Log == "" {
		// Its size is all that counts until it has its id and the tag.
		t.Log = client.DefaultLog(c.acct.home, unknownID, strings.Repeat("f", tasklife.TagLen))
	}
	if rep := s.checkSize(t.Task); rep != nil {
		return nil, rep
	}
	return t, nil
}

// admitTaskLocked checks a resolved task against the policy and the
// broker's state, and gives it its id; it is not recorded yet.
func (s *Server) admitTaskLocked(c *conn, t *task) *client.Reply {
	sub := &t.Sub
	lim := s.cfg.LimitFor(c.acct.name, c.acct.groups)
	limit := time.Duration(sub.TimeSec) * time.Second
	if limit == 0 {
		limit = s.cfg.Tasks.TimeLimit
	}
	if limit == 0 {
		limit = s.cfg.Tasks.MaxTime // a cap applies to tasks that name no limit too
	}
	if max := s.cfg.Tasks.MaxTime; max > 0 && limit > max {
		return errReply(client.CodeDenied, fmt.Sprintf("time limit %s is longer than the %s allowed", quantity.Duration(limit), quantity.Duration(max)), "")
	}
	t.TimeSec = int64(limit / time.Second)
	if s.life.Live() >= s.cfg.Tasks.MaxTasks {
		return errReply(client.CodeTooMany, fmt.Sprintf("the broker holds %d tasks, its most", s.cfg.Tasks.MaxTasks), "")
	}
	if n := s.life.Waiting(c.uid); lim.MaxQueued > 0 && n >= lim.MaxQueued {
		return errReply(client.CodeDenied, fmt.Sprintf("%s has %s waiting, the limit (%s)", c.acct.name, quantity.Count(n, "task", "tasks"), lim.Source), "")
	}
	for _, dep := range sub.After {
		d := s.life.Get(dep)
		if d == nil || (d.UID != c.uid && c.uid != 0) {
			return errReply(client.CodeNoSuchTask, fmt.Sprintf("--after %d: no task %d", dep, dep), "")
		}
	}
	// Check the request now, so that a bad one is refused, not queued.
	if _, rep := s.waiterLocked(t); rep != nil {
		return rep
	}
	t.ID = s.life.NewID()
	if sub.Log == "" {
		t.Log = client.DefaultLog(c.acct.home, t.ID, s.life.Tag())
	}
	return nil
}

// checkSize refuses a task whose messages would not fit: its show reply,
// and the Spec its supervisor reads, as encoded, where JSON writes a
// control character, <, > or & as 6 bytes. The sizes are counted, not
// encoded; replyLen and specLen bound the encodings from above
// (TestEncodedSizeBounds).
func (s *Server) checkSize(t *tasklife.Task) *client.Reply {
	const why = "JSON writes each control character, <, > and & as 6 bytes"
	if n := replyLen(t); n+replyRoom > client.MaxMessage {
		return errReply(client.CodeBadRequest, fmt.Sprintf("task too large: its command, environment and paths take %d bytes encoded, more than %d (%s)", n, client.MaxMessage-replyRoom, why), "")
	}
	if n := s.specLen(t); n+specRoom > client.MaxMessage {
		return errReply(client.CodeBadRequest, fmt.Sprintf("task too large: what its supervisor is given takes %d bytes encoded, more than %d (%s)", n, client.MaxMessage-specRoom, why), "")
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
func replyLen(t *tasklife.Task) int {
	return replyFrame + jsonListLen(t.Sub.Env) + jsonLen(command(t)) + jsonLen(t.Sub.Cwd) + jsonLen(t.Log) +
		jsonLen(t.Sub.Name) + jsonLen(t.User) + jsonLen(t.Sub.Pool) + 21*len(t.Sub.After) + 12*len(t.Sub.Devices)
}

// specLen bounds the size of t's Spec, with the variables the broker adds.
func (s *Server) specLen(t *tasklife.Task) int {
	n := specFrame + jsonListLen(t.Sub.Env) + jsonListLen(t.Argv) + jsonLen(t.Sub.Cwd) + jsonLen(t.Log) + 2*jsonLen(s.socket)
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

// waiterLocked makes the waiter that queues t.
func (s *Server) waiterLocked(t *task) (*lease.Waiter, *client.Reply) {
	acct := t.acct
	if t.Sub.NoDevice {
		if len(s.cpuFree) == 0 {
			return nil, errReply(client.CodeDenied, "this broker has no CPU slots for --no-device tasks ([tasks] cpu_slots = 0)", "")
		}
		w := &lease.Waiter{Holder: taskHolder(t), N: 1, Cand: s.cpuSlots, Pool: cpuPool, Ref: t,
			Limit: s.cfg.LimitFor(acct.name, acct.groups), Queued: time.Now()}
		return w, nil
	}
	w, rep := s.admitLocked(taskHolder(t), acct, t.Sub.N, t.Sub.Devices, t.Sub.Pool)
	if rep != nil {
		return nil, rep
	}
	w.Ref = t
	return w, nil
}

// taskHolder is the holder of t's lease: its submitter, as recorded.
func taskHolder(t *task) lease.Holder {
	return lease.Holder{Kind: lease.Task, UID: t.UID, User: t.User, Task: t.ID}
}

// settleLocked puts a waiting task where it belongs: in line, or blocked
// behind its --after tasks, or ended (failed) when one of them did not
// succeed or it cannot be queued. While the journal's tasks are taken up
// it only puts the task in line: the broker schedules once all of them are
// back (a pass per task would give the free devices to the first user's
// tasks before the other users' are in line to interleave with them).
func (s *Server) settleLocked(t *task) {
	if !s.life.Settle(t.Task) || t.inLine {
		return
	}
	if t.w == nil {
		if t.acct == nil || t.lookupErr != nil {
			t.acct = s.users.lookup(t.UID) // replayed from the journal
		}
		if err := t.acct.unanswered(); err != nil {
			// Its limits and pools depend on its account: it waits out
			// of line until the user database answers (a name service
			// not up yet at boot, no descriptors left), rather than be
			// judged on a stand-in's.
			s.lookupLaterLocked(t, err)
			return
		}
		t.lookupErr = nil
		w, rep := s.waiterLocked(t)
		if rep != nil {
			s.life.EndNow(t.Task, tasklife.Failed, "cannot be queued: "+rep.Message)
			return
		}
		t.w = w
	}
	s.addLineLocked(t, false)
	if !s.loading {
		s.scheduleLocked()
	}
}

// Waits before the accounts of waiting tasks are looked up again, after a
// lookup failed for a reason that passes.
const (
	firstLookupWait = time.Second
	maxLookupWait   = 30 * time.Second
)

// lookupLaterLocked keeps waiting task t out of line until its account can
// be looked up, and arranges for it to be settled again then.
func (s *Server) lookupLaterLocked(t *task, why error) {
	if t.lookupErr == nil {
		s.log.Printf("task %d: %v; it waits until the user database can be read", t.ID, why)
	}
	t.lookupErr = why
	if s.unresolved == nil {
		s.unresolved = map[uint64]*task{}
	}
	s.unresolved[t.ID] = t
	if s.lookupTimer {
		return
	}
	s.lookupTimer = true
	s.lookupWait = min(max(2*s.lookupWait, firstLookupWait), maxLookupWait)
	time.AfterFunc(s.lookupWait, s.lookupAgain)
}

// lookupAgain looks up the accounts of the tasks kept out of line for a
// failed lookup, without the broker's lock, then settles them again.
func (s *Server) lookupAgain() {
	s.mu.Lock()
	s.lookupTimer = false
	uids := map[uint32]bool{}
	for _, t := range s.unresolved {
		uids[t.UID] = true
	}
	s.mu.Unlock()
	ok := true
	for uid := range uids {
		if s.users.lookup(uid).unanswered() != nil {
			ok = false
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ok {
		s.lookupWait = 0
	}
	todo := s.unresolved
	s.unresolved = nil
	for id, t := range todo {
		if s.jobs[id] == t && t.IsWaiting() && !t.inLine {
			s.settleLocked(t)
		}
	}
}

// requeueLocked puts a task that was taken out of line for its start back
// in the place it had.
func (s *Server) requeueLocked(t *task) {
	if t.inLine || t.w == nil || !t.IsWaiting() {
		return
	}
	s.addLineLocked(t, true)
}

// addLineLocked puts t's waiter in its line: the lease table's, or the CPU
// slots' queue for a task that needs no device; readd puts it back in the
// place it had. (Waiting tasks are capped by max_queued_tasks, not by
// max_waiting_per_user, which is for npurun's requests: a user's queued
// tasks never lock them out of an interactive npurun.)
func (s *Server) addLineLocked(t *task, readd bool) {
	t.w.Held = s.paused != nil || t.Busy() // not in line yet: nobody else reads it
	t.inLine = true
	switch {
	case t.Sub.NoDevice && readd:
		s.cpuq.Readd(t.w)
	case t.Sub.NoDevice:
		s.cpuq.Add(t.w)
	case readd:
		s.table.Readd(t.w)
	default:
		s.table.Add(t.w)
	}
}

// holdLocked holds t's waiter in its place in line (skipped, reserving
// nothing), or lets it be served again.
func (s *Server) holdLocked(t *task, held bool) {
	switch {
	case t.w == nil:
	case t.inLine && !t.Sub.NoDevice:
		s.table.Hold(t.w, held)
	default:
		t.w.Held = held
	}
}

// leftLineLocked notes that t's waiter has left its queue (granted, or
// removed by removeLineLocked).
func (s *Server) leftLineLocked(t *task) { t.inLine = false }

// removeLineLocked takes t out of its queue.
func (s *Server) removeLineLocked(t *task) {
	if !t.inLine {
		return
	}
	if t.Sub.NoDevice {
		s.cpuq.Remove(t.w, false)
	} else {
		s.table.Remove(t.w)
	}
	s.leftLineLocked(t)
}

// taskEndedLocked is called by the task table when a task has ended,
// however it ended: its place in line, supervisor and slot are let go, the
// connections waiting for it are told, and the tasks waiting for it are
// settled. (Its devices free themselves once their locks go: their
// watchers see it; endTaskLeaseLocked ends whoever holds them still.)
func (s *Server) taskEndedLocked(t *tasklife.Task) {
	s.endTaskLeaseLocked(t.ID) // its lease too, whoever holds its descriptors (taskend.go)
	if j := s.jobs[t.ID]; j != nil {
		delete(s.jobs, t.ID)
		s.removeLineLocked(j)
		s.dropSupervisorLocked(j)
		if t.Slot >= 0 && t.Slot < len(s.cpuFree) {
			s.cpuFree[t.Slot] = true
		}
		if j.cgroup {
			// Nothing it started outlives it: killed now, the group
			// removed once empty.
			if err := s.cg.kill(t.ID); err != nil && !errors.Is(err, fs.ErrNotExist) {
				s.log.Printf("task %d: kill its control group: %v", t.ID, err)
			}
			go s.reapCgroup(t.ID)
		}
		for _, c := range j.waits {
			if i := slices.Index(c.waiting, j); i >= 0 {
				c.waiting = slices.Delete(c.waiting, i, i+1)
			}
			if c.sendLocked(&client.Reply{Type: client.TypeTasks, Tasks: []client.TaskInfo{info(t, true, 0)}}) != nil {
				c.c.Close() // the client sees the end of the connection, not silence
			}
		}
		j.waits = nil
	}
	for _, d := range s.life.Dependents(t.ID) {
		if j := s.jobs[d.ID]; j != nil && d.State == tasklife.Blocked {
			s.settleLocked(j)
		}
	}
	if !s.loading {
		s.scheduleLocked()
	}
}

// taskDone takes a supervisor's report. Only the task's supervisor may
// make it: the submitter's uid and the supervisor's pid, from SO_PEERCRED.
// The supervisor is acknowledged once the end is recorded; if it cannot be,
// it is told so and reports again later.
func (s *Server) taskDone(c *conn, id uint64, st *client.Status) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.life.Get(id)
	ok := t != nil && st != nil && c.uid == t.UID &&
		(t.State == tasklife.Running || t.State == tasklife.Lost) &&
		t.PID != 0 && int(c.pid) == t.PID
	if !ok {
		c.sendLocked(errReply(client.CodeDenied, fmt.Sprintf("not the supervisor of a running task %d", id), ""))
		return false
	}
	if len(st.Reason) > maxReasonBytes {
		st.Reason = st.Reason[:maxReasonBytes] + "…"
	}
	// What the task used is the broker's to say, from its control group.
	st.CPUMs, st.MemPeak = 0, 0
	if j := s.jobs[id]; j != nil && j.cgroup {
		cpu, peak := s.cg.usage(id)
		st.CPUMs, st.MemPeak = cpu.Milliseconds(), peak
	}
	state := tasklife.Failed
	switch {
	case st.Exit != nil && *st.Exit == 0 && st.Reason == "":
		state = tasklife.Done
	case st.Reason == "cancelled":
		state = tasklife.Cancelled
	}
	if err := s.life.End(t, state, st, ""); err != nil {
		s.log.Printf("task %d: %v", id, err)
		c.sendLocked(errReply(client.CodeSpool, fmt.Sprintf("the broker could not record the end of task %d: %v", id, err), "report again later"))
		return true
	}
	c.sendLocked(&client.Reply{Type: client.TypeOK})
	return true
}

// taskNotStarted takes a supervisor's word that its task never got its
// go-ahead: the broker that recorded its start died before sending it (or
// this one could not send it). Only the supervisor of the task's start
// record may say so (the submitter's uid and the supervisor's pid, from
// SO_PEERCRED), and it will never run the task after saying it: so the
// task, which never ran, goes back in line (at most once still holds), or
// ends cancelled if a cancel came meanwhile. The supervisor is answered
// once that is recorded; an error answer tells it there is nothing to undo
// (its task's start was never recorded), busy or spool to ask again.
func (s *Server) taskNotStarted(c *conn, id uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.life.Get(id)
	j := s.jobs[id]
	if t == nil || j == nil || c.uid != t.UID || t.State != tasklife.Running || t.PID == 0 || int(c.pid) != t.PID {
		c.sendLocked(errReply(client.CodeDenied, fmt.Sprintf("not the supervisor of a running task %d", id), ""))
		return false
	}
	if j.launching {
		// Its go-ahead is being sent (or failed): launch is not done
		// with it yet.
		c.sendLocked(errReply(client.CodeBusy, fmt.Sprintf("task %d is being started", id), "ask again"))
		return true
	}
	slot := t.Slot
	var err error
	if j.cancel {
		err = s.life.End(t, tasklife.Cancelled, nil, "cancelled by "+j.cancelBy+" before it started")
	} else if err = s.life.Unstart(t, int(c.pid)); err == nil {
		s.log.Printf("task %d never got its go-ahead (its supervisor %d says so): it waits again", id, c.pid)
		if slot >= 0 && slot < len(s.cpuFree) {
			s.cpuFree[slot] = true
		}
		j.heard, j.overran = false, false
		if j.w != nil {
			// This broker's own grant, whose go-ahead it could not
			// send: back in the place it had.
			s.requeueLocked(j)
			s.scheduleLocked()
		} else {
			s.settleLocked(j) // adopted at a restart: it queues anew
		}
	}
	if err != nil {
		s.log.Printf("task %d: %v", id, err)
		c.sendLocked(errReply(client.CodeSpool, fmt.Sprintf("the broker could not record that task %d never started: %v", id, err), "ask again later"))
		return true
	}
	c.sendLocked(&client.Reply{Type: client.TypeOK})
	return true
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
func (s *Server) waitReasonLocked(j *task) string {
	if j.State == tasklife.Blocked {
		var ids []uint64
		for _, dep := range j.Sub.After {
			if d := s.life.Get(dep); d != nil && !d.IsEnded() {
				ids = append(ids, dep)
			}
		}
		return "waits for task " + joinIDs(ids) + " to succeed"
	}
	w := j.w
	switch {
	case j.lookupErr != nil:
		return "waits until the user database can be read: " + j.lookupErr.Error()
	case s.paused != nil:
		return "task starts are paused: " + s.paused.why.Error()
	case w == nil:
		return ""
	case w.Limit.MaxRunning > 0 && s.running[j.UID] >= w.Limit.MaxRunning:
		return fmt.Sprintf("%s runs %d of %s allowed (%s)", w.User, s.running[j.UID], quantity.Count(w.Limit.MaxRunning, "task", "tasks"), w.Limit.Source)
	case !j.Sub.NoDevice:
		return s.slurmWhy(w, s.table.Reason(w))
	}
	return ""
}

// positionLocked is a waiting task's place in its line, 0 otherwise.
func (s *Server) positionLocked(t *task) int {
	if t == nil || !t.inLine {
		return 0
	}
	if !t.Sub.NoDevice {
		return s.table.Position(t.w)
	}
	pos := 0
	for _, w := range s.cpuq.Waiters() {
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
// with the "next" of the last reply. Under the broker's lock a page costs a
// bounded walk (listScan ids at most, from where the last page stopped) and
// shallow copies of at most listPage tasks; their replies are put together
// and encoded outside the lock, and sent from the connection's goroutine.
// So a listing never holds the lock for long nor keeps more than one page in
// memory; a page is built only once the client has read the last one, and
// what one user's connections leave unread together is capped
// (readyForListing).
const (
	listScan = 4096
	listPage = 256
)

// listed is a task copied for a page of a listing.
type listed struct {
	t   tasklife.Task
	pos int
}

// list serves one page of a listing: the asker's tasks (everyone's with
// all) after id after, oldest first.
func (s *Server) list(c *conn, all bool, after uint64) bool {
	if err := c.readyForListing(); err != nil {
		return false
	}
	s.mu.Lock()
	page, next, more := s.listPageLocked(c, all, after)
	s.mu.Unlock()
	full := func(t *tasklife.Task) bool { return t.UID == c.uid || c.uid == 0 }
	return c.sendPage(page, full, next, more) == nil
}

// listPageLocked copies the tasks of a page: the asker's (everyone's with
// all) with ids above after. more tells that others follow, from next.
func (s *Server) listPageLocked(c *conn, all bool, after uint64) (page []listed, next uint64, more bool) {
	scanned, size := 0, 0
	var inLine []*lease.Waiter
	s.life.EachAfter(after, func(t *tasklife.Task) bool {
		if scanned == listScan || len(page) == listPage || size > client.MaxMessage {
			more = true
			return false
		}
		scanned++
		next = t.ID
		if !all && t.UID != c.uid {
			return true
		}
		page = append(page, listed{t: *t})
		if j := s.jobs[t.ID]; j != nil && j.inLine {
			inLine = append(inLine, j.w)
		}
		// A guess at its size, on the high side, to stop copying before a
		// message is full (the encoding decides: what does not fit goes
		// in the next page).
		size += 400 + len(t.Sub.Name) + len(t.User)
		if t.UID == c.uid || c.uid == 0 {
			size += len(t.Sub.Shell) + byteSize(t.Sub.Argv) + len(t.Sub.Cwd) + len(t.Log) + len(t.Reason)
		}
		return true
	})
	if len(inLine) > 0 {
		pos := s.positionsOfLocked(inLine)
		for i := range page {
			if j := s.jobs[page[i].t.ID]; j != nil && j.inLine {
				page[i].pos = pos[j.w]
			}
		}
	}
	return page, next, more
}

// positionsOfLocked is the place in line of each of ws, walking each line
// only as far as the last of them in it.
func (s *Server) positionsOfLocked(ws []*lease.Waiter) map[*lease.Waiter]int {
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
		s.table.Positions(inTable)
	}
	n := map[string]int{}
	for _, w := range s.cpuq.Waiters() {
		if left == 0 {
			break
		}
		n[w.Pool]++
		if _, ok := want[w]; ok {
			want[w] = n[w.Pool]
			left--
		}
	}
	for w, pos := range inTable {
		want[w] = pos
	}
	return want
}

// sendPage encodes a page of a listing and sends it as one "tasks" reply,
// as many of its tasks as fit; more and next say where the listing goes
// on. full tells which tasks the asker may see whole. Nobody's environment
// is listed.
func (c *conn) sendPage(page []listed, full func(*tasklife.Task) bool, next uint64, more bool) error {
	msg := []byte(`{"v":` + strconv.Itoa(client.Version) + `,"type":"` + client.TypeTasks + `","tasks":[`)
	const tail = `],"more":true,"next":18446744073709551615}`
	for i := range page {
		t := &page[i].t
		ti := info(t, full(t), page[i].pos)
		ti.Env = nil
		b, err := json.Marshal(&ti)
		if err != nil {
			return err
		}
		if i > 0 && len(msg)+1+len(b)+len(tail) > client.MaxMessage {
			next, more = page[i-1].t.ID, true
			break
		}
		if i > 0 {
			msg = append(msg, ',')
		}
		msg = append(msg, b...)
	}
	msg = append(msg, ']')
	if more {
		msg = append(msg, `,"more":true,"next":`...)
		msg = strconv.AppendUint(msg, next, 10)
	}
	msg = append(msg, '}')
	return c.sendListing(msg)
}

// forgetWaitsLocked drops a closed connection from the tasks it waits on.
func (s *Server) forgetWaitsLocked(c *conn) {
	for _, t := range c.waiting {
		if i := slices.Index(t.waits, c); i >= 0 {
			t.waits = slices.Delete(t.waits, i, i+1)
		}
	}
	c.waiting = nil
}

// peerGone tells whether c's client has closed its end: what it sent may
// still be read, but nobody will read the answer.
func (c *conn) peerGone() bool {
	gone := false
	c.rc.Control(func(fd uintptr) {
		// POLLHUP: closed, not only shut down for writing.
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, _ := unix.Poll(pfd, 0); n > 0 {
			gone = pfd[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0
		}
	})
	return gone
}
