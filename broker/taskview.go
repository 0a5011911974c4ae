package broker

import (
	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/status"
	"github.com/npurun/npurun/broker/tasklife"
)

// taskView is the broker's task fields as the status room reads them
// (status.Tasks), each call under Server.mu: the one seam between the
// status room and the tasks. The task runner's own structure may change
// under these three methods without touching the status room.
type taskView Server

var _ status.Tasks = (*taskView)(nil)

// Supervisor returns the pid and start time of task id's supervisor,
// zero while it has none.
func (v *taskView) Supervisor(id uint64) (int, uint64) {
	s := (*Server)(v)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.life == nil {
		return 0, 0
	}
	if t := s.life.Get(id); t != nil {
		return t.PID, t.PIDStart
	}
	return 0, 0
}

// Counts counts the tasks the broker knows by state, as clients see the
// states.
func (v *taskView) Counts() map[string]int {
	s := (*Server)(v)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := map[string]int{}
	if s.life == nil {
		return n
	}
	s.life.Each(func(t *tasklife.Task) bool {
		n[t.Shown()]++
		return true
	})
	return n
}

// CPULine returns the first max tasks waiting for a CPU slot, in service
// order, and how many wait.
func (v *taskView) CPULine(max int) ([]*lease.Waiter, int) {
	s := (*Server)(v)
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := s.cpuq.Waiters()
	return append([]*lease.Waiter(nil), ws[:min(max, len(ws))]...), len(ws)
}
