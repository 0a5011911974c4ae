package wire

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// The detached-task exchange, on the same socket and framing as leases.
//
//	task-submit                                 npubroker
//	  │ ── {"op":"submit","task":{…}} ──────────▶ │ identity: SO_PEERCRED
//	  │ ◀── {"type":"submitted","id":118,…} ───── │ only once the spool holds it (fsync)
//	  │ ── {"op":"list","all":true} ────────────▶ │ a page: built outside the broker's lock
//	  │ ◀── {"type":"tasks","tasks":[…],"more":true,"next":512}
//	  │ ── {"op":"list","all":true,"after":512} ▶ │ the next page, once the last is read
//	  │ ◀── {"type":"tasks","tasks":[…]} ──────── │ no "more": the end
//	  │ ── {"op":"show","id":118} ──────────────▶ │ ◀── {"type":"tasks","tasks":[…]}
//	  │ ── {"op":"cancel","id":118} ────────────▶ │ ◀── {"type":"tasks","tasks":[…]}
//	  │ ── {"op":"wait","id":118} ──────────────▶ │ … when it ends: {"type":"tasks","tasks":[…]}
//
//	npubroker ── fork/exec as the submitter ──▶ npurun-supervise [ID]
//	  stdin, a socket: ▶ the Spec; ▶ the go-ahead with the lease's locks (SCM_RIGHTS),
//	                   or {"id":118,"drop":true}: not started, exit;
//	                   ◀ {"id":118,"started":true} once the command runs
//	supervisor ── {"op":"task-done","id":118,"status":{…}} ──▶ npubroker
//	           ◀── {"type":"ok"} ─── (retried across broker restarts until acknowledged,
//	                                  and while the broker answers "spool")
//	supervisor whose socket closed before a go-ahead or a drop (the broker died):
//	           ── {"op":"task-not-started","id":118} ──▶ the next npubroker
//	           ◀── {"type":"ok"}: back in line; or an error: nothing to undo
//	                                 (retried as task-done is, and while "busy")

// SupervisorName is the supervisor's program name and argv[0]: the broker
// knows its tasks' supervisors by it, followed by the task's id when the
// supervisor was started for one.
const SupervisorName = "npurun-supervise"

// DefaultLogDir is where a task's log goes when it names none: under its
// submitter's home directory.
const DefaultLogDir = ".local/state/npurun/tasks"

// DefaultLog is the log of task id, submitted by a user whose home is
// home, when it names none: DefaultLogDir/ID-TAG.log, TAG being the
// broker's journal's (ids start again with a new journal, and two
// machines may share a home: the tag keeps a task out of another's log).
func DefaultLog(home string, id uint64, tag string) string {
	return filepath.Join(home, DefaultLogDir, strconv.FormatUint(id, 10)+"-"+tag+".log")
}

// Task operations.
const (
	OpSubmit   = "submit"
	OpList     = "list"
	OpShow     = "show"
	OpCancel   = "cancel"
	OpWait     = "wait"
	OpTaskDone = "task-done" // from a task's supervisor only
	// OpNotStarted is a supervisor's word that its task never got its
	// go-ahead and will not be run by it: the broker that recorded its
	// start died first. From the task's supervisor only.
	OpNotStarted = "task-not-started"
)

// Task operations beyond submit, list, show, cancel and wait.
const (
	OpHold    = "hold"    // a waiting task keeps its place but is not started
	OpRelease = "release" // a held task may start again
	OpRequeue = "requeue" // an ended task submitted again: Request.ID, and Request.Task for the asker's environment, umask and token
	// OpHistory is the tasks the accounting log shows ended from
	// Request.Since on that the broker keeps no more (list --ended).
	OpHistory = "task-history"
)

// Task reply types.
const (
	TypeSubmitted = "submitted"
	TypeTasks     = "tasks"
	TypeOK        = "ok"
)

// Error codes of the task operations.
const (
	// CodeNoSuchTask is an unknown task id, or one the asker may not see.
	CodeNoSuchTask = "no-such-task"
	// CodeSpool is a change the broker could not record in its journal
	// (a full disk, say): it did not happen. A supervisor whose report is
	// answered so reports again later.
	CodeSpool = "spool"
)

// Task states.
const (
	StatePending   = "pending"   // in the queue
	StateBlocked   = "blocked"   // waiting for --after tasks to succeed
	StateRunning   = "running"   // its supervisor runs it
	StateDone      = "done"      // ended with exit status 0
	StateFailed    = "failed"    // ended otherwise, or could not start
	StateCancelled = "cancelled" // cancelled before or while running
	StateLost      = "lost"      // its supervisor vanished without a word
)

// MaxTimeSec is the longest time limit a task may ask for, in seconds (a
// century): with it, seconds times 10^9 stays far inside an int64.
const MaxTimeSec = 100 * 365 * 24 * 3600

// Submission is what task-submit sends: the command and what it needs.
// The submitter's identity is never part of it: the broker takes it from
// SO_PEERCRED.
type Submission struct {
	Argv    []string `json:"argv,omitempty"`  // run as given (-- CMD ARGS)
	Shell   string   `json:"shell,omitempty"` // or: a string run by the submitter's shell (--run)
	Cwd     string   `json:"cwd"`
	Env     []string `json:"env"`
	N       int      `json:"n,omitempty"`
	Devices []int    `json:"devices,omitempty"`
	Pool    string   `json:"pool,omitempty"`
	Mem     int64    `json:"mem,omitempty"` // a share of each device: the device memory declared, in MiB (--mem); 0: whole devices
	// OOMRetries (--oom-retries) is how often a task that failed out of
	// device memory is submitted again, its declaration raised; RetryOf,
	// the broker's, is the task a retry retries.
	OOMRetries int      `json:"oom_retries,omitempty"`
	RetryOf    uint64   `json:"retry_of,omitempty"`
	NoDevice   bool     `json:"no_device,omitempty"`
	TimeSec    int64    `json:"time_sec,omitempty"` // --time, seconds, at most MaxTimeSec; 0: the policy's
	Name       string   `json:"name,omitempty"`
	After      []uint64 `json:"after,omitempty"`
	Log        string   `json:"log,omitempty"`   // absolute path; "" for the default
	Umask      *uint32  `json:"umask,omitempty"` // the submitter's; nil: the supervisor's (an older task-submit)
	// Token, the client's, names this submission: a repeat of it (same
	// user, same token) is answered with the task it made, if the broker
	// keeps it, and makes no other. At most MaxToken bytes of printable
	// ASCII, no space.
	Token string `json:"token,omitempty"`
	// Notify is a command line run by /bin/sh as the submitter once the
	// task has ended (the Notify* variables in its environment); "": the policy's
	// ([tasks] notify), unless NoNotify.
	Notify   string `json:"notify,omitempty"`
	NoNotify bool   `json:"no_notify,omitempty"`
}

// The variables of a task's notify command beside HOME, USER, LOGNAME,
// SHELL and PATH: the task's id, its state as list shows it (done,
// failed, cancelled), its exit status as wait gives it (128+N for signal
// N), the signal that ended it, its name and its log.
const (
	NotifyID     = "NPURUN_TASK_ID"
	NotifyState  = "NPURUN_TASK_STATE"
	NotifyExit   = "NPURUN_TASK_EXIT"
	NotifySignal = "NPURUN_TASK_SIGNAL"
	NotifyName   = "NPURUN_TASK_NAME"
	NotifyLog    = "NPURUN_TASK_LOG"
)

// NoticeIdle is NPURUN_TASK_STATE of a notice the notify command gets
// while its task runs (Spec.Notice): the [idle] policy's warning that
// the task's devices have been idle, sent before its lease is reclaimed;
// NPURUN_TASK_EXIT and NPURUN_TASK_SIGNAL are empty then.
const NoticeIdle = "idle"

// NotifyFor bounds a notify command's run: SIGKILL to its process group
// after it.
const NotifyFor = time.Minute

// EndState is the state a task ends in by its supervisor's report st:
// done for exit status 0 without a reason, cancelled for the broker's
// cancel, failed otherwise. The broker records it; the supervisor tells
// the notify command.
func EndState(st *Status) string {
	switch {
	case st.Exit != nil && *st.Exit == 0 && st.Reason == "":
		return StateDone
	case st.Reason == ReasonCancelled:
		return StateCancelled
	}
	return StateFailed
}

// ReasonCancelled is a supervisor's reason for a task the broker
// cancelled.
const ReasonCancelled = "cancelled"

// MaxToken bounds a submission's token.
const MaxToken = 128

// TaskInfo is a task as list, show, cancel and wait report it. Command,
// Cwd, Env and Log are left out for another user's task unless the asker
// is root.
type TaskInfo struct {
	ID         uint64    `json:"id"`
	User       string    `json:"user"`
	UID        uint32    `json:"uid"`
	Name       string    `json:"name,omitempty"`
	State      string    `json:"state"`
	Command    string    `json:"command,omitempty"`
	Cwd        string    `json:"cwd,omitempty"`
	Env        []string  `json:"env,omitempty"`
	Log        string    `json:"log,omitempty"`
	N          int       `json:"n,omitempty"`
	Pool       string    `json:"pool,omitempty"`
	Mem        int64     `json:"mem,omitempty"`         // a share of each device: the device memory declared, in MiB
	OOMRetries int       `json:"oom_retries,omitempty"` // retries left after a failure out of device memory
	RetryOf    uint64    `json:"retry_of,omitempty"`    // the task this one retries
	NoDevice   bool      `json:"no_device,omitempty"`
	Devices    []int     `json:"devices,omitempty"` // granted, once running
	After      []uint64  `json:"after,omitempty"`
	TimeSec    int64     `json:"time_sec,omitempty"`
	Position   int       `json:"position,omitempty"` // place in line while pending
	Backfill   *Backfill `json:"backfill,omitempty"` // running, backfilled ([scheduling] backfill): what it went ahead of (show)
	Start      int64     `json:"start,omitempty"`    // while pending for devices: when it starts at the latest (Unix ms), by the time limits of what holds them and waits ahead; absent: unknown
	Submitted  int64     `json:"submitted"`          // Unix milliseconds
	Started    int64     `json:"started,omitempty"`
	Ended      int64     `json:"ended,omitempty"`
	NeverRan   bool      `json:"never_ran,omitempty"`   // it ended without running: failed before its start (an --after task that did not succeed, a command that could not start) or cancelled while it waited
	Exit       *int      `json:"exit,omitempty"`        // exit code, when it exited
	Signal     string    `json:"signal,omitempty"`      // or the signal that ended it
	Reason     string    `json:"reason,omitempty"`      // why it failed, was cancelled or lost
	CPUMs      int64     `json:"cpu_ms,omitempty"`      // CPU time its processes used, where it had a control group
	MemPeak    int64     `json:"mem_peak,omitempty"`    // their peak memory in bytes, where the memory controller measured it
	DevPeak    int64     `json:"device_peak,omitempty"` // a share's: the most device memory its processes were seen to use, MiB
	Token      string    `json:"token,omitempty"`       // its submission's token (the submitter's and root's to see)
	Held       bool      `json:"held,omitempty"`        // waiting, held in its place: task-submit release lets it start
	From       uint64    `json:"from,omitempty"`        // requeued from this ended task
	Source     string    `json:"source,omitempty"`      // history: SourceAccounting for a task the broker keeps no more
}

// ExitStatus is the status a shell would give for the task: its exit
// code, 128+N for signal N, 1 for a task that never ran or was lost, and
// -1 while it has not ended.
func (t *TaskInfo) ExitStatus() int {
	switch {
	case t.Exit != nil:
		return *t.Exit
	case t.Signal != "":
		return 128 + signalNumber(t.Signal)
	case t.State == StatePending || t.State == StateBlocked || t.State == StateRunning:
		return -1
	}
	return 1
}

// Status is a supervisor's report of how its command ended.
type Status struct {
	Exit   *int   `json:"exit,omitempty"`
	Signal string `json:"signal,omitempty"` // e.g. "SIGKILL"
	Reason string `json:"reason,omitempty"` // "time limit 6h0m0s reached", "cancelled", "start: …"
	// Set by the broker from the task's control group, never taken from a
	// supervisor.
	CPUMs   int64 `json:"cpu_ms,omitempty"`
	MemPeak int64 `json:"mem_peak,omitempty"`
	// A share's (--mem): the most device memory its processes were seen
	// to use, in MiB, from the vendor's tool through the broker's scan.
	DevicePeak int64 `json:"device_peak,omitempty"`
	// OOM: the supervisor found an out-of-memory message of the device's
	// runtime in the tail of the log its run wrote (supervisor.OOMMessages).
	OOM bool `json:"oom,omitempty"`
}

// Spec is what the broker gives a task's supervisor on its standard input.
// The supervisor already runs as the submitter (uid, gid, groups) and holds
// the lease's lock descriptors at 3, 4, … in the order of Devices.
type Spec struct {
	ID       uint64   `json:"id"`
	UID      uint32   `json:"uid"`  // the submitter: the supervisor refuses a Spec for another uid than its own
	Argv     []string `json:"argv"` // resolved: --run became [shell, "-c", string]
	Cwd      string   `json:"cwd"`
	Env      []string `json:"env"` // complete, device variables included
	Devices  []int    `json:"devices,omitempty"`
	Log      string   `json:"log"`                // absolute path, opened by the supervisor as the submitter
	TimeSec  int64    `json:"time_sec,omitempty"` // 0: no limit
	GraceSec int64    `json:"grace_sec"`          // SIGTERM → SIGKILL
	Idle     bool     `json:"idle,omitempty"`     // nice 19 and the idle I/O class
	Socket   string   `json:"socket"`             // where to report
	Umask    *uint32  `json:"umask,omitempty"`    // the command's, the submitter's; nil: left as it is
	Notify   string   `json:"notify,omitempty"`   // run by /bin/sh once the task's end is reported; "": none
	Name     string   `json:"name,omitempty"`     // the task's --name, for the notify command
	// Drop, in place of a go-ahead, tells a supervisor that its task will
	// not start under it: it exits having run nothing.
	Drop bool `json:"drop,omitempty"`
	// Notice makes the supervisor a notify-only launch: it runs Notify
	// with NPURUN_TASK_STATE=Notice (NoticeIdle, the one there is) for the
	// task, which runs under another supervisor, and exits; no go-ahead
	// comes, and it reports nothing.
	Notice string `json:"notice,omitempty"`
}

// Started is a supervisor's word to the broker, on the socket its Spec
// came on, once its task's command has started (Started false: it could
// not be started).
type Started struct {
	ID      uint64 `json:"id"`
	Started bool   `json:"started"`
}

// signalNumber maps "SIGKILL" to 9; 0 when unknown.
func signalNumber(name string) int {
	return int(unix.SignalNum(name))
}

// call sends req and returns the first reply that is not progress.
func (c *Conn) call(req *Request) (*Reply, error) {
	if err := c.Send(req); err != nil {
		return nil, err
	}
	return c.answer()
}

// answer is the first reply that is not progress.
func (c *Conn) answer() (*Reply, error) {
	for {
		r, _, err := c.Recv(-1)
		if err != nil {
			return nil, err
		}
		if r.Type != TypeQueued {
			return r, nil
		}
	}
}

// Submit queues a task. The reply carries its id, and its pool and place
// in line when it waits for devices.
func (c *Conn) Submit(s *Submission) (*Reply, error) {
	r, err := c.call(&Request{Op: OpSubmit, Task: s})
	if err != nil {
		return nil, err
	}
	if r.Type != TypeSubmitted {
		return nil, fmt.Errorf("unexpected reply %q to submit", r.Type)
	}
	return r, nil
}

// ErrSubmitUnknown means that a submission was sent, its answer was lost,
// and no broker answered a repeat of it in time: whether it was recorded
// is not known.
var ErrSubmitUnknown = errors.New("cannot tell whether the task was submitted")

// SubmitResolved submits s, which carries a token, to the broker at path.
// When the answer is lost after the submission was sent (the connection
// reset or closed, or no answer for FirstAnswer: the broker may have
// recorded it, and died or stalled), it sends it again, with the same
// token, on a new connection, until a broker answers or within has
// passed: the broker answers a repeat with the task the first one made, if
// it was recorded (Reply.Existing), and records it otherwise. So a nil
// error means submitted; an error means that no task was made, unless it
// wraps ErrSubmitUnknown. again, if not nil, is told of each repeat and
// why it is made.
func SubmitResolved(path string, s *Submission, within time.Duration, again func(error)) (*Reply, error) {
	if s.Token == "" {
		return nil, errors.New("submit: a submission to resolve needs a token")
	}
	r, sent, err := submitOnce(path, s)
	var refused *Error
	if err == nil || !sent || errors.As(err, &refused) {
		return r, err // answered, or never sent: no task was made
	}
	deadline := time.Now().Add(within)
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		if again != nil {
			again(err)
		}
		if time.Now().Add(wait).After(deadline) {
			return nil, fmt.Errorf("%w: %w", ErrSubmitUnknown, err)
		}
		time.Sleep(wait)
		r, _, err = submitOnce(path, s)
		switch {
		case err == nil:
			return r, nil
		case errors.As(err, &refused) && refused.Code != CodeBusy && refused.Code != CodeTooMany:
			// Refused after its token was looked up (busy and too-many
			// may come before: ask again): neither was recorded.
			return nil, err
		}
	}
}

// submitOnce makes one submission on a connection of its own; sent tells
// that it was sent (and so may have been recorded, whatever err says).
func submitOnce(path string, s *Submission) (r *Reply, sent bool, err error) {
	c, err := Dial(path)
	if err != nil {
		return nil, false, err
	}
	defer c.Close()
	if err := c.Send(&Request{Op: OpSubmit, Task: s}); err != nil {
		// A packet is queued to the broker whole, or not at all.
		return nil, false, fmt.Errorf("send the submission: %w (nothing was submitted)", err)
	}
	r, err = c.answer()
	if err == nil && r.Type != TypeSubmitted {
		err = fmt.Errorf("unexpected reply %q to submit", r.Type)
	}
	if err != nil {
		return nil, true, err
	}
	return r, true, nil
}

// tasks is a "tasks" reply to req.
func (c *Conn) tasks(req *Request) (*Reply, error) {
	r, err := c.call(req)
	if err != nil {
		return nil, err
	}
	if r.Type != TypeTasks {
		return nil, fmt.Errorf("unexpected reply %q to %s", r.Type, req.Op)
	}
	return r, nil
}

func (c *Conn) one(req *Request) (*TaskInfo, error) {
	r, err := c.tasks(req)
	if err != nil {
		return nil, err
	}
	if len(r.Tasks) != 1 || r.More {
		return nil, fmt.Errorf("%s: %d tasks in reply, want 1", req.Op, len(r.Tasks))
	}
	return &r.Tasks[0], nil
}

// List returns the asker's tasks, or everyone's with all, asking for them
// a page at a time.
func (c *Conn) List(all bool) ([]TaskInfo, error) {
	// The pages are put together once, at the end: appended as they
	// came, a listing of thousands of tasks was copied again and again.
	var pages [][]TaskInfo
	n := 0
	req := &Request{Op: OpList, All: all}
	for {
		r, err := c.tasks(req)
		if err != nil {
			return nil, err
		}
		pages = append(pages, r.Tasks)
		n += len(r.Tasks)
		if !r.More {
			if n == 0 {
				return nil, nil
			}
			out := make([]TaskInfo, 0, n)
			for _, p := range pages {
				out = append(out, p...)
			}
			return out, nil
		}
		if r.Next <= req.After {
			return nil, fmt.Errorf("list: page after task %d goes on from task %d", req.After, r.Next)
		}
		req = &Request{Op: OpList, All: all, After: r.Next}
	}
}

// StateEnded is the state of a task that the accounting log alone
// remembers: it ended, how is not known.
const StateEnded = "ended"

// SourceAccounting marks a task of a history known from the accounting
// log alone.
const SourceAccounting = "accounting"

// ListEnded returns the asker's tasks (everyone's with all) that ended
// from since on: those the broker keeps, a page at a time, then those the
// accounting log alone remembers. cut tells that the broker left some of
// the latter out (it sends a bounded number of them).
func (c *Conn) ListEnded(all bool, since time.Time) (ts []TaskInfo, cut bool, err error) {
	req := &Request{Op: OpList, All: all, Ended: true, Since: since.UnixMilli()}
	for {
		r, err := c.tasks(req)
		if err != nil {
			return nil, false, err
		}
		ts = append(ts, r.Tasks...)
		if !r.More {
			break
		}
		if r.Next <= req.After {
			return nil, false, fmt.Errorf("list: page after task %d goes on from task %d", req.After, r.Next)
		}
		req = &Request{Op: OpList, All: all, Ended: true, Since: since.UnixMilli(), After: r.Next}
	}
	r, err := c.tasks(&Request{Op: OpHistory, All: all, Since: since.UnixMilli()})
	if err != nil {
		return nil, false, err
	}
	return append(ts, r.Tasks...), r.More, nil
}

// Show returns one task.
func (c *Conn) Show(id uint64) (*TaskInfo, error) { return c.one(&Request{Op: OpShow, ID: id}) }

// Cancel cancels a task: a pending one is removed, a running one is sent
// SIGTERM (SIGKILL after a grace period). It returns the task as it stands.
func (c *Conn) Cancel(id uint64) (*TaskInfo, error) { return c.one(&Request{Op: OpCancel, ID: id}) }

// Hold holds a waiting task in its place in line: it is not started
// until Release. It returns the task as it stands.
func (c *Conn) Hold(id uint64) (*TaskInfo, error) { return c.one(&Request{Op: OpHold, ID: id}) }

// Release lets a held task start again, in the place it kept.
func (c *Conn) Release(id uint64) (*TaskInfo, error) { return c.one(&Request{Op: OpRelease, ID: id}) }

// Requeue submits ended task id again, its command, directory and
// options as they were, as a new task; s carries what a submission takes
// from where it is made (the environment, the umask) and its token. The
// reply is a submission's.
func (c *Conn) Requeue(id uint64, s *Submission) (*Reply, error) {
	r, err := c.call(&Request{Op: OpRequeue, ID: id, Task: s})
	if err != nil {
		return nil, err
	}
	if r.Type != TypeSubmitted {
		return nil, fmt.Errorf("unexpected reply %q to requeue", r.Type)
	}
	return r, nil
}

// Wait blocks until the task has ended and returns it.
func (c *Conn) Wait(id uint64) (*TaskInfo, error) { return c.one(&Request{Op: OpWait, ID: id}) }

// TaskDone is a supervisor's report of its command's end; it returns once
// the broker has recorded it.
func (c *Conn) TaskDone(id uint64, st *Status) error {
	r, err := c.call(&Request{Op: OpTaskDone, ID: id, Status: st})
	if err != nil {
		return err
	}
	if r.Type != TypeOK {
		return fmt.Errorf("unexpected reply %q to task-done", r.Type)
	}
	return nil
}

// TaskNotStarted is a supervisor's word that its task never got its
// go-ahead; it returns once the broker has taken it (put the task back in
// line). An error from the broker means there was nothing to undo, unless
// it is "spool" or "busy": then ask again later.
func (c *Conn) TaskNotStarted(id uint64) error {
	r, err := c.call(&Request{Op: OpNotStarted, ID: id})
	if err != nil {
		return err
	}
	if r.Type != TypeOK {
		return fmt.Errorf("unexpected reply %q to %s", r.Type, OpNotStarted)
	}
	return nil
}

// Fd is the connection's descriptor, for poll(2) beside other events.
func (c *Conn) Fd() int { return c.fd }
