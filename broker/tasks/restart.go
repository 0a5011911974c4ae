package tasks

import (
	"errors"
	"fmt"
	"time"

	"github.com/npurun/npurun/broker/tasklife"
	"github.com/npurun/npurun/internal/quantity"
)

// Open opens the task journal in dir and takes up its tasks. A journal
// that cannot be opened (its directory refused, or unreadable), or a
// runner that cannot be readied (no trusted supervisor program), does not
// stop the broker: it serves leases, the runtime refuses task operations
// with the reason (Unavailable), and tries again in the background until
// it can. An error wrapping ErrFatal does stop it.
func (rt *Runtime) Open(dir string) error {
	err := rt.takeUp(dir)
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrFatal) {
		return err // another broker's spool, or control groups asked for that cannot be had: this one must not start
	}
	rt.mu.Lock()
	rt.taskErr = err
	rt.mu.Unlock()
	rt.log.Printf("tasks unavailable: %v; leases are served, and the broker tries again", err)
	go func() {
		for wait := time.Second; ; wait = min(2*wait, time.Minute) {
			time.Sleep(wait)
			err := rt.takeUp(dir)
			if err == nil {
				rt.log.Print("tasks available again")
				return
			}
			rt.mu.Lock()
			if err.Error() != rt.taskErr.Error() {
				rt.log.Printf("tasks unavailable: %v", err)
			}
			rt.taskErr = err
			rt.mu.Unlock()
		}
	}()
	return nil
}

// takeUp replays the journal into a new table (outside the lock: nobody
// else sees it yet), then, under the lock, takes it up: running tasks
// whose process lives on are followed to their end (the others are lost),
// and waiting tasks queue again in submission order.
func (rt *Runtime) takeUp(dir string) error {
	// Two brokers replaying one journal would run the same task twice.
	if err := rt.claim(dir); err != nil {
		return err
	}
	if err := rt.run.Open(dir); err != nil {
		return err
	}
	life, err := tasklife.Open(dir, tasklife.Options{
		Lock: &rt.mu, Keep: rt.policy().Tasks.KeepEnded, KeepPerUser: rt.policy().Tasks.KeepEndedPer,
		Ended: rt.endedLocked, Log: rt.log, Boot: rt.boot,
	})
	if err != nil {
		return err
	}
	rt.mu.Lock()
	defer rt.unlock()
	rt.loading = true
	rt.life, rt.running, rt.taskErr = life, life.RunningByUser(), nil
	var all []*Task
	life.Each(func(t *tasklife.Task) bool {
		if !t.IsEnded() {
			all = append(all, &Task{Task: t})
		}
		return true
	})
	rt.run.TakeUp(all)
	// Running tasks first: they hold their CPU slots and count against
	// their users' caps before anything waiting is scheduled.
	var gone []*Task
	for _, j := range all {
		t := j.Task
		if t.State != tasklife.Running {
			continue
		}
		rt.jobs[t.ID] = j
		if rt.adoptLocked(j) {
			continue
		}
		gone = append(gone, j)
		reason := "its supervisor was gone when the broker restarted; exit status unknown"
		if t.Boot != "" && t.Boot != rt.boot {
			reason = "the machine restarted while it ran; exit status unknown"
		}
		life.EndNow(t, tasklife.Lost, reason)
	}
	for _, j := range all {
		if j.IsWaiting() {
			rt.jobs[j.ID] = j
			rt.settleLocked(j)
		}
	}
	rt.loading = false
	rt.serveLocked()
	// What a gone process left is killed, with the lock let go during the
	// look through /proc.
	for _, j := range gone {
		rt.run.Kill(j)
	}
	return nil
}

// adoptLocked takes up a task that was running when the broker stopped:
// its process, if still there, reports to this broker. It tells whether
// the process is there. One from another boot never is: its pid and start
// time may name an unrelated process now.
func (rt *Runtime) adoptLocked(j *Task) bool {
	t := j.Task
	if t.Boot != "" && t.Boot != rt.boot {
		return false
	}
	if !rt.run.Adopt(j) {
		return false
	}
	if t.Slot >= 0 && t.Slot < len(rt.cpuFree) {
		rt.cpuFree[t.Slot] = false
	}
	// Its account, as a task submitted to this broker has one (what its
	// end may submit again is checked against it; a lookup that gives no
	// answer now is made again then).
	j.acct = rt.accounts.Lookup(t.UID)
	msg := fmt.Sprintf("task %d is still running (supervisor pid %d)", t.ID, t.PID)
	if left := rt.backstopLocked(j); left > 0 {
		msg += fmt.Sprintf("; the broker kills it if it runs %s more", quantity.Duration(left))
	}
	rt.log.Print(msg)
	return true
}
