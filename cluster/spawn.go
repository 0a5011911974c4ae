package cluster

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	sys "golang.org/x/sys/unix"
)

// A Slurm command that only answers (sbatch, squeue, scontrol …) is
// started here with a bare fork and exec, its standard output read on
// this goroutine and its standard error kept in a memory file: every
// task-submit on a login node runs one, and os/exec's way (a pidfd probe
// of its own, a goroutine per captured stream and one for the deadline)
// cost 0.8 to 1.2 ms of CPU and a dozen context switches more per
// command on the 2-core machine of BenchmarkClusterLogin, against the
// 4.5 ms of sbatch itself.

// maxStderr bounds what is kept of a command's standard error: its end.
const maxStderr = 1 << 20

// errTimedOut: the command did not end within its time and was killed.
var errTimedOut = syscall.ETIMEDOUT

// errTooLong: the command's output passed maxStdout; it was killed.
var errTooLong = syscall.EFBIG

// Process is a Slurm command started by Start.
type Process struct {
	Pid    int
	mu     sync.Mutex
	reaped bool
}

// Start starts Slurm's command name with args in dir ("" for this
// one's), files its standard input, output and error.
func (s *Slurm) Start(dir, name string, files [3]uintptr, args ...string) (*Process, error) {
	p, err := start(s.Bin(name), append([]string{name}, args...), s.Env, dir, files)
	if err != nil {
		return nil, s.startError(name, err)
	}
	return p, nil
}

// startError is why Slurm's command name could not be started: where it
// is not there, what to install or set (not a controller down: trying
// again will not help).
func (s *Slurm) startError(name string, err error) *Error {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, syscall.ENOENT) {
		where := "in PATH"
		if s.Conf.Bin != "" {
			where = "in " + s.Conf.Bin + " ([cluster] slurm_bin)"
		}
		return &Error{Command: name, Msg: "not found " + where + ": install Slurm's client commands (Debian: slurm-client)"}
	}
	return &Error{Command: name, Msg: err.Error()}
}

// maxStdout bounds what is read of a command's standard output (squeue
// --json of Slurm's default MaxJobCount of 10,000 jobs is some 40 MiB).
var maxStdout = 256 << 20 // a variable: tests shorten it

func start(bin string, args, env []string, dir string, files [3]uintptr) (*Process, error) {
	path := bin
	if !strings.Contains(bin, "/") {
		var err error
		if path, err = exec.LookPath(bin); err != nil {
			return nil, err
		}
	}
	if env == nil {
		env = os.Environ()
	}
	pid, err := syscall.ForkExec(path, args, &syscall.ProcAttr{Dir: dir, Env: env, Files: files[:]})
	if err != nil {
		return nil, err
	}
	return &Process{Pid: pid}, nil
}

// Signal sends sig to the command while it is not reaped, never after:
// its pid may be another's then.
func (p *Process) Signal(sig syscall.Signal) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reaped {
		return false
	}
	sys.Kill(p.Pid, sig)
	return true
}

// Wait waits for the command's end and reaps it.
func (p *Process) Wait() (syscall.WaitStatus, error) {
	var info sys.Siginfo
	for {
		// Wait for its end without reaping it, then let no signal go.
		if err := sys.Waitid(sys.P_PID, p.Pid, &info, sys.WEXITED|sys.WNOWAIT, nil); err != sys.EINTR {
			break
		}
	}
	p.mu.Lock()
	p.reaped = true
	p.mu.Unlock()
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(p.Pid, &ws, 0, nil)
		if err != syscall.EINTR {
			return ws, err
		}
	}
}

// output runs bin with args (args[0] the command's name) in dir ("" for
// this one's) with env, and returns its standard output, its standard
// error and its wait status; an error where it could not be started
// (exec.ErrNotFound, an errno) or was killed after timeout (errTimedOut).
func output(bin string, args, env []string, dir string, timeout time.Duration) (stdout, stderr []byte, ws syscall.WaitStatus, err error) {
	null, err := sys.Open(os.DevNull, sys.O_RDONLY|sys.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, 0, err
	}
	defer sys.Close(null)
	errFile, err := sys.MemfdCreate("slurm-stderr", sys.MFD_CLOEXEC)
	if err != nil {
		return nil, nil, 0, err
	}
	defer sys.Close(errFile)
	var p [2]int
	if err := sys.Pipe2(p[:], sys.O_CLOEXEC); err != nil {
		return nil, nil, 0, err
	}
	proc, err := start(bin, args, env, dir, [3]uintptr{uintptr(null), uintptr(p[1]), uintptr(errFile)})
	sys.Close(p[1])
	if err != nil {
		sys.Close(p[0])
		return nil, nil, 0, err
	}
	var killed atomic.Bool
	timer := time.AfterFunc(timeout, func() {
		if proc.Signal(sys.SIGKILL) {
			killed.Store(true)
		}
	})
	buf := make([]byte, 32<<10)
	for {
		n, rerr := sys.Read(p[0], buf)
		if rerr == sys.EINTR {
			continue
		}
		if n <= 0 || rerr != nil {
			break
		}
		if len(stdout)+n > maxStdout {
			proc.Signal(sys.SIGKILL)
			sys.Close(p[0])
			proc.Wait()
			timer.Stop()
			return nil, nil, 0, errTooLong
		}
		stdout = append(stdout, buf[:n]...)
	}
	sys.Close(p[0])
	ws, _ = proc.Wait()
	timer.Stop()
	var st sys.Stat_t
	if sys.Fstat(errFile, &st) == nil && st.Size > 0 {
		from := max(st.Size-maxStderr, 0) // its last words say most
		stderr = make([]byte, st.Size-from)
		n, _ := sys.Pread(errFile, stderr, from)
		stderr = stderr[:max(n, 0)]
	}
	if killed.Load() {
		return stdout, stderr, ws, errTimedOut
	}
	return stdout, stderr, ws, nil
}
