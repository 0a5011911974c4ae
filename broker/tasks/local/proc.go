package local

import (
	"errors"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/internal/testhook"
	"github.com/npurun/npurun/wire"
)

// Every signal the broker sends to a task's processes goes through
// signalChecked: a pid is only a number, reused once its process is gone,
// so the process is pinned with a pidfd before its start time is read, and
// signalled only if that is the start time expected. After a reboot start
// times begin again, so a task's pid from an earlier boot (its boot id
// differs) is never signalled at all.

// procStart is a process's start time in clock ticks since boot, which
// tells a pid from its reuse; 0 if unknown.
func procStart(fs procfs.FS, pid int) uint64 { return procscan.StartTime(fs, pid) }

// errNotThatProcess means a pid names another process than the one meant,
// or none.
var errNotThatProcess = errors.New("not the process it was")

// signalChecked sends sig to pid if it still is the process that started
// at start.
func signalChecked(fs procfs.FS, pid int, start uint64, sig unix.Signal) error {
	if pid <= 0 || start == 0 {
		return errNotThatProcess
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if procStart(fs, pid) != start {
		return errNotThatProcess
	}
	return unix.PidfdSendSignal(fd, sig, nil, 0)
}

// cmdLine is pid's command line.
func cmdLine(fs procfs.FS, pid int) ([]string, error) {
	p, err := fs.Proc(pid)
	if err != nil {
		return nil, err
	}
	return p.CmdLine()
}

// supervisorArgs tells whether a command line is task id's supervisor's:
// `npurun-supervise ID`, `npurun-supervise` (an idle one, given the task
// later: its pid and start time, recorded with the task's start, tell it
// from the others), or `npubroker supervise ID`, as brokers before started
// them.
func supervisorArgs(args []string, id uint64) bool {
	sid := strconv.FormatUint(id, 10)
	switch {
	case len(args) == 1 || len(args) == 2:
		return args[0] == wire.SupervisorName && (len(args) == 1 || args[1] == sid)
	case len(args) == 3:
		return args[1] == "supervise" && args[2] == sid
	}
	return false
}

// adoptable tells whether pid, started at start, is still task id's
// supervisor, for a broker that takes the task up. A look at /proc that
// fails for a reason that passes (out of descriptors or memory) is made
// again a few times; where it still fails, the process is taken for there
// (waitExit watches it until it is seen gone): a live supervisor taken for
// gone would leave its task lost, and killed.
func adoptable(fs procfs.FS, pid int, start, id uint64) bool {
	if pid <= 0 || start == 0 {
		return false
	}
	for try := 0; ; try++ {
		st, err := procStartErr(fs, pid)
		if testhook.Fails(hookAdoptUnreadable) {
			st, err = 0, unix.EMFILE
		}
		var args []string
		if err == nil {
			if st != start {
				return false
			}
			if args, err = cmdLine(fs, pid); err == nil {
				return supervisorArgs(args, id)
			}
		}
		if procGone(err) {
			return false
		}
		if try == 4 {
			return true
		}
		time.Sleep(time.Duration(10<<try) * time.Millisecond)
	}
}

// killSession sends SIGKILL to what is left of a task whose supervisor,
// pid sid started at leaderStart, is gone or to be killed: the processes of
// uid in session sid that started no earlier than the supervisor. The
// session's number is its leader's pid, which the kernel does not give
// out again while any process is in the session; so if sid is another
// process now, the session is another's, and nothing is killed. The caller
// has checked that the supervisor ran in this boot.
func killSession(fs procfs.FS, sid int, leaderStart uint64, uid uint32) int {
	if sid <= 1 || leaderStart == 0 {
		return 0
	}
	if st := procStart(fs, sid); st != 0 && st != leaderStart {
		return 0
	}
	procs, err := fs.AllProcs()
	if err != nil {
		return 0
	}
	n := 0
	for _, p := range procs {
		st, err := p.Stat()
		if err != nil || st.Session != sid || st.Starttime < leaderStart {
			continue
		}
		if status, err := p.NewStatus(); err == nil && status.UIDs[1] == uint64(uid) {
			if signalChecked(fs, p.PID, st.Starttime, unix.SIGKILL) == nil {
				n++
			}
		}
	}
	return n
}

// waitExit returns once pid, the process that started at start, has
// exited (or pid is another process now). Only its exit, seen, ends the
// wait: a failure to watch it for a reason that passes (out of
// descriptors or memory) is tried again with a growing wait, since a live
// supervisor taken for gone would leave its task lost, and killed.
func waitExit(fs procfs.FS, pid int, start uint64) {
	wait := 10 * time.Millisecond
	again := func() {
		time.Sleep(wait)
		wait = min(2*wait, time.Second)
	}
	for {
		fd, err := unix.PidfdOpen(pid, 0)
		if err == nil && testhook.Fails(hookNoPidfd) {
			unix.Close(fd)
			fd, err = -1, unix.EMFILE
		}
		if err != nil {
			if !passingErrno(err) {
				return // gone already
			}
			again()
			continue
		}
		st, err := procStartErr(fs, pid)
		switch {
		case err != nil && !procGone(err):
			unix.Close(fd)
			again()
			continue
		case st != start:
			unix.Close(fd)
			return // gone, or another process
		}
		for {
			_, err = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, -1)
			if err != unix.EINTR {
				break
			}
		}
		unix.Close(fd)
		if err == nil {
			return
		}
		again()
	}
}

// passingErrno tells whether err is a shortage that passes: descriptors,
// memory.
func passingErrno(err error) bool {
	for _, e := range []error{unix.EMFILE, unix.ENFILE, unix.ENOMEM, unix.EAGAIN, unix.ENOBUFS, unix.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// procStartErr is pid's start time, or why it cannot be read (procGone:
// there is no process pid).
func procStartErr(fs procfs.FS, pid int) (uint64, error) {
	p, err := fs.Proc(pid)
	if err != nil {
		return 0, err
	}
	st, err := p.Stat()
	if err != nil {
		return 0, err
	}
	return st.Starttime, nil
}

// procGone tells whether an error reading /proc/PID says that there is no
// process PID.
func procGone(err error) bool { return errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) }

func closeFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}
