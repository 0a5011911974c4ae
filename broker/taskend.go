package broker

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/broker/status"
)

// A task's lease ends with the task. Its processes are ended with it (its
// supervisor's tree, its control group or session), but its lock
// descriptors may have left them: passed over a Unix socket (SCM_RIGHTS)
// to a process outside the task, or taken with pidfd_getfd. Such a
// process would hold the task's devices, and a restricted account's
// access to them, for as long as it runs. So at a task's end the broker
// removes the restricted entries of the devices still held at once, finds
// who holds their lock files (a scan of /proc, the same look as status's)
// and signals them as the task's own processes are at its time limit:
// SIGTERM, then SIGKILL after kill_grace to those still holding. Each
// process is signalled through a pidfd, once its start time is checked.

// taskLease is what endTaskLeaseLocked found of an ended task's lease.
type taskLease struct {
	task    uint64
	l       *lease.Lease
	devices []int
	files   []procscan.FileID // the lease's lock files
}

// endTaskLeaseLocked ends the lease of task id, which has ended: the
// restricted entries of its devices go at once, and the holders of its
// lock files still there are signalled (outside the lock).
func (s *Server) endTaskLeaseLocked(id uint64) {
	tl := &taskLease{task: id}
	tl.l, tl.devices, tl.files = s.status.TaskLease(id)
	if len(tl.devices) == 0 {
		return
	}
	for _, dev := range tl.devices {
		if err := s.acc.Revoke(dev); err != nil {
			s.log.Printf("task %d has ended: %v; they go when the lease's last holder is gone", id, err)
		}
	}
	go s.endTaskHolders(tl, s.cfg.Tasks.KillGrace)
}

// endTaskHolders signals the processes that hold tl's lock files: SIGTERM,
// then, grace later, SIGKILL to those that still do.
func (s *Server) endTaskHolders(tl *taskLease, grace time.Duration) {
	if !s.signalTaskHolders(tl, unix.SIGTERM) {
		return
	}
	time.AfterFunc(grace, func() { s.signalTaskHolders(tl, unix.SIGKILL) })
}

// signalTaskHolders sends sig to whoever holds tl's lock files still, and
// tells whether it found anyone. A lock file whose release its watcher
// has seen (the common case: the task's processes are gone, and the
// watcher waits for the broker's lock to record it) costs no scan of
// /proc.
func (s *Server) signalTaskHolders(tl *taskLease, sig unix.Signal) bool {
	targets := procscan.Targets{Files: map[procscan.FileID]bool{}}
	devOf := map[procscan.FileID]int{}
	s.mu.Lock()
	for i, dev := range tl.devices {
		if s.status.Holds(tl.l, dev) && !s.table.Ended(dev, lease.FileID(tl.files[i])) {
			targets.Files[tl.files[i]] = true
			devOf[tl.files[i]] = dev
		}
	}
	s.mu.Unlock()
	if len(targets.Files) == 0 {
		return false
	}
	res, err := s.scanner.Scan(targets)
	if err != nil {
		s.log.Printf("task %d has ended: find who holds its lease: %v", tl.task, err)
		return false
	}
	found := false
	for fid, pids := range res.Files {
		for _, pid := range pids {
			pi := res.Info[pid]
			if pi == nil || pid <= 1 {
				continue
			}
			found = true
			err := s.scanner.Signal(pid, pi.Start, sig)
			what := fmt.Sprintf("task %d has ended: pid %d (%s: %s) still holds its lease of %s", tl.task, pid,
				s.status.Name(pi.UID), status.CommandLine(pi), s.inv.Vendor.Format([]int{devOf[fid]}))
			switch {
			case err == nil:
				s.log.Printf("%s: sent %s", what, unix.SignalName(sig))
			case !errors.Is(err, unix.ESRCH):
				s.log.Printf("%s: send %s: %v", what, unix.SignalName(sig), err)
			}
		}
	}
	return found
}
