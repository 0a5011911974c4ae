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

// taskLease is what endLeaseLocked found of an ended task's lease: the
// devices held still, each with its lease and lock file.
type taskLease struct {
	task  uint64
	held  []lease.Holding
	files []procscan.FileID // the lock files, in the order of held
}

// endLeaseLocked ends the lease of task id, which has ended: the
// restricted entries of its devices go at once, and the holders of its
// lock files still there are signalled (outside the lock).
func (rt *Runtime) endLeaseLocked(id uint64) {
	held := rt.table.OfTask(id)
	if len(held) == 0 {
		return
	}
	tl := &taskLease{task: id, held: held}
	for _, h := range held {
		tl.files = append(tl.files, procscan.FileID(h.File))
		if rt.access == nil {
			continue
		}
		if err := rt.access.Revoke(h.Device); err != nil {
			rt.log.Printf("task %d has ended: %v; they go when the lease's last holder is gone", id, err)
		}
	}
	if rt.holders != nil {
		go rt.endHolders(tl, rt.cfg.Tasks.KillGrace)
	}
}

// endHolders signals the processes that hold tl's lock files: SIGTERM,
// then, grace later, SIGKILL to those that still do.
func (rt *Runtime) endHolders(tl *taskLease, grace time.Duration) {
	if !rt.signalHolders(tl, unix.SIGTERM) {
		return
	}
	time.AfterFunc(grace, func() { rt.signalHolders(tl, unix.SIGKILL) })
}

// signalHolders sends sig to whoever holds tl's lock files still, and
// tells whether it found anyone. A lock file whose release its watcher
// has seen (the common case: the task's processes are gone, and the
// watcher is about to record it) costs no scan of /proc.
func (rt *Runtime) signalHolders(tl *taskLease, sig unix.Signal) bool {
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
		rt.log.Printf("task %d has ended: find who holds its lease: %v", tl.task, err)
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
			what := fmt.Sprintf("task %d has ended: pid %d (%s) still holds its lease of %s", tl.task, pid,
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
