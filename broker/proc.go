package broker

import (
	"strconv"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// procStart is a process's start time in clock ticks since boot, which
// tells a pid from its reuse; 0 if unknown.
func procStart(fs procfs.FS, pid int) uint64 {
	p, err := fs.Proc(pid)
	if err != nil {
		return 0
	}
	st, err := p.Stat()
	if err != nil {
		return 0
	}
	return st.Starttime
}

// alive tells whether pid still is the process that started at start.
func alive(fs procfs.FS, pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	return start != 0 && procStart(fs, pid) == start
}

// isSupervisor tells whether pid is `npubroker supervise ID`.
func isSupervisor(fs procfs.FS, pid int, id uint64) bool {
	p, err := fs.Proc(pid)
	if err != nil {
		return false
	}
	args, err := p.CmdLine()
	return err == nil && len(args) == 3 && args[1] == "supervise" && args[2] == strconv.FormatUint(id, 10)
}

// killSession sends SIGKILL to every process of uid in session sid: what
// is left of a task whose supervisor (the session's leader) is gone.
func killSession(fs procfs.FS, sid int, uid uint32) int {
	procs, err := fs.AllProcs()
	if err != nil || sid <= 1 {
		return 0
	}
	n := 0
	for _, p := range procs {
		st, err := p.Stat()
		if err != nil || st.Session != sid {
			continue
		}
		if status, err := p.NewStatus(); err == nil && status.UIDs[1] == uint64(uid) {
			if unix.Kill(p.PID, unix.SIGKILL) == nil {
				n++
			}
		}
	}
	return n
}

// waitExit blocks until process pid, not a child of ours, has exited.
func waitExit(pid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // already gone
	}
	defer unix.Close(fd)
	for {
		_, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, -1)
		if err != unix.EINTR {
			return
		}
	}
}

func closeFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}
