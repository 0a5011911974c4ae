package shim

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/exitcode"
	"github.com/npurun/npurun/wire"
)

// runHeld runs argv as npurun's child, rather than becoming it, when the
// lease is held through Slurm job job, a placeholder allocation (allocate
// mode): Slurm may end that job (scancel, its time limit, preemption),
// and the broker then ends the command. npurun stays to say so: the
// broker tells it on the connection it kept open (wire.TypeEnded)
// before it signals the lease's holders, and why; npurun then says so and
// exits with exitcode.SlurmEnded. Otherwise npurun exits as its
// command did (killed by a signal: by the same signal).
//
// The lease's descriptors are the child's alone (npurun closes its own
// copies), so that the lease ends with the command's processes, as it
// does when npurun becomes the command. The signals npurun gets but the
// terminal's (SIGINT, SIGQUIT: the child has them from the terminal too)
// are passed on to the child.
func (w *waiter) runHeld(argv, env []string, placed []int, job uint32) int {
	c := w.held
	defer c.Close()
	path, code := lookPath(argv[0])
	if code != 0 {
		closeFDs(placed)
		return code
	}
	if w.signals != nil {
		signal.Stop(w.signals) // the wait's: no longer "cancelled while waiting"
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, unix.SIGINT, unix.SIGQUIT, unix.SIGTERM, unix.SIGHUP, unix.SIGUSR1, unix.SIGUSR2)
	defer signal.Stop(sigs)
	// The placed descriptors are not close-on-exec: the child inherits
	// them at the same numbers, as the command would across exec.
	pid, err := syscall.ForkExec(path, argv, &syscall.ProcAttr{Env: mergeEnv(os.Environ(), env), Files: []uintptr{0, 1, 2}})
	closeFDs(placed)
	if err != nil {
		warn("%s: %v", argv[0], err)
		if errors.Is(err, unix.ENOENT) {
			return exitcode.NotFound
		}
		return exitcode.NoExec
	}
	go func() {
		for s := range sigs {
			if s != unix.SIGINT && s != unix.SIGQUIT {
				unix.Kill(pid, s.(unix.Signal))
			}
		}
	}()
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		warn("watch %s (pid %d): %v; not told if Slurm ends job %d", argv[0], pid, err, job)
		return waitChild(pid, nil)
	}
	defer unix.Close(pidfd)
	var ended *wire.Reply
	listen := true // the connection is open, and may yet tell
	// hear reads what the broker says: an ended reply, or the connection
	// gone (a broker restart: nothing more is heard of this job).
	hear := func() {
		r, fds, err := c.Recv(0)
		closeFDs(fds)
		switch {
		case errors.Is(err, wire.ErrTimeout):
		case err != nil:
			listen = false
		case r.Type == wire.TypeEnded && r.SlurmJob == job:
			ended, listen = r, false
		}
	}
	for {
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		if listen {
			fds = append(fds, unix.PollFd{Fd: int32(c.FD()), Events: unix.POLLIN})
		}
		if _, err := unix.Poll(fds, -1); err != nil && !errors.Is(err, unix.EINTR) {
			warn("wait for %s: %v", argv[0], err)
			return waitChild(pid, nil)
		}
		if listen && fds[1].Revents != 0 {
			hear()
		}
		if fds[0].Revents != 0 {
			break
		}
	}
	// The broker tells before it signals: a word that came as the
	// command ended is there to read.
	if listen {
		hear()
	}
	return waitChild(pid, ended)
}

// waitChild reaps the child pid and returns npurun's exit status: after
// ended (Slurm ended the command's placeholder job), exitcode.SlurmEnded, with
// a word; else the child's status, a signal's re-raised on npurun.
func waitChild(pid int, ended *wire.Reply) int {
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EINTR) {
			warn("wait for pid %d: %v", pid, err)
			return exitcode.Failure
		}
	}
	if ended != nil {
		warn("%s", endedWord(ended))
		return exitcode.SlurmEnded
	}
	if ws.Signaled() {
		sig := ws.Signal()
		signal.Reset(sig)
		unix.Kill(unix.Getpid(), sig)
		return 128 + int(sig)
	}
	return ws.ExitStatus()
}

// endedWord is what npurun says when the broker ended its command (ended,
// wire.TypeEnded): the broker's reason, where it gave one (Slurm ended
// the job, or gave its devices to another job); a broker that gives none
// is told by Slurm's end of the job.
func endedWord(ended *wire.Reply) string {
	if ended.Message != "" {
		return fmt.Sprintf("slurm job %d: the command was ended: %s", ended.SlurmJob, ended.Message)
	}
	return fmt.Sprintf("slurm job %d was cancelled (scancel, its time limit or preemption): the command was ended", ended.SlurmJob)
}
