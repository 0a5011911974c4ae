package broker

import (
	"fmt"
	"slices"
	"time"

	"github.com/npurun/npurun/broker/client"
)

// loadTasks replays the spool: pending tasks queue again in submission
// order, running tasks whose supervisor lives on are followed to their end,
// and the journal is rewritten compactly.
func (s *Server) loadTasks(dir string) error {
	s.loading = true
	defer func() { s.loading = false }()
	spool, err := OpenSpool(dir, s.applyRecord, s.snapshot)
	if err != nil {
		return err
	}
	s.spool = spool
	slices.Sort(s.order)
	s.mu.Lock()
	// Running tasks first: they hold their CPU slots and count against
	// their users' caps before anything waiting is scheduled.
	var lost []*record
	for _, id := range s.order {
		if t := s.tasks[id]; t.State == client.StateRunning {
			if rec := s.adoptLocked(t); rec != nil {
				lost = append(lost, rec)
			}
		}
	}
	for _, id := range s.order {
		t := s.tasks[id]
		switch t.State {
		case client.StatePending:
			s.enqueueLocked(t)
		case client.StateBlocked:
			s.queuedTasks[t.UID]++
			s.enqueueLocked(t)
		case client.StateRunning:
		default:
			s.endedCount++
		}
	}
	s.trimLocked()
	s.loading = false
	s.warmLocked()
	s.mu.Unlock()
	if len(lost) > 0 {
		return s.spool.Append(lost...)
	}
	return nil
}

// adoptLocked takes up a task that was running when the broker stopped:
// its supervisor, if still there, reports to this broker. If it is gone the
// task is lost, and the record saying so is returned.
func (s *Server) adoptLocked(t *task) *record {
	if alive(s.proc, t.PID, t.PIDStart) && isSupervisor(s.proc, t.PID, t.ID) {
		s.running[t.UID]++
		if t.Slot >= 0 && t.Slot < len(s.cpuFree) {
			s.cpuFree[t.Slot] = false
		}
		s.log.Printf("task %d is still running (supervisor pid %d)", t.ID, t.PID)
		pid := t.PID
		go func() {
			waitExit(pid)
			s.supervisorGone(t, pid)
		}()
		s.enforceLimit(t, pid)
		return nil
	}
	killSession(s.proc, t.PID, t.UID) // what the supervisor left, if anything
	t.State, t.Ended = client.StateLost, time.Now().UnixMilli()
	t.Reason = "its supervisor was gone when the broker restarted; exit status unknown"
	return &record{Op: "end", ID: t.ID, Time: t.Ended, State: t.State, Reason: t.Reason}
}

// applyRecord applies one journal record to the task table.
func (s *Server) applyRecord(r *record) error {
	if r.Op == "task" {
		if r.Task == nil || r.Task.ID == 0 {
			return fmt.Errorf("task record without a task")
		}
		if _, seen := s.tasks[r.Task.ID]; !seen {
			s.order = append(s.order, r.Task.ID)
		}
		r.Task.durable = true
		s.tasks[r.Task.ID] = r.Task
		s.nextID = max(s.nextID, r.Task.ID)
		return nil
	}
	t := s.tasks[r.ID]
	if t == nil {
		return nil // a task forgotten since: nothing to apply
	}
	switch r.Op {
	case "start":
		t.State, t.Started, t.Devices, t.Slot = client.StateRunning, r.Time, r.Devices, r.Slot
		t.PID, t.PIDStart = r.PID, r.PIDStart
	case "end":
		t.State, t.Ended, t.Status, t.Reason = r.State, r.Time, r.Status, r.Reason
	default:
		return fmt.Errorf("unknown record %q", r.Op)
	}
	return nil
}

// snapshot is the journal's compact form: one whole record per task kept.
func (s *Server) snapshot() []*record {
	slices.Sort(s.order)
	ended := 0
	for _, id := range s.order {
		if s.tasks[id].ended() {
			ended++
		}
	}
	var recs []*record
	for _, id := range s.order {
		t := s.tasks[id]
		if t.ended() && ended > s.cfg.Tasks.KeepEnded {
			ended--
			delete(s.tasks, id)
			continue
		}
		recs = append(recs, &record{Op: "task", Task: t})
	}
	s.order = s.order[:0]
	for _, r := range recs {
		s.order = append(s.order, r.Task.ID)
	}
	return recs
}
