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

// The same goes for any lease whose holder has ended while processes may
// hold it still: a Slurm job whose Epilog came (broker/slurmjobs), a
// placeholder allocation Slurm ended, a lease on devices Slurm gave
// another job. endLeaseLocked is the one way a lease is ended so.

// endingLease is what endLeaseLocked found of a lease to end.
type endingLease struct {
	why     string // what ended, for the log ("task 5 has ended")
	l       *lease.Lease
	devices []int
	files   []procscan.FileID // the lease's lock files
}

// endTaskLeaseLocked ends the lease of task id, which has ended.
func (s *Server) endTaskLeaseLocked(id uint64) {
	if l, _, _ := s.status.TaskLease(id); l != nil {
		s.endLeaseLocked(l, fmt.Sprintf("task %d has ended", id))
	}
}

// endLeaseLocked ends lease l, whose holder has ended (why says how): the
// restricted entries of its devices still held go at once, and the
// holders of their lock files still there are signalled (outside the
// lock).
func (s *Server) endLeaseLocked(l *lease.Lease, why string) {
	tl := &endingLease{why: why, l: l}
	tl.devices, tl.files = s.status.Held(l)
	if len(tl.devices) == 0 {
		return
	}
	for _, dev := range tl.devices {
		if err := s.acc.Revoke(dev); err != nil {
			s.log.Printf("%s: %v; they go when the lease's last holder is gone", why, err)
		}
	}
	go s.endHolders(tl, s.cfg.Tasks.KillGrace)
}

// endHolders signals the processes that hold tl's lock files: SIGTERM,
// then, grace later, SIGKILL to those that still do.
func (s *Server) endHolders(tl *endingLease, grace time.Duration) {
	if !s.signalHolders(tl, unix.SIGTERM) {
		return
	}
	time.AfterFunc(grace, func() { s.signalHolders(tl, unix.SIGKILL) })
}

// signalHolders sends sig to whoever holds tl's lock files still, and
// tells whether it found anyone. A lock file whose release its watcher
// has seen (the common case: the task's processes are gone, and the
// watcher waits for the broker's lock to record it) costs no scan of
// /proc.
func (s *Server) signalHolders(tl *endingLease, sig unix.Signal) bool {
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
		s.log.Printf("%s: find who holds its lease: %v", tl.why, err)
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
			what := fmt.Sprintf("%s: pid %d (%s: %s) still holds its lease of %s", tl.why, pid,
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
