package broker

import "github.com/npurun/npurun/broker/tasklife"

// What status and the metrics read of the task table, in one place: the
// task runner's own structure may change under these two functions
// without touching their callers.

// taskSupervisorLocked returns the pid and start time of task id's
// supervisor, zero while it has none.
func (s *Server) taskSupervisorLocked(id uint64) (int, uint64) {
	if s.life == nil {
		return 0, 0
	}
	if t := s.life.Get(id); t != nil {
		return t.PID, t.PIDStart
	}
	return 0, 0
}

// taskCountsLocked counts the tasks the broker knows by state, as clients
// see the states.
func (s *Server) taskCountsLocked() map[string]int {
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
