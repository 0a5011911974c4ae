// Package shim is what npurun does: find or ask for a lease, set the device
// variables and become the command. It sits in front of every job, so its
// imports stay lean (tests/e2e/cli/lean_test.go: no encoding/json, no net) and it
// must never import the daemon (broker/...).
package shim

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/exitcode"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
)

// Options are npurun's flags.
type Options struct {
	Socket   string
	N        int   // devices wanted (0: one, or as many as Devices names)
	Devices  []int // exactly these
	Pool     string
	Mem      int64 // a share of each device, of this much memory in MiB (--mem); 0: whole devices
	NoWait   bool
	Timeout  time.Duration // 0: wait as long as it takes
	Time     time.Duration // --time: the lease's time limit, after which its command is ended; 0: none
	NoDevice bool
	Verbose  bool
	Quiet    bool
	Login    bool // npurun --login: a login shell under the login lease

	// Container names the engine (docker, podman) of a command whose
	// program has another name; a docker or podman command is one
	// anyway (containerEngine).
	Container string
}

// Run acquires a lease and executes argv under it. It returns only when it
// could not execute argv, with the exit status to use.
func Run(o Options, argv []string) int {
	if len(argv) == 0 {
		warn("no command given")
		return exitcode.Usage
	}
	if o.NoDevice {
		// No lease for this command, and every device hidden. A lease
		// inherited from an npurun above stays whole: its descriptors stay
		// open in this process and its command, as in any process of the
		// lease's tree, so the devices are released only when that tree is
		// gone (npurun -n 8 npurun --no-device CMD holds them while CMD
		// runs). NPURUN_LEASE stays too, so that an npurun below does not
		// ask the broker for devices its ancestor holds.
		return execute(argv, npu.HiddenEnv(), nil)
	}
	if engine := containerEngine(o, argv); engine != "" {
		return runContainer(o, engine, argv)
	}
	if lease, ok := inheritedLease(wire.SocketPath(o.Socket)); ok {
		if v, set := os.LookupEnv("NPURUN_DEVICES"); set && v == "" {
			// Under an npurun --no-device inside the lease: the devices
			// are hidden here, and the lease's variables are gone.
			warn("inside a lease of %s whose devices an npurun --no-device above hides", npu.Unknown.Format(lease.devices))
			hint("run this npurun outside the npurun --no-device, or drop --no-device there")
			return exitcode.Failure
		}
		if err := lease.covers(o); err != nil {
			warn("%v", err)
			hint("a nested npurun runs inside its parent's lease; ask for the devices in the outer npurun")
			return exitcode.Failure
		}
		// Asking for some of the lease's devices (-n, -d) takes a
		// sub-lease of them, waiting for siblings' (sublease.go); asking
		// for none in particular runs on the whole lease, beside them.
		var sub *sublease
		if o.N > 0 || len(o.Devices) > 0 {
			s, code, err := lease.takeSublease(o, &waiter{o: o, tty: isTerminal(2)})
			if err != nil {
				warn("%v", err)
				return code
			}
			sub = s
			o.Devices, o.N = s.devices, 0
		}
		env, keep, devices, err := lease.env(o)
		if err != nil {
			warn("%v", err)
			return exitcode.Failure
		}
		if sub != nil {
			env, keep = append(env, sub.env...), append(keep, sub.fds...)
		}
		if o.Verbose && len(devices) < len(lease.devices) {
			warn("inside a lease of %s; running on %s of it, not asking again", npu.Unknown.Format(lease.devices), npu.Unknown.Format(devices))
		} else if o.Verbose {
			warn("inside a lease of %s; not asking again", npu.Unknown.Format(lease.devices))
		}
		return execute(argv, env, keep)
	}
	sayEnded(wire.SocketPath(o.Socket))
	w := waiter{o: o, tty: isTerminal(2)}
	g, fds, code := w.acquire()
	if g == nil {
		return code
	}
	env, placed, err := leaseEnv(g, fds)
	if err != nil {
		warn("%v", err)
		return exitcode.Failure
	}
	if w.held != nil {
		closeFDs(fds) // placed are the lease's, the child's alone
		return w.runHeld(argv, env, placed, g.SlurmJob)
	}
	return execute(argv, env, placed)
}

// waiter is one acquisition in progress, with its progress line.
type waiter struct {
	o        Options
	tty      bool
	shown    bool   // a progress line is on the terminal
	last     string // the last progress text shown
	place    string // where the request waits, from the last queued reply: 1 device in pool "default": 2nd in line
	deadline time.Time
	signals  chan os.Signal
	waitFor  time.Duration // a login's on_busy wait, as the broker announced it
	// held: the connection of a grant through a Slurm placeholder
	// allocation (allocate mode), kept open to hear if Slurm ends it
	held *wire.Conn
}

func (w *waiter) request() *wire.Request {
	return &wire.Request{Op: wire.OpAcquire, N: w.o.N, Pool: w.o.Pool, Devices: w.o.Devices, NoWait: w.o.NoWait, Mem: w.o.Mem,
		TimeSec: int64((w.o.Time + time.Second - 1) / time.Second)}
}

// acquire returns the grant and its descriptors, or nil and the exit
// status to use.
func (w *waiter) acquire() (*wire.Reply, []int, int) {
	path := wire.SocketPath(w.o.Socket)
	start := time.Now()
	if w.o.Timeout > 0 {
		w.deadline = start.Add(w.o.Timeout)
	}
	c, err := wire.Dial(path)
	if err != nil {
		warn("%v", err)
		if h := wire.Hint(err); h != "" {
			hint("%s", h)
			return nil, nil, exitcode.Unavailable
		}
		return nil, nil, exitcode.Failure
	}
	defer func() {
		if c != nil {
			c.Close()
		}
	}()
	err = c.Send(w.request())
	gone := 0 // times in a row the broker went away without answering
	for {
		var r *wire.Reply
		var fds []int
		if err != nil {
			err = fmt.Errorf("send request: %w", err)
		} else {
			timeout := time.Duration(-1)
			if !w.deadline.IsZero() {
				timeout = max(time.Until(w.deadline), 0)
			}
			r, fds, err = c.Recv(timeout)
		}
		if err == nil || errors.As(err, new(*wire.Error)) {
			gone = 0 // answered
		}
		var be *wire.Error
		switch {
		case err == nil && r.Type == wire.TypeQueued:
			w.cancelOnSignal()
			w.progress(r)
			continue
		case err == nil && r.Type == wire.TypeGrant:
			w.granted(r, time.Since(start))
			if r.SlurmJob != 0 {
				w.held, c = c, nil
			}
			return r, fds, 0
		case err == nil:
			w.clear()
			warn("unexpected reply %q from the broker", r.Type)
			return nil, nil, exitcode.Failure
		case errors.As(err, &be):
			w.clear()
			return nil, nil, refused(be)
		case errors.Is(err, wire.ErrNoAnswer):
			w.clear()
			warn("%v", err)
			hint("%s", wire.Hint(err))
			return nil, nil, exitcode.Unavailable
		case errors.Is(err, wire.ErrTimeout):
			w.clear()
			warn("gave up after %s waiting for %s", quantity.Duration(w.o.Timeout), cmp.Or(w.place, w.what()))
			return nil, nil, exitcode.TempFail
		case wire.Gone(err) && (w.o.NoWait || gone == maxGone):
			// --no-wait does not wait for a broker to come back either;
			// nor does anyone for one that never answers.
			w.clear()
			if gone == maxGone {
				warn("the broker went away %d times in a row without answering (%v)", gone+1, err)
			} else {
				warn("the broker went away before it answered (%v)", err)
			}
			hint("%s", wire.Hint(err))
			return nil, nil, exitcode.Unavailable
		case wire.Gone(err):
			// The broker went away, before or after it took the request
			// (it restarted, or died): our place is gone, the wait is not.
			gone++
			c.Close()
			c = nil
			w.say("the broker went away; reconnecting")
			if c, err = w.redial(path, fmt.Errorf("the broker went away (%w)", err)); err != nil {
				w.clear()
				warn("%v", err)
				return nil, nil, exitcode.TempFail
			}
			err = c.Send(w.request()) // a broker gone again is counted above
		default:
			w.clear()
			warn("%v", err)
			return nil, nil, exitcode.Failure
		}
	}
}

// refused tells the user why the broker refused and returns the exit
// status that says so.
func refused(be *wire.Error) int {
	warn("%s", be.Message)
	if be.Hint != "" {
		hint("%s", be.Hint)
	}
	return wire.ExitStatus(be)
}

// redialEvery is how often a waiting npurun tries to reach a restarting
// broker.
const redialEvery = 100 * time.Millisecond

// maxGone is how often in a row a waiting npurun reconnects to a broker
// that goes away without answering (one that fails at every request, or
// crashes at every start) before it takes it for no broker at all.
const maxGone = 10

// redial connects again, every redialEvery, until it reaches a broker: one
// that is restarting refuses for a while. why is what ended the last
// connection, said where the deadline comes first.
func (w *waiter) redial(path string, why error) (*wire.Conn, error) {
	err := why
	for {
		if !w.deadline.IsZero() && time.Now().Add(redialEvery).After(w.deadline) {
			return nil, fmt.Errorf("gave up after %s: %w", quantity.Duration(w.o.Timeout), err)
		}
		time.Sleep(redialEvery)
		var c *wire.Conn
		if c, err = wire.Dial(path); err == nil {
			return c, nil
		}
	}
}

// cancelOnSignal makes an interrupted wait end cleanly: the progress line
// cleared, a word said, the shell's status for the signal. Closing the
// connection, which exiting does, is what takes the request off the queue.
func (w *waiter) cancelOnSignal() {
	if w.signals != nil {
		return
	}
	w.signals = make(chan os.Signal, 1)
	signal.Notify(w.signals, unix.SIGINT, unix.SIGTERM, unix.SIGHUP)
	go func() {
		sig := (<-w.signals).(unix.Signal)
		w.clear()
		warn("cancelled while waiting (%s)", unix.SignalName(sig))
		os.Exit(128 + int(sig))
	}()
}

func (w *waiter) what() string {
	if len(w.o.Devices) > 0 {
		return wire.Wanted(len(w.o.Devices), w.o.Mem, npu.Unknown.Format(w.o.Devices))
	}
	return wire.Wanted(max(w.o.N, 1), w.o.Mem, "")
}

func (w *waiter) progress(r *wire.Reply) {
	msg := fmt.Sprintf("%s in pool %q: %s in line", w.what(), r.Pool, wire.Ordinal(r.Position))
	if len(r.Ahead) > 0 {
		msg += fmt.Sprintf(" (%d ahead: %s)", r.Position-1, strings.Join(r.Ahead, ", "))
		if r.Position-1 > len(r.Ahead) {
			msg = strings.TrimSuffix(msg, ")") + ", …)"
		}
	}
	if r.Reason != "" {
		msg += "; " + r.Reason
	}
	w.place = msg // for a --timeout's message, even with -q
	w.say("waiting for " + msg + "; " + wire.StartBy(r.Start, time.Now()))
}

// say shows a progress line: rewritten in place on a terminal, a line per
// change with -v, nothing otherwise.
func (w *waiter) say(msg string) {
	if msg == w.last || w.o.Quiet {
		return
	}
	w.last = msg
	switch {
	case w.tty:
		fmt.Fprintf(os.Stderr, "\r\033[Knpurun: %s", msg)
		w.shown = true
	case w.o.Verbose:
		warn("%s", msg)
	}
}

func (w *waiter) clear() {
	if w.shown {
		os.Stderr.WriteString("\r\033[K")
		w.shown = false
	}
}

func (w *waiter) granted(r *wire.Reply, waited time.Duration) {
	w.clear()
	if r.EndsBy > 0 && !w.o.Quiet && (w.tty || w.o.Verbose) {
		// Backfilled: it must end before a request ahead starts.
		warn("%s", wire.Backfilled(r.EndsBy, r.Before, r.Beside, time.Now()))
	}
	if w.o.Mem > 0 && r.Message != "" && !w.o.Quiet && (w.tty || w.o.Verbose) {
		// A share: what it was granted, and what else the device holds.
		warn("%s", r.Message)
		return
	}
	if w.o.Quiet || (w.last == "" && !w.o.Verbose) {
		return
	}
	if w.last != "" || w.o.Verbose {
		if w.tty || w.o.Verbose {
			warn("granted %s after %s", npu.Vendor(r.Vendor).Format(r.Devices), quantity.Duration(waited))
		}
	}
}

// execute replaces this process with argv, its environment overridden by
// env. keep are descriptors that must stay open (already cleared of
// close-on-exec).
func execute(argv []string, env []string, keep []int) int {
	path, code := lookPath(argv[0])
	if code != 0 {
		return code
	}
	err := unix.Exec(path, argv, mergeEnv(os.Environ(), env))
	warn("%s: %v", argv[0], err)
	closeFDs(keep)
	if errors.Is(err, unix.ENOENT) {
		return exitcode.NotFound
	}
	return exitcode.NoExec
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// lookPath finds a command as a shell would, without os/exec.
func lookPath(name string) (string, int) {
	if strings.Contains(name, "/") {
		return name, 0
	}
	denied := ""
	for _, dir := range strings.Split(os.Getenv("PATH"), ":") {
		if dir == "" {
			dir = "."
		}
		p := dir + "/" + name
		var st unix.Stat_t
		if unix.Stat(p, &st) != nil || st.Mode&unix.S_IFMT == unix.S_IFDIR {
			continue
		}
		if unix.Access(p, unix.X_OK) == nil {
			return p, 0
		}
		denied = p
	}
	if denied != "" {
		warn("%s: permission denied", denied)
		return "", exitcode.NoExec
	}
	warn("%s: command not found", name)
	return "", exitcode.NotFound
}

// mergeEnv returns base with the entries of over replacing those of the
// same name.
func mergeEnv(base, over []string) []string {
	if len(over) == 0 {
		return base
	}
	names := make(map[string]bool, len(over))
	for _, kv := range over {
		names[kv[:strings.IndexByte(kv, '=')+1]] = true
	}
	out := make([]string, 0, len(base)+len(over))
	for _, kv := range base {
		if i := strings.IndexByte(kv, '='); i < 0 || !names[kv[:i+1]] {
			out = append(out, kv)
		}
	}
	return append(out, over...)
}

func isTerminal(fd int) bool {
	_, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	return err == nil
}

func warn(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "npurun: "+format+"\n", args...)
}

func hint(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "npurun: hint: "+format+"\n", args...)
}
