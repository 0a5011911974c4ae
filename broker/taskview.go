package broker

import "github.com/npurun/npurun/broker/lease"

// What status and the metrics read of the task room, in one place, each a
// copy taken under the room's own lock (package tasks): the room may
// change under these functions without touching their callers.

// taskSupervisorLocked returns the pid and start time of task id's
// supervisor, zero while it has none.
func (s *Server) taskSupervisorLocked(id uint64) (int, uint64) {
	return s.rt.Supervisor(id)
}

// taskCountsLocked counts the tasks the broker knows by state, as clients
// see the states.
func (s *Server) taskCountsLocked() map[string]int {
	return s.rt.Counts()
}

// cpuLineLocked is the line of the tasks waiting for a CPU slot: the
// first max of them, and how many wait.
func (s *Server) cpuLineLocked(max int) ([]*lease.Waiter, int) {
	return s.rt.CPULine(max)
}
