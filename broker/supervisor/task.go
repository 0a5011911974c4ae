package supervisor

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/client"
)

// leaseVar names the lease's descriptors for the command, as shim.LeaseVar.
const leaseVar = "NPURUN_LEASE"

// reasonCancelled is the Status reason of a task the broker cancelled.
const reasonCancelled = "cancelled"

// The idle I/O class of ioprio_set(2), which x/sys/unix does not name.
const (
	ioprioWhoProcess = 1
	ioprioClassIdle  = 3
	ioprioClassShift = 13
)

// errNotFound means the command is not in the task's PATH.
var errNotFound = errors.New("not found in the task's PATH")

// prepared is what can be done before the go-ahead, so that a grant
// starts the command without delay: the log open, the program found.
type prepared struct {
	log     *os.File
	path    string
	logErr  error
	pathErr error
}

func prepare(spec *client.Spec) *prepared {
	p := &prepared{}
	p.log, p.logErr = openLog(spec.Log)
	p.path, p.pathErr = resolve(spec.Argv, spec.Env, spec.Cwd)
	return p
}

// runTask runs the command of spec to its end and says how it ended. The
// lease's descriptors are closed by the time it returns.
func runTask(spec *client.Spec, p *prepared, leases []*os.File, cancel <-chan os.Signal) *client.Status {
	defer closeFiles(leases)
	if p.logErr != nil {
		return &client.Status{Reason: p.logErr.Error()}
	}
	log := p.log
	defer log.Close()
	if cancelled(cancel) {
		logf(log, "npurun: task %d cancelled before it started\n", spec.ID)
		return &client.Status{Reason: reasonCancelled}
	}
	cmd, err := startCommand(spec, p, leases)
	closeFiles(leases)
	if err != nil {
		logf(log, "npurun: task %d did not start: %v\n", spec.ID, err)
		return startFailure(err)
	}
	st := endStatus(supervise(cmd, spec, cancel))
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
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
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
// its own, with the lease at descriptors 3, 4, …
func startCommand(spec *client.Spec, p *prepared, leases []*os.File) (*exec.Cmd, error) {
	if p.pathErr != nil {
		return nil, fmt.Errorf("start: %w", p.pathErr)
	}
	log := p.log
	cmd := &exec.Cmd{
		Path:        p.path,
		Args:        spec.Argv,
		Dir:         spec.Cwd,
		Env:         taskEnv(spec.Env, spec.Devices),
		Stdout:      log,
		Stderr:      log,
		ExtraFiles:  leases,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	logf(log, "npurun: task %d started %s at %s\n", spec.ID, placement(spec.Devices), time.Now().Format(time.RFC3339))
	if err := start(cmd, spec.Idle); err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	return cmd, nil
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

// taskEnv is the task's environment with NPURUN_LEASE naming the
// descriptors the command gets; a stale NPURUN_LEASE is dropped.
func taskEnv(env []string, devices []int) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, leaseVar+"=") {
			out = append(out, kv)
		}
	}
	if len(devices) > 0 {
		out = append(out, leaseVar+"="+leaseValue(devices))
	}
	return out
}

// firstLease is the command's descriptor of the first lock file: ExtraFiles
// puts them at 3, 4, ….
const firstLease = 3

// leaseValue is "dev:fd,…" for the command's descriptors 3, 4, …
func leaseValue(devices []int) string {
	parts := make([]string, len(devices))
	for i, dev := range devices {
		parts[i] = strconv.Itoa(dev) + ":" + strconv.Itoa(firstLease+i)
	}
	return strings.Join(parts, ",")
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

// start starts cmd, at idle priority when asked. Linux keeps the nice value
// and the I/O priority per thread and a child inherits them from the thread
// that forks it, so lowering and forking happen on one locked thread.
func start(cmd *exec.Cmd, idle bool) error {
	if idle {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := lowerPriority(); err != nil {
			return err
		}
	}
	return cmd.Start()
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
func startFailure(err error) *client.Status {
	code := 126
	if errors.Is(err, errNotFound) || errors.Is(err, fs.ErrNotExist) {
		code = 127
	}
	return &client.Status{Exit: &code, Reason: err.Error()}
}

// supervise waits for the command. On the time limit or on cancel it sends
// SIGTERM to the command's process group, SIGKILL after the grace period,
// and SIGKILL again to whatever of the group outlives the leader. It
// returns the leader's end and the reason it was ended, if it was.
func supervise(cmd *exec.Cmd, spec *client.Spec, cancel <-chan os.Signal) (*os.ProcessState, string) {
	exited := make(chan struct{})
	go func() {
		cmd.Wait() // the status is in cmd.ProcessState
		close(exited)
	}()
	limit, stopLimit := timeLimit(spec.TimeSec)
	defer stopLimit()
	g := group{pgid: cmd.Process.Pid, grace: time.Duration(spec.GraceSec) * time.Second}
	var kill <-chan time.Time
	for {
		select {
		case <-exited:
			g.finish()
			return cmd.ProcessState, g.reason
		case <-limit:
			limit, cancel = nil, nil
			kill = g.end(fmt.Sprintf("time limit %s reached", time.Duration(spec.TimeSec)*time.Second))
		case <-cancel:
			limit, cancel = nil, nil
			kill = g.end(reasonCancelled)
		case <-kill:
			kill = nil
			g.signal(unix.SIGKILL)
		}
	}
}

// timeLimit fires after sec seconds; never when sec is 0.
func timeLimit(sec int64) (<-chan time.Time, func()) {
	if sec <= 0 {
		return nil, func() {}
	}
	t := time.NewTimer(time.Duration(sec) * time.Second)
	return t.C, func() { t.Stop() }
}

// group is the command's process group, and why it is being ended.
type group struct {
	pgid   int
	grace  time.Duration
	reason string
}

// end asks the group to stop and returns when to kill it.
func (g *group) end(reason string) <-chan time.Time {
	g.reason = reason
	g.signal(unix.SIGTERM)
	return time.After(g.grace)
}

// finish kills what is left of a group that was being ended once its
// leader has gone: the whole tree must die.
func (g *group) finish() {
	if g.reason != "" {
		g.signal(unix.SIGKILL)
	}
}

func (g *group) signal(sig unix.Signal) {
	_ = unix.Kill(-g.pgid, sig) // ESRCH: nothing left
}

// endStatus turns the leader's end into the status reported.
func endStatus(ps *os.ProcessState, reason string) *client.Status {
	st := &client.Status{Reason: reason}
	ws, ok := ps.Sys().(syscall.WaitStatus)
	switch {
	case ok && ws.Signaled():
		st.Signal = signalName(ws.Signal())
	default:
		code := ps.ExitCode()
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

// describe says how the task ended, for the log's last line.
func describe(st *client.Status) string {
	how := "killed by " + st.Signal
	if st.Exit != nil {
		how = "exit " + strconv.Itoa(*st.Exit)
	}
	if st.Reason != "" {
		how += " (" + st.Reason + ")"
	}
	return how
}
