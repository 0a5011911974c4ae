package broker

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/wire"
)

// idleOwner is the broker as the [idle] policy's hands (status.IdleOwner):
// the status room judges, after each utilization sample, holding no lock
// when it calls here.
type idleOwner Server

// Warn tells lease l's holders msg where they will see it: on each
// terminal of theirs (as write(1) does), and, for a task's lease, through
// the task's notify command, run with NPURUN_TASK_STATE=idle by a
// notify-only supervisor (tasks.Room.Notice); the log has said it. (The
// reclaim that may follow reaches the notify command as the task's end.)
func (o *idleOwner) Warn(l *lease.Lease, msg string) {
	s := (*Server)(o)
	s.tellTerminals(l, msg)
	if l.Kind == lease.Task && l.Task != 0 {
		s.tasks.Notice(l.Task, wire.NoticeIdle)
	}
}

// Reclaim ends lease l, idle past [idle] after, through the one path by
// which the broker ends a lease whose time is up (leaseend.Ender.End, as
// a task's time limit and a Slurm job's end do): its restricted entries
// at once, its processes SIGTERM, then SIGKILL after [tasks] kill_grace.
// Its holders are told msg on their terminals first. A login's lease is
// let go of (leaseend.Ender.Detach): the device is taken from the
// login, not the login from its user.
func (o *idleOwner) Reclaim(l *lease.Lease, why, msg string) {
	s := (*Server)(o)
	s.tellTerminals(l, msg)
	held := s.table.HeldBy(l)
	if l.Kind == lease.Login {
		s.ender.Detach(held, why)
		return
	}
	s.ender.End(held, why)
}

// maxTell bounds what is written to one terminal, and maxTTYs the
// terminals one message goes to.
const (
	maxTell = 1024
	maxTTYs = 16
)

// tellTerminals writes msg on the controlling terminals of lease l's
// holders, as write(1) does: only a terminal (/dev/pts/N, /dev/ttyN) the
// lease's user owns, opened without following a link and without
// becoming the broker's controlling terminal, written once, never waiting
// (a terminal that would block gets nothing).
func (s *Server) tellTerminals(l *lease.Lease, msg string) {
	if len(msg) > maxTell-4 {
		msg = msg[:maxTell-4]
	}
	line := []byte("\r\n" + msg + "\r\n")
	seen := map[uint64]bool{}
	for _, p := range s.holdersOf(l) {
		if len(seen) >= maxTTYs {
			break
		}
		dev, ok := controllingTTY(p.PID)
		if !ok || seen[dev] {
			continue
		}
		seen[dev] = true
		if err := writeTTY(dev, l.UID, line); err != nil {
			s.log.Printf("lease %d of %s: tell its terminal: %v", l.ID, l.User, err)
		}
	}
}

// controllingTTY is the controlling terminal of process pid (tty_nr of
// /proc/PID/stat), as a device number; false for none.
func controllingTTY(pid int) (uint64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name may hold anything: the fields follow its last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	// state ppid pgrp session tty_nr
	if len(f) < 5 {
		return 0, false
	}
	nr, err := strconv.ParseInt(f[4], 10, 64)
	if err != nil || nr <= 0 {
		return 0, false
	}
	major := uint32(nr>>8) & 0xfff
	minor := uint32(nr&0xff) | uint32(nr>>12)&0xfff00
	return unix.Mkdev(major, minor), true
}

// ttyPath is the node of terminal dev: /dev/pts/N (majors 136-143) or
// /dev/ttyN (major 4, the virtual consoles); "" for another.
func ttyPath(dev uint64) string {
	major, minor := unix.Major(dev), unix.Minor(dev)
	switch {
	case major >= 136 && major <= 143:
		return "/dev/pts/" + strconv.Itoa(int((major-136)*256+minor))
	case major == 4 && minor >= 1 && minor < 64:
		return "/dev/tty" + strconv.Itoa(int(minor))
	}
	return ""
}

// writeTTY writes b on terminal dev, owned by uid.
func writeTTY(dev uint64, uid uint32, b []byte) error {
	path := ttyPath(dev)
	if path == "" {
		return nil // not a terminal a user logs in on
	}
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NOCTTY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != dev || st.Uid != uid {
		return nil // not the holder's terminal (any more): nothing written
	}
	if _, err := unix.Write(fd, b); err != nil && err != unix.EAGAIN {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
