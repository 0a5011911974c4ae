package broker

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/npurun/npurun/broker/tasklife"
	"github.com/npurun/npurun/internal/quantity"
)

// openTasks opens the task journal in dir and takes up its tasks. A
// journal that cannot be opened (its directory refused, or unreadable)
// does not stop the broker: it serves leases, refuses task operations
// with the reason, and tries again in the background until it can.
func (s *Server) openTasks(dir string) error {
	err := s.takeUpTasks(dir)
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrClaimed) || errors.Is(err, errCgroupSetup) {
		return err // another broker's spool, or control groups asked for that cannot be had: this one must not start
	}
	s.mu.Lock()
	s.taskErr = err
	s.mu.Unlock()
	s.log.Printf("tasks unavailable: %v; leases are served, and the broker tries again", err)
	go func() {
		for wait := time.Second; ; wait = min(2*wait, time.Minute) {
			time.Sleep(wait)
			err := s.takeUpTasks(dir)
			if err == nil {
				s.log.Print("tasks available again")
				return
			}
			s.mu.Lock()
			if err.Error() != s.taskErr.Error() {
				s.log.Printf("tasks unavailable: %v", err)
			}
			s.taskErr = err
			s.mu.Unlock()
		}
	}()
	return nil
}

// takeUpTasks replays the journal into a new table (outside the broker's
// lock: nobody else sees it yet), then, under the lock, takes it up:
// running tasks whose supervisor lives on are followed to their end (the
// others are lost), and waiting tasks queue again in submission order.
func (s *Server) takeUpTasks(dir string) error {
	// Two brokers replaying one journal would run the same task twice.
	if err := s.claimState(dir); err != nil {
		return err
	}
	// Tasks run under the supervisor program; leases do not need it. One
	// that is missing or that another user could replace leaves tasks
	// unavailable, and the broker looks again as it tries again.
	if s.supBin == nil {
		bin, err := findSupervisor(s.self)
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.supBin = bin
		s.mu.Unlock()
	}
	// The tasks' control groups, once the spool is this broker's (a broker
	// that must not start touches none).
	if !s.cgReady {
		owner, err := filepath.Abs(dir)
		if err != nil {
			return err
		}
		cg, err := setupCgroups(s.cgMode, owner, s.log)
		if err != nil {
			return fmt.Errorf("%w: %w", errCgroupSetup, err)
		}
		s.mu.Lock()
		s.cg, s.cgReady = cg, true
		s.mu.Unlock()
		if cg != nil {
			s.reapLeftIdle()
		}
	}
	life, err := tasklife.Open(dir, tasklife.Options{
		Lock: &s.mu, Keep: s.cfg.Tasks.KeepEnded, KeepPerUser: s.cfg.Tasks.KeepEndedPer,
		Ended: s.taskEndedLocked, Log: s.log, Boot: s.boot,
	})
	if err != nil {
		return err
	}
	// The tasks' control groups left by the broker before this one: a
	// running task's is adopted with it, a waiting task's is used again
	// for its start, the others' are removed (below).
	groups := map[uint64]bool{}
	if s.cg != nil {
		for _, id := range s.cg.tasks() {
			groups[id] = true
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loading = true
	s.life, s.running, s.taskErr = life, life.RunningByUser(), nil
	var all []*tasklife.Task
	life.Each(func(t *tasklife.Task) bool {
		if !t.IsEnded() {
			all = append(all, t)
		}
		return true
	})
	// The groups of tasks that had ended, or that the journal forgot:
	// nothing of them may run on. (Those of tasks found lost below are
	// killed and reaped by their end, once: not here as well.)
	for id := range groups {
		if t := life.Get(id); t == nil || t.IsEnded() {
			go s.reapCgroup(id)
		}
	}
	// Running tasks first: they hold their CPU slots and count against
	// their users' caps before anything waiting is scheduled.
	var gone []*task
	for _, t := range all {
		if t.State != tasklife.Running {
			continue
		}
		j := &task{Task: t, cgroup: groups[t.ID]}
		s.jobs[t.ID] = j
		if s.adoptLocked(j) {
			continue
		}
		gone = append(gone, j)
		reason := "its supervisor was gone when the broker restarted; exit status unknown"
		if t.Boot != "" && t.Boot != s.boot {
			reason = "the machine restarted while it ran; exit status unknown"
		}
		life.EndNow(t, tasklife.Lost, reason)
	}
	for _, t := range all {
		if t.IsWaiting() {
			j := &task{Task: t, cgroup: groups[t.ID]}
			s.jobs[t.ID] = j
			s.settleLocked(j)
		}
	}
	s.loading = false
	s.scheduleLocked()
	// What a gone supervisor left in its session is killed, with the lock
	// let go during the /proc scans. (A task with a control group had it
	// killed by its end.)
	for _, j := range gone {
		if !j.cgroup {
			s.endProcessesLocked(j)
		}
	}
	return nil
}

// adoptLocked takes up a task that was running when the broker stopped:
// its supervisor, if still there, reports to this broker. It tells whether
// the supervisor is there. One from another boot never is: its pid and
// start time may name an unrelated process now.
func (s *Server) adoptLocked(j *task) bool {
	t := j.Task
	if t.Boot != "" && t.Boot != s.boot {
		return false
	}
	if !alive(s.proc, t.PID, t.PIDStart) || !isSupervisor(s.proc, t.PID, t.ID) {
		return false
	}
	if t.Slot >= 0 && t.Slot < len(s.cpuFree) {
		s.cpuFree[t.Slot] = false
	}
	j.heard = true // running long enough to be adopted: it catches SIGTERM
	msg := fmt.Sprintf("task %d is still running (supervisor pid %d)", t.ID, t.PID)
	if left := s.enforceLimitLocked(j); left > 0 {
		msg += fmt.Sprintf("; the broker kills it if it runs %s more", quantity.Duration(left))
	}
	s.log.Print(msg)
	pid, start := t.PID, t.PIDStart
	go func() {
		waitExit(s.proc, pid, start)
		s.supervisorGone(j, pid)
	}()
	return true
}
