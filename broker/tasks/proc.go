package tasks

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/broker/procscan"
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

// alive tells whether pid still is the process that started at start.
func alive(fs procfs.FS, pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	return start != 0 && procStart(fs, pid) == start
}

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

// isSupervisor tells whether pid is task id's supervisor, by its command
// line: `npurun-supervise ID`, `npurun-supervise` (an idle one, given the
// task later: its pid and start time, recorded with the task's start, tell
// it from the others), or `npubroker supervise ID`, as brokers before
// npurun-supervise started them (a restart after an upgrade adopts those).
func isSupervisor(fs procfs.FS, pid int, id uint64) bool {
	p, err := fs.Proc(pid)
	if err != nil {
		return false
	}
	args, err := p.CmdLine()
	if err != nil {
		return false
	}
	sid := strconv.FormatUint(id, 10)
	switch {
	case len(args) == 1 || len(args) == 2:
		return args[0] == client.SupervisorName && (len(args) == 1 || args[1] == sid)
	case len(args) == 3:
		return args[1] == "supervise" && args[2] == sid
	}
	return false
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

// waitExit blocks until process pid, started at start and not a child of
// ours, has exited.
func waitExit(fs procfs.FS, pid int, start uint64) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // already gone
	}
	defer unix.Close(fd)
	if procStart(fs, pid) != start {
		return
	}
	for {
		_, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, -1)
		if err != unix.EINTR {
			return
		}
	}
}

// bootID names this boot of the machine; "" if unknown.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// monoNow is the monotonic clock: time since boot, not counting suspend,
// which no change of the wall clock moves.
func monoNow() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

func closeFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}
