package tasks

import (
	"fmt"

	"github.com/npurun/npurun/broker/lease"
)

// A task's lease ends with the task. Its processes are ended with it (its
// runner's: the supervisor's tree, its control group or session), but its
// lock descriptors may have left them: passed over a Unix socket
// (SCM_RIGHTS) to a process outside the task, or taken with pidfd_getfd,
// or left in the socket's queue, received by nobody. Such a process would
// hold the task's devices, and a restricted account's access to them, for
// as long as it runs, and such a queue for as long as it lives. So at a
// task's end the lease is ended by the broker's ender (package leaseend):
// the restricted entries of the devices still held go at once, the
// processes that hold their lock files are signalled as the task's own
// are at its time limit (SIGTERM, then SIGKILL after kill_grace), and a
// lock that no process holds any more is let go of.

// endLeaseLocked ends the lease of task id, which has ended.
func (room *Room) endLeaseLocked(id uint64) {
	room.endLease(room.table.OfTask(id), fmt.Sprintf("task %d has ended", id))
}

// endLease ends the holdings held, whose task has ended.
func (room *Room) endLease(held []lease.Holding, why string) {
	if room.ender != nil {
		room.ender.End(held, why)
	}
}
