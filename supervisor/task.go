package supervisor

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/container"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
)

// reasonCancelled is the Status reason of a task the broker cancelled.
const reasonCancelled = wire.ReasonCancelled

// The idle I/O class of ioprio_set(2), which x/sys/unix does not name.
const (
	ioprioWhoProcess = 1
	ioprioClassIdle  = 3
	ioprioClassShift = 13
)

// errNotFound means the command is not in the task's PATH.
var errNotFound = errors.New("not found in the task's PATH")

// prepared is what can be done before the go-ahead, so that a grant
// starts the command without delay: the log open, the program found, its
// standard input open.
type prepared struct {
	log     *os.File
	null    *os.File // /dev/null, the command's standard input
	path    string
	logErr  error
	pathErr error
}

func prepare(spec *wire.Spec) *prepared {
	p := &prepared{}
	p.log, p.logErr = openLog(spec.Log)
	if p.logErr == nil {
		if p.null, p.logErr = os.Open(os.DevNull); p.logErr != nil {
			p.log.Close()
		}
	}
	p.path, p.pathErr = resolve(spec.Argv, spec.Env, spec.Cwd)
	return p
}

// runTask runs the command of spec to its end and says how it ended,
// calling started once the command has started or failed to. The lease's
// descriptors are closed by the time it returns.
func runTask(spec *wire.Spec, p *prepared, leases []*os.File, cancel <-chan os.Signal, started func(ok bool)) *wire.Status {
	defer closeFiles(leases)
	if p.logErr != nil {
		return &wire.Status{Reason: p.logErr.Error()}
	}
	log := p.log
	defer log.Close()
	defer p.null.Close()
	if cancelled(cancel) {
		logf(log, "npurun: task %d cancelled before it started\n", spec.ID)
		return &wire.Status{Reason: reasonCancelled}
	}
	var logStart int64
	if st, err := log.Stat(); err == nil {
		logStart = st.Size()
	}
	if err := becomeSubreaper(); err != nil {
		logf(log, "npurun: task %d: become its processes' subreaper: %v; what leaves its process group may outlive it\n", spec.ID, err)
	}
	pid, la, err := startCommand(spec, p, leases)
	closeFiles(leases)
	started(err == nil)
	if err != nil {
		logf(log, "npurun: task %d did not start: %v\n", spec.ID, err)
		return startFailure(err)
	}
	if la != nil {
		defer la.Close() // a lease not handed over by the end is nobody's
		if la.Handover != nil {
			go la.Handover.Serve(-1)
			defer la.Handover.Stop()
		}
	}
	end := supervise(pid, spec, cancel)
	// A SIGTERM that came since supervise stopped awaiting one (the
	// leader had exited) was the broker's cancel of a task that was
	// ending: done with here, before the log says the task ended. Only
	// one that comes while the end is reported gives the report up (tell).
	cancelled(cancel)
	if end.left > 0 {
		if end.left == 1 {
			logf(log, "npurun: task %d: its command exited leaving 1 process running; it was ended\n", spec.ID)
		} else {
			logf(log, "npurun: task %d: its command exited leaving %d processes running; they were ended\n", spec.ID, end.left)
		}
	}
	if end.stuck > 0 {
		logf(log, "npurun: task %d: %d of its processes could not be ended\n", spec.ID, end.stuck)
	}
	st := endStatus(end)
	if st.Exit == nil || *st.Exit != 0 || st.Reason != "" {
		st.OOM = outOfMemory(log, logStart)
	}
	logf(log, "npurun: task %d ended: %s\n", spec.ID, describe(st))
	return st
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close() // a second close of an *os.File is a harmless error
	}
}

// openLog opens the task's log for appending, creating it and its parent
// directories as the submitter, never through a symbolic link.
func openLog(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		// MkdirAll says "file exists" for a directory it may not look
		// into; the submitter needs to hear why.
		if _, serr := os.Stat(filepath.Dir(path)); serr != nil && !errors.Is(serr, fs.ErrNotExist) {
			err = serr
		}
		return nil, fmt.Errorf("open log %s: %w", path, err)
	}
	// Read too: a run's end looks at what it wrote (outOfMemory).
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is already in the message
		}
		return nil, fmt.Errorf("open log %s: %w", path, err)
	}
	return f, nil
}

// logf writes one line to the task's log; a log that cannot be written
// must not stop the task, so errors are dropped.
func logf(w io.Writer, format string, args ...any) {
	fmt.Fprintf(w, format, args...)
}

// cancelled tells whether SIGTERM came already.
func cancelled(cancel <-chan os.Signal) bool {
	select {
	case <-cancel:
		return true
	default:
		return false
	}
}

// startCommand logs the start and starts the command in a process group of
// its own, with /dev/null for its standard input, the log for its outputs
// and the lease where npurun places one (wire.PlaceLease: at 20 and
// above, which a login bash leaves open), and returns its pid. It starts it
// with syscall.ForkExec: os/exec's Start does more (a Process with its
// pidfd, the environment deduplicated) for nothing the supervisor uses,
// some 50 µs on a task's start here.
func startCommand(spec *wire.Spec, p *prepared, leases []*os.File) (int, *container.Launch, error) {
	if p.pathErr != nil {
		return 0, nil, fmt.Errorf("start: %w", p.pathErr)
	}
	log := p.log
	lease := ""
	argv := spec.Argv
	files := []uintptr{p.null.Fd(), log.Fd(), log.Fd()}
	la, err := containerLaunch(spec, leases)
	if err != nil {
		return 0, nil, fmt.Errorf("start: %w", err)
	}
	if la != nil {
		// The container gets the lease, not the engine's command line.
		argv, files = la.Argv, la.Files([3]uintptr{files[0], files[1], files[2]})
		defer la.Started()
	} else if len(leases) > 0 {
		fds := make([]int, len(leases))
		for i, f := range leases {
			fds[i] = int(f.Fd())
		}
		// Placed without close-on-exec, the copies pass to the command
		// as they are; this process's go when the command has started.
		placed, entry, err := wire.PlaceLease(spec.Devices, fds)
		if err != nil {
			return 0, nil, fmt.Errorf("start: %w", err)
		}
		defer closeAll(placed)
		lease = entry
	}
	attr := &syscall.ProcAttr{
		Dir:   spec.Cwd,
		Env:   taskEnv(spec.Env, lease),
		Files: files,
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	}
	if spec.Umask != nil {
		// The submitter's, for the command (the supervisor has made its
		// own files already: the log, with its own mode).
		syscall.Umask(int(*spec.Umask & 0o777))
	}
	logf(log, "npurun: task %d started %s at %s\n", spec.ID, placement(spec.Devices), time.Now().Format(time.RFC3339))
	pid, err := start(p.path, argv, attr, spec.Idle)
	if err != nil {
		if la != nil {
			la.Close()
		}
		return 0, nil, fmt.Errorf("start %s in %s: %w", p.path, spec.Cwd, err)
	}
	return pid, la, nil
}

// containerLaunch prepares a task whose command is a container engine's
// run (docker run, podman run) to hand its lease into the container, as
// npurun does (package container): its life, and so its time limit, are
// then the container's. nil for any other command, or a task without
// devices.
func containerLaunch(spec *wire.Spec, leases []*os.File) (*container.Launch, error) {
	engine := container.Detect(spec.Argv)
	if engine == "" || len(leases) == 0 {
		return nil, nil
	}
	r, err := container.Parse(engine, spec.Argv)
	if err != nil {
		return nil, fmt.Errorf("%w: npurun hands a task's lease to a container that %s run starts", err, engine)
	}
	fds := make([]int, len(leases))
	for i, f := range leases {
		fds[i] = int(f.Fd())
	}
	devDir := lookupEnv(spec.Env, "NPURUN_DEV_DIR")
	l := container.Lease{Vendor: npu.VendorOf(spec.Env, devDir, spec.Devices), Devices: spec.Devices, FDs: fds, Env: spec.Env}
	return container.Prepare(r, l, container.Options{DevDir: devDir, Runtime: lookupEnv(spec.Env, "NPURUN_DOCKER_RUNTIME"), Task: true})
}

// resolve finds the program of argv: a name with a slash as given
// (relative to cwd), any other name in the PATH of the task's environment.
func resolve(argv, env []string, cwd string) (string, error) {
	if len(argv) == 0 || argv[0] == "" {
		return "", fmt.Errorf("empty command: %w", errNotFound)
	}
	name := argv[0]
	if strings.Contains(name, "/") {
		return inDir(cwd, name), nil
	}
	for _, dir := range filepath.SplitList(lookupEnv(env, "PATH")) {
		if p := inDir(cwd, filepath.Join(dir, name)); isExecutable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("look up %s: %w", name, errNotFound)
}

// inDir makes a relative path relative to dir.
func inDir(dir, path string) string {
	if filepath.IsAbs(path) {
		return path
	}
	return filepath.Join(dir, path)
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && unix.Access(path, unix.X_OK) == nil
}

// lookupEnv returns the last value of name in env, as exec would pass it.
func lookupEnv(env []string, name string) string {
	value := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			value = v
		}
	}
	return value
}

// taskEnv is the task's environment with lease, the NPURUN_LEASE entry
// naming the descriptors the command gets ("" for none); a stale
// NPURUN_LEASE is dropped. A name set twice keeps its last value (in the
// place of its first): the go-ahead's device variables come after the
// submitter's environment, which may hold stale ones, and a C program's
// getenv takes the first.
func taskEnv(env []string, lease string) []string {
	out := make([]string, 0, len(env)+1)
	at := make(map[string]int, len(env)+1)
	set := func(kv string) {
		name, _, _ := strings.Cut(kv, "=")
		if i, ok := at[name]; ok {
			out[i] = kv
			return
		}
		at[name] = len(out)
		out = append(out, kv)
	}
	for _, kv := range env {
		if !strings.HasPrefix(kv, wire.LeaseVar+"=") {
			set(kv)
		}
	}
	if lease != "" {
		set(lease)
	}
	return out
}

// placement says where the task runs, for the log.
func placement(devices []int) string {
	if len(devices) == 0 {
		return "with no device"
	}
	ids := make([]string, len(devices))
	for i, dev := range devices {
		ids[i] = strconv.Itoa(dev)
	}
	return "on npu " + strings.Join(ids, ",")
}

// start starts path with argv and attr, at idle priority when asked. Linux keeps the nice value
// and the I/O priority per thread and a child inherits them from the thread
// that forks it, so lowering and forking happen on one locked thread.
func start(path string, argv []string, attr *syscall.ProcAttr, idle bool) (int, error) {
	if idle {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := lowerPriority(); err != nil {
			return 0, err
		}
	}
	return syscall.ForkExec(path, argv, attr)
}

// lowerPriority sets nice 19 and the idle I/O class on the calling thread.
func lowerPriority() error {
	if err := unix.Setpriority(unix.PRIO_PROCESS, 0, 19); err != nil {
		return fmt.Errorf("set nice 19: %w", err)
	}
	_, _, errno := unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, 0, ioprioClassIdle<<ioprioClassShift)
	if errno != 0 {
		return fmt.Errorf("set idle i/o class: %w", errno)
	}
	return nil
}

// startFailure is the status of a command that did not start: 127 when
// it was not found, 126 otherwise, as a shell says.
func startFailure(err error) *wire.Status {
	code := 126
	if errors.Is(err, errNotFound) || errors.Is(err, fs.ErrNotExist) {
		code = 127
	}
	return &wire.Status{Exit: &code, Reason: err.Error()}
}

// supervise waits for the task to end: its leader's exit, the time limit,
// or a cancel. On the limit or a cancel it sends SIGTERM to the leader's
// process group and to every process below the supervisor, and SIGKILL
// after the grace period. Once the leader has exited, whatever it left
// running is ended too (see tree.go): SIGTERM, then SIGKILL after the
// grace, or SIGKILL at once when the task was being ended already. It
// returns once nothing of the task is left (or killFor after the kill
// began), with the leader's end, why the task was ended if it was, and how
// many processes the leader left running when it exited by itself.
func supervise(pid int, spec *wire.Spec, cancel <-chan os.Signal) *ending {
	r := startReaper(pid)
	limit, stopLimit := timeLimit(spec.TimeSec)
	defer stopLimit()
	g := group{pgid: pid}
	grace := time.Duration(spec.GraceSec) * time.Second
	var kill, giveUp, rekill <-chan time.Time
	tick := time.NewTicker(rekillEvery)
	tick.Stop() // started with the kill
	defer tick.Stop()
	leaderDone := r.leaderDone
	end := &ending{}
	startKilling := func() {
		if rekill != nil {
			return
		}
		kill = nil
		g.signal(unix.SIGKILL)
		tick.Reset(rekillEvery)
		rekill, giveUp = tick.C, time.After(killFor)
	}
	for {
		select {
		case <-r.allGone:
			end.status, end.exited = r.status, true
			end.reason = g.reason
			return end
		case <-leaderDone:
			leaderDone, limit, cancel = nil, nil, nil
			if g.reason != "" {
				startKilling() // being ended already: no second grace
				continue
			}
			// Ended by itself: what it left behind goes too.
			if end.left = leftBehind(); end.left > 0 {
				g.signal(unix.SIGTERM)
			}
			if kill == nil && rekill == nil {
				kill = time.After(grace)
			}
		case <-limit:
			limit, cancel = nil, nil
			g.end(fmt.Sprintf("time limit %s reached", quantity.Duration(time.Duration(spec.TimeSec)*time.Second)))
			kill = time.After(grace)
		case <-cancel:
			limit, cancel = nil, nil
			g.end(reasonCancelled)
			kill = time.After(grace)
		case <-kill:
			startKilling()
		case <-r.reaped:
			if rekill != nil {
				g.signal(unix.SIGKILL) // orphans come to the supervisor as their parents die
			}
		case <-rekill:
			g.signal(unix.SIGKILL)
		case <-giveUp:
			select {
			case <-r.leaderDone:
				end.status, end.exited = r.status, true
			default:
			}
			end.reason, end.stuck = g.reason, len(descendants(os.Getpid()))
			return end
		}
	}
}

// ending is how a task ended, as supervise saw it.
type ending struct {
	status unix.WaitStatus // the leader's, when exited
	exited bool            // the leader exited (and was reaped)
	reason string          // why the task was ended, if it was: time limit, cancel
	left   int             // processes the leader left running when it exited by itself
	stuck  int             // processes still there when the supervisor gave up killing
}

// timeLimit fires after sec seconds; never when sec is 0.
func timeLimit(sec int64) (<-chan time.Time, func()) {
	if sec <= 0 {
		return nil, func() {}
	}
	t := time.NewTimer(time.Duration(sec) * time.Second)
	return t.C, func() { t.Stop() }
}

// group is the task's processes: the leader's process group and whatever
// else is below the supervisor; and why they are being ended.
type group struct {
	pgid   int
	reason string
}

// end asks the task to stop, for reason.
func (g *group) end(reason string) {
	g.reason = reason
	g.signal(unix.SIGTERM)
}

// signal sends sig to the leader's process group, then to every process
// below the supervisor (which covers those that left the group or the
// session).
func (g *group) signal(sig unix.Signal) {
	_ = unix.Kill(-g.pgid, sig) // ESRCH: nothing left
	signalTree(sig)
}

// endStatus turns the task's end into the status reported.
func endStatus(e *ending) *wire.Status {
	st := &wire.Status{Reason: e.reason}
	switch {
	case !e.exited:
		if st.Reason != "" {
			st.Reason += "; "
		}
		st.Reason += fmt.Sprintf("its processes could not be killed within %s", killFor)
	case e.status.Signaled():
		st.Signal = signalName(e.status.Signal())
	default:
		code := e.status.ExitStatus()
		st.Exit = &code
	}
	return st
}

// signalName is "SIGKILL" for 9, "SIG34" where the system has no name.
func signalName(sig syscall.Signal) string {
	if name := unix.SignalName(sig); name != "" {
		return name
	}
	return "SIG" + strconv.Itoa(int(sig))
}

// describe says how the task ended, for the log's last line, in
// task-submit's words (wire.EndHow).
func describe(st *wire.Status) string {
	if how := wire.EndHow(st.Exit, st.Signal, st.Reason); how != "" {
		return how
	}
	return "status unknown"
}
