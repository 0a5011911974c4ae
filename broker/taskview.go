package broker

// What status and the metrics read of the task table, in one place: the
// task runner's own structure may change under these two functions
// without touching their callers.

// taskSupervisorLocked returns the pid and start time of task id's
// supervisor, zero while it has none.
func (s *Server) taskSupervisorLocked(id uint64) (int, uint64) {
	if t := s.tasks[id]; t != nil {
		return t.PID, t.PIDStart
	}
	return 0, 0
}

// taskCountsLocked counts the tasks the broker knows by state.
func (s *Server) taskCountsLocked() map[string]int {
	n := map[string]int{}
	for _, t := range s.tasks {
		if t.durable {
			n[t.State]++
		}
	}
	return n
}
