package tasks

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/procscan"
)

// A task's lease ends with the task. Its processes are ended with it (its
// runner's: the supervisor's tree, its control group or session), but its
// lock descriptors may have left them: passed over a Unix socket
// (SCM_RIGHTS) to a process outside the task, or taken with pidfd_getfd.
// Such a process would hold the task's devices, and a restricted
// account's access to them, for as long as it runs. So at a task's end
// the runtime removes the restricted entries of the devices still held at
// once, finds who holds their lock files (a scan of /proc, the same look
// as status's) and signals them as the task's own processes are at its
// time limit: SIGTERM, then SIGKILL after kill_grace to those still
// holding. Each process is signalled through a pidfd, once its start time
// is checked.

// The same goes for any lease whose holder has ended while processes may
// hold it still (a Slurm job whose Epilog came, a placeholder allocation
// Slurm ended): EndLease, the one way a lease is ended so.

// endingLease is what endLease found of a lease to end: the devices held
// still, each with its lease and lock file.
type endingLease struct {
	why   string // what ended, for the log ("task 5 has ended")
	held  []lease.Holding
	files []procscan.FileID // the lock files, in the order of held
}

// endLeaseLocked ends the lease of task id, which has ended.
func (rt *Runtime) endLeaseLocked(id uint64) {
	rt.endLease(rt.table.OfTask(id), fmt.Sprintf("task %d has ended", id))
}

// EndLease ends lease l, whose holder has ended (why says how, for the
// log): the restricted entries of the devices it holds still go at once,
// and the holders of their lock files still there are signalled, in a
// goroutine of their own. It takes no lock of the runtime's.
func (rt *Runtime) EndLease(l *lease.Lease, why string) {
	rt.endLease(rt.table.HeldBy(l), why)
}

// endLease ends the holdings held (EndLease).
func (rt *Runtime) endLease(held []lease.Holding, why string) {
	if len(held) == 0 {
		return
	}
	tl := &endingLease{why: why, held: held}
	for _, h := range held {
		tl.files = append(tl.files, procscan.FileID(h.File))
		if rt.access == nil {
			continue
		}
		if err := rt.access.Revoke(h.Device, rt.table.Keep(h.Device, h.Lease)); err != nil {
			rt.log.Printf("%s: %v; they go when the lease's last holder is gone", why, err)
		}
	}
	if rt.holders != nil {
		go rt.endHolders(tl, rt.policy().Tasks.KillGrace)
	}
}

// endHolders signals the processes that hold tl's lock files: SIGTERM,
// then, grace later, SIGKILL to those that still do.
func (rt *Runtime) endHolders(tl *endingLease, grace time.Duration) {
	if !rt.signalHolders(tl, unix.SIGTERM) {
		return
	}
	time.AfterFunc(grace, func() { rt.signalHolders(tl, unix.SIGKILL) })
}

// signalHolders sends sig to whoever holds tl's lock files still, and
// tells whether it found anyone. A lock file whose release its watcher
// has seen (the common case: the task's processes are gone, and the
// watcher is about to record it) costs no scan of /proc.
func (rt *Runtime) signalHolders(tl *endingLease, sig unix.Signal) bool {
	targets := procscan.Targets{Files: map[procscan.FileID]bool{}}
	devOf := map[procscan.FileID]int{}
	for i, h := range tl.held {
		if rt.table.Holds(h.Lease, h.Device) {
			targets.Files[tl.files[i]] = true
			devOf[tl.files[i]] = h.Device
		}
	}
	if len(targets.Files) == 0 {
		return false
	}
	res, err := rt.holders.Scan(targets)
	if err != nil {
		rt.log.Printf("%s: find who holds its lease: %v", tl.why, err)
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
			err := rt.holders.Signal(pid, pi.Start, sig)
			what := fmt.Sprintf("%s: pid %d (%s) still holds its lease of %s", tl.why, pid,
				rt.describe(pi), rt.inv.Vendor.Format([]int{devOf[fid]}))
			switch {
			case err == nil:
				rt.log.Printf("%s: sent %s", what, unix.SignalName(sig))
			case !errors.Is(err, unix.ESRCH):
				rt.log.Printf("%s: send %s: %v", what, unix.SignalName(sig), err)
			}
		}
	}
	return found
}
