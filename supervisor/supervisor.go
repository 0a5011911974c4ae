// Package supervisor is the task supervisor program's logic (npurun-supervise):
// it runs one detached task as its submitter and reports how it ended to the
// broker. It owns the task's process tree while it runs (start, signals, the
// OOM and end report, the notification); it talks to the broker only over the
// wire and must never import the daemon (broker/...), which runs as root.
package supervisor

// The broker starts the supervisor, `npurun-supervise [ID]` (cmd/npurun-
// supervise, a small static program of its own), already as the submitter,
// in a session of its own, with cwd "/", PATH alone in its environment and
// /dev/null for standard output and error. Its standard input is a
// SOCK_SEQPACKET socket to the broker carrying two messages: the Spec; then,
// when the task is granted and its start is in the journal, the go-ahead (a
// Spec with the devices and their variables) with the lease's flock-held
// lock descriptors. A supervisor started for task ID gets its Spec at once;
// one started without an ID is idle, kept ready for the submitter's next
// task, and gets its Spec (any task of its uid) when the broker gives it one.
// One whose Spec is a notice (wire.Spec.Notice: the [idle] policy's
// warning to a running task) runs the task's notify command with
// NPURUN_TASK_STATE set to it, as at the task's end, and exits: the task
// runs under another supervisor, and this one gets no go-ahead and
// reports nothing.
// If the broker drops it instead of a go-ahead (the task was cancelled, or
// its start could not be recorded), or closes an idle supervisor's socket,
// the supervisor exits having run nothing. If the socket closes without a
// word before the go-ahead, the broker died: it may have recorded the
// task's start, so the supervisor, having run nothing and never to run it,
// tells the next broker so (task-not-started, retried as reports are),
// which puts the task back in line. Otherwise it starts the command with
// the descriptors, closes its own copies at once (the lease lives and dies
// with the command's process tree), waits, and reports the end with
// task-done until the broker acknowledges it.
//
// Everything the supervisor needs the broker resolved as root: its uid,
// gid and groups are set when it is started, the command is resolved (a
// --run string comes as [shell, "-c", string]) and the log named; so it
// looks nothing up in the user database, and starts as fast as a small Go
// program does.

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/wire"
	_ "github.com/npurun/npurun/wire/jsoncodec" // messages beyond the lease exchange
)

// maxSpec is the largest message the broker may send.
const maxSpec = wire.MaxMessage

// brokerFD is the descriptor of the socket to the broker.
const brokerFD = 0

// Name is the supervisor's program name, its argv[0]: the broker knows
// its supervisors by it (with the task id after it, when started for one).
const Name = wire.SupervisorName

// errUsage marks a Spec or command line the supervisor refuses outright.
var errUsage = errors.New("usage: " + Name + " [ID]")

// Main is the body of `npurun-supervise [ID]`; args is ["ID"], or empty for
// an idle supervisor. It returns 0 once the broker has acknowledged the
// task's end (or when no task was given to it, or a broker has heard that
// it never started), 1 when it gave up reporting, 2 when the command line
// or the Spec is unusable.
func Main(args []string) int {
	cancel := catchSignals()
	// Nothing inherited beyond the standard three reaches the command.
	_ = unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	prime()
	spec, err := readSpec(args)
	if errors.Is(err, errNoTask) {
		return 0 // an idle supervisor let go: nothing was to run
	}
	if err != nil {
		warn("%v", err)
		return 2
	}
	if spec.Notice != "" {
		// A notify-only launch (wire.Spec.Notice): nothing more comes.
		if err := releaseStdin(); err != nil {
			warn("%v", err)
		}
		if spec.Notify != "" {
			notify(spec, nil)
		}
		return 0
	}
	prep := prepare(spec)
	leases, err := awaitGoAhead(spec)
	switch {
	case errors.Is(err, wire.ErrClosed) || errors.Is(err, unix.ECONNRESET):
		// The broker died without a word: the next one must hear that
		// this task never started (the go-ahead, had it been sent, would
		// have been read before the socket's end).
		warn("task %d not started: the broker went away; telling the next one", spec.ID)
		if err := releaseStdin(); err != nil { // a dead socket: nothing more comes on it
			warn("%v", err)
		}
		return notStarted(spec, cancel)
	case err != nil:
		// Not started: let go (cancelled while waiting), or a go-ahead
		// it cannot use.
		warn("task %d not started: %v", spec.ID, err)
		return 0
	}
	started := keepBroker(spec.ID)
	st := runTask(spec, prep, leases, cancel, started)
	started(false) // if it was not said yet: the command never started
	code := report(spec, st, cancel)
	if code == 0 && spec.Notify != "" {
		notify(spec, st) // once its end is recorded (notify.go)
	}
	return code
}

// catchSignals makes SIGHUP and SIGINT harmless and returns the channel on
// which SIGTERM, the broker's cancel, arrives. The two are caught into a
// channel nobody reads rather than ignored: an ignored disposition would
// pass through exec to the command, a caught one is reset to the default.
func catchSignals() <-chan os.Signal {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP, syscall.SIGINT)
	cancel := make(chan os.Signal, 1)
	signal.Notify(cancel, syscall.SIGTERM)
	return cancel
}

// specSample has every field of a Spec and of a go-ahead.
const specSample = `{"id":1,"uid":0,"argv":["a"],"cwd":"/","env":["A=b"],"devices":[0],"log":"/a","time_sec":1,"grace_sec":1,"idle":true,"socket":"/a"}`

// prime does before the broker's Spec comes what the task's start would
// otherwise do for the first time, so that an idle supervisor, or one
// started ahead of its grant, does it while it waits: encoding/json's
// first decode, which builds its caches (a millisecond or more here); the
// local time zone read, for the log's start line; and package os's check
// that pidfds work, which forks a child, for the command's start.
func prime() {
	var spec wire.Spec
	_ = json.Unmarshal([]byte(specSample), &spec)
	_ = time.Now().Format(time.RFC3339)
	if self, err := os.FindProcess(os.Getpid()); err == nil {
		self.Release()
	}
}

// warn writes one line to standard error (/dev/null when the broker
// starts the supervisor; the tests read it).
func warn(format string, args ...any) {
	fmt.Fprintf(os.Stderr, Name+": "+format+"\n", args...)
}

// errNoTask means the broker closed an idle supervisor's socket without
// giving it a task.
var errNoTask = errors.New("no task given")

// readSpec reads the broker's Spec and checks it names the task of args
// (any task, for an idle supervisor) and this process's uid.
func readSpec(args []string) (*wire.Spec, error) {
	var id uint64
	switch len(args) {
	case 0:
	case 1:
		var err error
		if id, err = strconv.ParseUint(args[0], 10, 64); err != nil || id == 0 {
			return nil, fmt.Errorf("task id %q: %w", args[0], errUsage)
		}
	default:
		return nil, errUsage
	}
	var spec wire.Spec
	fds, err := receive(&spec)
	closeAll(fds) // the Spec comes alone
	if id == 0 && errors.Is(err, wire.ErrClosed) {
		return nil, errNoTask
	}
	if err != nil {
		return nil, fmt.Errorf("read spec: %w", err)
	}
	if id == 0 {
		id = spec.ID
	}
	return &spec, checkSpec(&spec, id, uint32(os.Getuid()))
}

// errDropped is a broker's word that the task will not start under this
// supervisor.
var errDropped = errors.New("let go by the broker")

// awaitGoAhead waits for the broker's word to start and returns the
// lease's lock files, one per device.
func awaitGoAhead(spec *wire.Spec) ([]*os.File, error) {
	var g wire.Spec
	fds, err := receive(&g)
	switch {
	case err != nil:
		closeAll(fds)
		return nil, err
	case g.Drop:
		closeAll(fds)
		return nil, errDropped
	case g.ID != spec.ID || len(g.Devices) != len(fds) || len(fds) > wire.MaxDevices:
		closeAll(fds)
		return nil, fmt.Errorf("go-ahead for task %d with %d devices and %d descriptors", g.ID, len(g.Devices), len(fds))
	}
	spec.Devices = g.Devices
	spec.Env = append(spec.Env, g.Env...)
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		files[i] = os.NewFile(uintptr(fd), "npu"+strconv.Itoa(g.Devices[i])+".lock")
	}
	return files, nil
}

// receive reads one message from the broker into v, with the descriptors
// that came with it.
func receive(v any) ([]int, error) {
	buf := make([]byte, maxSpec+1)
	oob := make([]byte, unix.CmsgSpace(wire.MaxDevices*4))
	b, fds, err := wire.RecvMsg(brokerFD, buf, oob, 0)
	if err != nil {
		return nil, err
	}
	if len(b) > maxSpec {
		return fds, fmt.Errorf("message larger than %d bytes", maxSpec)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fds, fmt.Errorf("decode: %w", err)
	}
	return fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// checkSpec refuses a Spec the supervisor could not even report on, and
// one for another user's task: it would run it with the wrong rights.
func checkSpec(spec *wire.Spec, id uint64, uid uint32) error {
	switch {
	case spec.ID != id || id == 0:
		return fmt.Errorf("spec is for task %d, not task %d", spec.ID, id)
	case spec.UID != uid:
		return fmt.Errorf("spec of task %d is for uid %d, and this supervisor runs as uid %d", id, spec.UID, uid)
	case spec.Socket == "":
		return fmt.Errorf("spec of task %d names no broker socket", id)
	case len(spec.Devices) > wire.MaxDevices:
		return fmt.Errorf("spec of task %d names %d devices, more than %d", id, len(spec.Devices), wire.MaxDevices)
	case spec.Notice != "" && spec.Notice != wire.NoticeIdle:
		return fmt.Errorf("spec of task %d asks for a notice %q, not %q", id, spec.Notice, wire.NoticeIdle)
	}
	return nil
}

// keepBroker moves the socket to the broker off standard input, where
// /dev/null takes its place, and returns what tells the broker, once, that
// the command has started (or could not start) and closes the socket: the
// broker starts nothing more for this user before that, so as not to slow
// this start.
func keepBroker(id uint64) func(ok bool) {
	fd, err := unix.FcntlInt(brokerFD, unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		warn("%v", err)
		fd = -1
	}
	if err := releaseStdin(); err != nil {
		warn("%v", err)
	}
	done := false
	return func(ok bool) {
		if done || fd < 0 {
			return
		}
		done = true
		if b, err := json.Marshal(&wire.Started{ID: id, Started: ok}); err == nil {
			_ = wire.SendMsg(fd, b, nil, 0) // a broker gone meanwhile does not need it
		}
		unix.Close(fd)
	}
}

// releaseStdin closes the socket the Spec came on, keeping descriptor 0
// taken by /dev/null so that no later open lands there.
func releaseStdin() error {
	null, err := os.Open(os.DevNull)
	if err != nil {
		return fmt.Errorf("release stdin: %w", err)
	}
	defer null.Close()
	if err := unix.Dup3(int(null.Fd()), 0, 0); err != nil {
		return fmt.Errorf("release stdin: %w", err)
	}
	return nil
}
