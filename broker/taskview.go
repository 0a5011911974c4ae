package broker

import (
	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/status"
)

// taskView is the task room as the status room reads it (status.Tasks):
// the one seam between the two. Each call is a copy taken under the task
// room's own lock (package tasks), none of the broker's; it reads s.tasks at
// the call, so the status room may be opened before the task room is.
type taskView Server

var _ status.Tasks = (*taskView)(nil)

// Supervisor returns the pid and start time of task id's supervisor,
// zero while it has none.
func (v *taskView) Supervisor(id uint64) (int, uint64) {
	if v.tasks == nil {
		return 0, 0
	}
	return v.tasks.Supervisor(id)
}

// Counts counts the tasks the broker knows by state, as clients see the
// states.
func (v *taskView) Counts() map[string]int {
	if v.tasks == nil {
		return map[string]int{}
	}
	return v.tasks.Counts()
}

// CPULine returns the first max tasks waiting for a CPU slot, in service
// order, and how many wait.
func (v *taskView) CPULine(max int) ([]*lease.Waiter, int) {
	if v.tasks == nil {
		return nil, 0
	}
	return v.tasks.CPULine(max)
}
