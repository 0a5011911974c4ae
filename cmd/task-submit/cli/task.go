package cli

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/npurun/npurun/container"
	"github.com/npurun/npurun/internal/exitcode"
	"github.com/npurun/npurun/wire"
)

// stdout is where answers go; a variable for the tests.
var stdout io.Writer = os.Stdout

// run carries out a parsed command line and returns the exit status.
func run(o *options) int {
	if s, code := loginCluster(); s != nil || code != 0 {
		if s == nil {
			return code
		}
		return runCluster(o, s)
	}
	if o.cpus != 0 {
		warn("--cpus is for a cluster's Slurm ([cluster] in npurun.conf); this box's broker gives each task a CPU slot")
		return exitcode.Usage
	}
	switch o.cmd {
	case "submit":
		return submit(o)
	case "list":
		return list(o)
	case "show":
		return show(o)
	case "logs":
		return logs(o)
	case "wait":
		return wait(o)
	case "cancel":
		return cancel(o)
	case "hold", "release":
		return holdOrRelease(o)
	case "requeue":
		return requeue(o)
	}
	warn("unknown command %q", o.cmd)
	return exitcode.Usage
}

func submit(o *options) int {
	cwd, err := os.Getwd()
	if err != nil {
		warn("current directory: %v", err)
		return exitcode.Failure
	}
	s := o.sub
	s.Cwd = cwd
	s.Env = os.Environ()
	// The task's files are made with this umask, as they would be if the
	// command ran here (Umask sets as it reads: the old one is put back).
	mask := uint32(syscall.Umask(0o022))
	syscall.Umask(int(mask))
	s.Umask = &mask
	if s.Log != "" && !filepath.IsAbs(s.Log) {
		s.Log = filepath.Join(cwd, s.Log)
	}
	check := checkDefaultLog
	if s.Log != "" {
		check = func() error { return checkLog(s.Log) }
	}
	if err := check(); err != nil {
		warn("%v", err)
		hint("the task would fail at its start: give a --log FILE you may write (nothing was submitted)")
		return exitcode.Failure
	}
	if err := checkContainer(&s); err != nil {
		warn("%v", err)
		hint("a task's container runs attached, its life the task's: drop -d (nothing was submitted)")
		return exitcode.Usage
	}
	if s.Token == "" {
		if s.Token, err = newToken(); err != nil {
			warn("%v", err)
			return exitcode.Failure
		}
	}
	// An answer lost after the submission was sent leaves it unknown
	// whether the broker recorded it: it is sent again with its token,
	// which the broker answers with the task it made, if it made one.
	asked := false
	r, err := wire.SubmitResolved(wire.SocketPath(o.socket), &s, resolveFor, func(why error) {
		if !asked {
			warn("the broker's answer was lost (%v); asking again whether it recorded the task", why)
			asked = true
		}
	})
	if errors.Is(err, wire.ErrSubmitUnknown) {
		warn("%v", err)
		hint("look for it with 'task-submit list' (its token is %s) before submitting it again, or submit it again with --token %s, which makes no second task", s.Token, s.Token)
		return exitcode.Unknown
	}
	if err != nil {
		code := failure(err, 0)
		if asked {
			warn("the task was not submitted")
		}
		return code
	}
	if r.Existing && (o.sub.Token != "" || asked) {
		if asked {
			warn("the broker had recorded it before its answer was lost")
		} else {
			warn("token %s names task %d, submitted already: no other task was made", s.Token, r.ID)
		}
	}
	if o.json {
		err = writeJSON(stdout, submitted{ID: r.ID, Position: r.Position, Pool: r.Pool, State: r.State, Token: s.Token, Existing: r.Existing})
	} else {
		_, err = fmt.Fprintln(stdout, submittedLine(r))
	}
	if err != nil {
		warn("%v", err)
		return exitcode.Failure
	}
	switch {
	case r.Existing:
		// Submitted already; what became of it since is its own story.
	case r.State == wire.StateFailed || r.State == wire.StateCancelled || r.State == wire.StateLost:
		// Recorded, and already over: --after a task that did not succeed.
		warn("task %d will not run: %s", r.ID, oneLine(strings.TrimPrefix(r.Reason, r.State+": ")))
		return exitcode.Failure
	}
	return 0
}

func list(o *options) int {
	listMemory()
	c, err := wire.Dial(wire.SocketPath(o.socket))
	if err != nil {
		return failure(err, 0)
	}
	defer c.Close()
	var ts []wire.TaskInfo
	cut := false
	if o.ended {
		ts, cut, err = c.ListEnded(o.all, time.Now().Add(-o.since))
		sortEnded(ts)
	} else {
		ts, err = c.List(o.all)
	}
	if err != nil {
		return failure(err, 0)
	}
	if cut {
		warn("older tasks the accounting log remembers were left out: give a shorter --since")
	}
	switch {
	case o.json:
		err = writeTasksJSON(stdout, ts) // "[]" for none, not "null"
	case len(ts) > 0 && o.ended:
		err = writeHistory(stdout, ts, o.all, time.Now())
	case len(ts) > 0:
		err = writeTable(stdout, ts, o.all, time.Now())
	}
	if err != nil {
		warn("%v", err)
		return exitcode.Failure
	}
	return 0
}

func show(o *options) int {
	t, code := showTask(o)
	if t == nil {
		return code
	}
	var err error
	if o.json {
		err = writeJSON(stdout, t)
	} else {
		err = writeShow(stdout, t, time.Local)
	}
	if err != nil {
		warn("%v", err)
		return exitcode.Failure
	}
	return 0
}

// showTask asks for one task; nil and the exit status when that fails.
func showTask(o *options) (*wire.TaskInfo, int) {
	c, err := wire.Dial(wire.SocketPath(o.socket))
	if err != nil {
		return nil, failure(err, o.id)
	}
	defer c.Close()
	t, err := c.Show(o.id)
	if err != nil {
		return nil, failure(err, o.id)
	}
	return t, 0
}

func logs(o *options) int {
	t, code := showTask(o)
	if t == nil {
		return code
	}
	if t.Log == "" {
		if t.UID != uint32(os.Getuid()) {
			warn("task %d is %s's: its log is theirs to read", t.ID, t.User)
		} else {
			warn("the broker did not say where the log of task %d is", t.ID)
		}
		return exitcode.Failure
	}
	waiting := t.State == wire.StatePending || t.State == wire.StateBlocked
	if !o.follow || ended(t) {
		if waiting {
			warn("task %d has not started; its log will be %s", t.ID, t.Log)
			return exitcode.Failure
		}
		f, err := openerFor(t.UID).open(t.Log)
		if err != nil {
			return logFailure(t, err)
		}
		defer f.Close()
		if _, err := io.Copy(stdout, f); err != nil {
			return logFailure(t, err)
		}
		return 0
	}
	w, err := startWait(wire.SocketPath(o.socket), t.ID)
	if err != nil {
		return failure(err, t.ID)
	}
	defer w.close()
	if waiting {
		warn("task %d has not started; waiting for its log at %s", t.ID, t.Log)
	}
	if err := follow(stdout, t.Log, w, openerFor(t.UID).open); err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return logFailure(t, err)
		}
		return failure(err, t.ID)
	}
	if _, err := os.Stat(t.Log); err != nil && w.task != nil {
		warn("task %d %s without a log", t.ID, describeEnd(w.task))
	}
	return 0
}

// logFailure reports a log that cannot be read.
func logFailure(t *wire.TaskInfo, err error) int {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		msg := fmt.Sprintf("task %d has no log at %s", t.ID, t.Log)
		if t.Reason != "" {
			msg += " (" + oneLine(t.Reason) + ")"
		}
		warn("%s", msg)
	case errors.Is(err, fs.ErrPermission):
		warn("you may not read the log of task %d: %v", t.ID, err)
		hint("a task's log is written with its submitter's privileges; only they and root can read it")
	default:
		warn("log of task %d: %v", t.ID, err)
	}
	return exitcode.Failure
}

func wait(o *options) int {
	w, err := startWait(wire.SocketPath(o.socket), o.id)
	if err != nil {
		return failure(err, o.id)
	}
	defer w.close()
	for {
		done, err := w.recv(-1)
		if err != nil {
			return failure(err, o.id)
		}
		if done {
			break
		}
	}
	code := waitStatus(w.task)
	if code != 0 || w.task.State != wire.StateDone {
		warn("task %d %s", w.task.ID, describeEnd(w.task))
	}
	return code
}

func cancel(o *options) int {
	c, err := wire.Dial(wire.SocketPath(o.socket))
	if err != nil {
		return failure(err, o.id)
	}
	defer c.Close()
	t, err := c.Cancel(o.id)
	if err != nil {
		return failure(err, o.id)
	}
	if _, err := fmt.Fprintln(stdout, cancelLine(t)); err != nil {
		warn("%v", err)
		return exitcode.Failure
	}
	return 0
}

// holdOrRelease holds a waiting task in its place, or releases it.
func holdOrRelease(o *options) int {
	c, err := wire.Dial(wire.SocketPath(o.socket))
	if err != nil {
		return failure(err, o.id)
	}
	defer c.Close()
	var t *wire.TaskInfo
	if o.cmd == "hold" {
		t, err = c.Hold(o.id)
	} else {
		t, err = c.Release(o.id)
	}
	if err != nil {
		return failure(err, o.id)
	}
	if _, err := fmt.Fprintln(stdout, holdLine(t)); err != nil {
		warn("%v", err)
		return exitcode.Failure
	}
	return 0
}

// requeue submits an ended task again, from here: with this
// environment and umask, as a submission takes them.
func requeue(o *options) int {
	s := wire.Submission{Env: os.Environ()}
	mask := uint32(syscall.Umask(0o022))
	syscall.Umask(int(mask))
	s.Umask = &mask
	var err error
	if s.Token, err = newToken(); err != nil {
		warn("%v", err)
		return exitcode.Failure
	}
	c, err := wire.Dial(wire.SocketPath(o.socket))
	if err != nil {
		return failure(err, o.id)
	}
	defer c.Close()
	r, err := c.Requeue(o.id, &s)
	if err != nil {
		return failure(err, o.id)
	}
	if o.json {
		err = writeJSON(stdout, submitted{ID: r.ID, Position: r.Position, Pool: r.Pool, State: r.State, Token: s.Token, From: o.id})
	} else {
		_, err = fmt.Fprintf(stdout, "%s (again from task %d)\n", submittedLine(r), o.id)
	}
	if err != nil {
		warn("%v", err)
		return exitcode.Failure
	}
	return 0
}

// taskWaiter is a wait request in flight, on its own connection, which
// it renews when the broker restarts.
type taskWaiter struct {
	path    string
	id      uint64
	c       *wire.Conn
	redials int
	task    *wire.TaskInfo // once it has ended
}

// maxRedials bounds how often a wait is renewed after the broker closed
// its connection, so that a broker that fails on every wait is not asked
// forever.
const maxRedials = 10

func startWait(path string, id uint64) (*taskWaiter, error) {
	c, err := wire.Dial(path)
	if err != nil {
		return nil, err
	}
	w := &taskWaiter{path: path, id: id, c: c}
	if err := w.send(); err != nil {
		c.Close()
		if !wire.Gone(err) {
			return nil, err
		}
		// The broker went away between our connect and our request: it
		// is restarting, as after the connection it closes on a wait.
		w.redials++
		if err := w.redial(); err != nil {
			return nil, err
		}
	}
	return w, nil
}

func (w *taskWaiter) send() error {
	if err := w.c.Send(&wire.Request{Op: wire.OpWait, ID: w.id}); err != nil {
		return fmt.Errorf("send wait: %w", err)
	}
	return nil
}

// Fd is the descriptor to poll for the reply; it changes on a redial.
func (w *taskWaiter) Fd() int { return w.c.Fd() }

// recv reads what the broker sent, waiting up to timeout (forever when
// negative), and reports whether the task has ended; w.task is then set.
// A broker restart is not an end: the wait is sent again on a new
// connection, as the task and its record outlive the broker.
func (w *taskWaiter) recv(timeout time.Duration) (bool, error) {
	r, _, err := w.c.Recv(timeout)
	switch {
	case errors.Is(err, wire.ErrTimeout):
		return false, nil
	case wire.Gone(err) && w.redials < maxRedials:
		w.redials++
		w.c.Close()
		return false, w.redial()
	case err != nil:
		return false, err
	case r.Type == wire.TypeQueued:
		return false, nil
	case r.Type != wire.TypeTasks:
		return false, fmt.Errorf("unexpected reply %q to wait", r.Type)
	case len(r.Tasks) != 1:
		return false, fmt.Errorf("wait: %d tasks in reply, want 1", len(r.Tasks))
	}
	w.task = &r.Tasks[0]
	return true, nil
}

// redialFor is how long a wait keeps trying to reach a broker that is
// restarting.
const redialFor = 10 * time.Minute

// redial connects again and renews the wait, retrying while the broker is
// away (restarting: its socket refuses, or accepts and resets).
func (w *taskWaiter) redial() error {
	deadline := time.Now().Add(redialFor)
	for pause := 100 * time.Millisecond; ; pause = min(2*pause, 2*time.Second) {
		c, err := wire.Dial(w.path)
		if err == nil {
			w.c = c
			if err = w.send(); err == nil {
				return nil
			}
			c.Close()
		}
		if time.Now().Add(pause).After(deadline) {
			return fmt.Errorf("the broker went away: %w", err)
		}
		time.Sleep(pause)
	}
}

// Ended is recv for a caller that polled Fd and found it readable.
func (w *taskWaiter) Ended() (bool, error) { return w.recv(0) }

func (w *taskWaiter) close() { w.c.Close() }

// resolveFor is how long a submission whose answer was lost is sent
// again (with its token) before task-submit says it cannot tell whether
// it was submitted: long enough for a broker to restart, or to get
// descriptors back. (A variable: tests shorten it.)
var resolveFor = time.Minute

// newToken makes a submission's token: 128 random bits.
func newToken() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("make the submission's token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// failure reports an error from the broker or the connection to it and
// returns the exit status for it (wire.ExitStatus: npurun's and
// npubroker's too). id is the task asked about, 0 if none.
func failure(err error, id uint64) int {
	var be *wire.Error
	switch {
	case errors.As(err, &be):
		if be.Code == wire.CodeNoSuchTask && id != 0 {
			warn("no task %d (or not yours)", id)
		} else if be.Message != "" {
			warn("%s", be.Message)
		} else {
			warn("the broker refused: %s", be.Code)
		}
		if be.Hint != "" {
			hint("%s", be.Hint)
		}
	case errors.Is(err, wire.ErrNoBroker) || errors.Is(err, wire.ErrNoAnswer):
		warn("%v", err)
		hint("%s", wire.Hint(err))
	case wire.Gone(err):
		warn("the broker went away before it answered (%v)", err)
		hint("%s", wire.Hint(err))
	default:
		warn("%v", err)
	}
	return wire.ExitStatus(err)
}

// checkContainer refuses, before it is submitted, a task the supervisor
// would refuse at its start: a container engine's command with devices
// that is not a run, or a detached run (the task would end at once, and
// its container with it). The supervisor hands the lease into the
// container (package container).
func checkContainer(s *wire.Submission) error {
	engine := container.Detect(s.Argv)
	if engine == "" || s.NoDevice {
		return nil
	}
	r, err := container.Parse(engine, s.Argv)
	if err != nil {
		return fmt.Errorf("%w: a task's lease goes to a container that %s run starts", err, engine)
	}
	if r.Detach {
		return fmt.Errorf("%s run --detach: a task's container runs attached, the task's life being the container's", engine)
	}
	return nil
}

// listMemory leaves the garbage collector off for list until its heap
// reaches listHeap: what list reads it keeps until it exits, so
// collecting meanwhile is work for nothing, and it was a quarter of
// list's time for 10,000 tasks. GOGC or GOMEMLIMIT in the environment
// rule instead.
func listMemory() {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	debug.SetMemoryLimit(listHeap)
	debug.SetGCPercent(-1)
}

// listHeap is the heap list grows to before it collects: some 50 times
// what 10,000 tasks take.
const listHeap = 256 << 20
