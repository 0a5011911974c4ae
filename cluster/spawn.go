package cluster

import (
	"os"
	"os/exec"
	"sync"
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

// output runs bin with args (args[0] the command's name) in dir ("" for
// this one's) with env, and returns its standard output, its standard
// error and its wait status; an error where it could not be started
// (exec.ErrNotFound, an errno) or was killed after timeout (errTimedOut).
func output(bin string, args, env []string, dir string, timeout time.Duration) (stdout, stderr []byte, ws syscall.WaitStatus, err error) {
	path := bin
	if !containsSlash(bin) {
		if path, err = exec.LookPath(bin); err != nil {
			return nil, nil, 0, err
		}
	}
	if env == nil {
		env = os.Environ()
	}
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
	pid, err := syscall.ForkExec(path, args, &syscall.ProcAttr{Dir: dir, Env: env, Files: []uintptr{uintptr(null), uintptr(p[1]), uintptr(errFile)}})
	sys.Close(p[1])
	if err != nil {
		sys.Close(p[0])
		return nil, nil, 0, err
	}

	// The deadline kills the command until it is reaped, never after:
	// its pid may be another's then.
	var mu sync.Mutex
	reaped, killed := false, false
	timer := time.AfterFunc(timeout, func() {
		mu.Lock()
		defer mu.Unlock()
		if !reaped {
			killed = true
			sys.Kill(pid, sys.SIGKILL)
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
		stdout = append(stdout, buf[:n]...)
	}
	sys.Close(p[0])
	var info sys.Siginfo
	for {
		// Wait for its end without reaping it, then stop the deadline.
		if werr := sys.Waitid(sys.P_PID, pid, &info, sys.WEXITED|sys.WNOWAIT, nil); werr != sys.EINTR {
			break
		}
	}
	mu.Lock()
	reaped = true
	timer.Stop()
	wasKilled := killed
	mu.Unlock()
	for {
		if _, werr := syscall.Wait4(pid, &ws, 0, nil); werr != syscall.EINTR {
			break
		}
	}
	var st sys.Stat_t
	if sys.Fstat(errFile, &st) == nil && st.Size > 0 {
		from := max(st.Size-maxStderr, 0) // its last words say most
		stderr = make([]byte, st.Size-from)
		n, _ := sys.Pread(errFile, stderr, from)
		stderr = stderr[:max(n, 0)]
	}
	if wasKilled {
		return stdout, stderr, ws, errTimedOut
	}
	return stdout, stderr, ws, nil
}

func containsSlash(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			return true
		}
	}
	return false
}
