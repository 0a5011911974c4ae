package slurmjobs

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/internal/fileid"
)

// Once the extern step holds a job's lease, the broker holds none of its
// descriptors: a task's copies are taken from a process that holds them
// (pidfd_getfd, Linux 5.6 and CAP_SYS_PTRACE, which root has), the extern
// step first, then the tasks that took copies before, then whoever /proc
// shows holding the lease. A process is only taken from once its pidfd
// is open and its start time is the one recorded (the pid is its own),
// and a descriptor taken only once fstat shows it open on the lease's
// current lock file (device and inode): never a descriptor of a pid a
// message named.

// errPerm is pidfd_getfd refused: the broker lacks CAP_SYS_PTRACE, or a
// security module forbids it.
var errPerm = errors.New("pidfd_getfd not permitted")

// copies takes copies of job j's lease descriptors from its holders, in
// the order of its devices; nil where no holder is left (its lease is
// ending).
func (r *Room) copies(j *job) ([]int, error) {
	r.mu.Lock()
	l := j.l
	cands := append([]Proc{j.extern}, j.tasks...)
	r.mu.Unlock()
	if l == nil {
		return nil, nil
	}
	paths := make([]string, len(l.Devices))
	for i, id := range l.Devices {
		paths[i] = lease.LockPath(r.cfg.LockDir, id)
	}
	tried := map[Proc]bool{}
	try := func(cands []Proc) ([]int, error) {
		for _, p := range cands {
			if p.PID <= 0 || tried[p] {
				continue
			}
			tried[p] = true
			fds, err := r.takeFrom(p, l.Files, paths)
			if errors.Is(err, errPerm) {
				return nil, err
			}
			if fds != nil {
				return fds, nil
			}
		}
		return nil, nil
	}
	fds, err := try(cands)
	if fds == nil && err == nil {
		fds, err = try(r.owner.Holders(l))
	}
	if errors.Is(err, errPerm) {
		r.mu.Lock()
		said := r.permSaid
		r.permSaid = true
		r.mu.Unlock()
		if !said {
			r.log.Printf("job %d: take a copy of its lease from its extern step: %v (the broker needs CAP_SYS_PTRACE and Linux 5.6): its tasks run without copies of their own, and the job keeps its lease", j.id, err)
		}
		return nil, nil
	}
	return fds, err
}

// takeFrom takes, from process p, a descriptor of each lock file of
// files (at paths), in their order; nil if p is gone, is not the process
// recorded, or does not hold them all.
func (r *Room) takeFrom(p Proc, files []fileid.ID, paths []string) ([]int, error) {
	pidfd, err := unix.PidfdOpen(p.PID, 0)
	if err != nil {
		return nil, nil
	}
	defer unix.Close(pidfd)
	if p.Start == 0 || r.startOf(p.PID) != p.Start {
		return nil, nil // another process has the pid now
	}
	dir := r.cfg.ProcRoot + "/" + strconv.Itoa(p.PID) + "/fd"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil
	}
	out := make([]int, len(files))
	for i := range out {
		out[i] = -1
	}
	left := len(files)
	for _, e := range entries {
		if left == 0 {
			break
		}
		link, err := os.Readlink(dir + "/" + e.Name())
		if err != nil {
			continue
		}
		for i, path := range paths {
			if out[i] >= 0 || link != path {
				continue
			}
			target, err := strconv.Atoi(e.Name())
			if err != nil {
				break
			}
			fd, err := unix.PidfdGetfd(pidfd, target, 0)
			if errors.Is(err, unix.EPERM) {
				closeAll(out)
				return nil, fmt.Errorf("%w: %v", errPerm, err)
			}
			if err != nil {
				break
			}
			var st unix.Stat_t
			if unix.Fstat(fd, &st) != nil || (fileid.ID{Dev: st.Dev, Ino: st.Ino}) != files[i] {
				unix.Close(fd)
				break
			}
			out[i] = fd
			left--
			break
		}
	}
	if left > 0 {
		closeAll(out)
		return nil, nil
	}
	return out, nil
}

// startOf is process pid's start time, 0 if it is gone.
func (r *Room) startOf(pid int) uint64 {
	if pid <= 0 {
		return 0
	}
	data, err := os.ReadFile(r.cfg.ProcRoot + "/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The fields after the command's closing parenthesis: state is the
	// first (field 3), starttime field 22.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0
	}
	v, _ := strconv.ParseUint(f[19], 10, 64)
	return v
}
