package tasks

import (
	"errors"
	"fmt"
	"time"

	"github.com/npurun/npurun/broker/tasks/journal"
	"github.com/npurun/npurun/internal/quantity"
)

// Open opens the task journal in dir and takes up its tasks. A journal
// that cannot be opened (its directory refused, or unreadable), or a
// runner that cannot be readied (no trusted supervisor program), does not
// stop the broker: it serves leases, the room refuses task operations
// with the reason (Unavailable), and tries again in the background until
// it can. An error wrapping ErrFatal does stop it.
func (room *Room) Open(dir string) error {
	err := room.takeUp(dir)
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrFatal) {
		return err // another broker's spool, or control groups asked for that cannot be had: this one must not start
	}
	room.mu.Lock()
	room.taskErr = err
	room.mu.Unlock()
	room.log.Printf("tasks unavailable: %v; leases are served, and the broker tries again", err)
	go func() {
		for wait := time.Second; ; wait = min(2*wait, time.Minute) {
			time.Sleep(wait)
			err := room.takeUp(dir)
			if err == nil {
				room.log.Print("tasks available again")
				return
			}
			room.mu.Lock()
			if err.Error() != room.taskErr.Error() {
				room.log.Printf("tasks unavailable: %v", err)
			}
			room.taskErr = err
			room.mu.Unlock()
		}
	}()
	return nil
}

// takeUp replays the journal into a new table (outside the lock: nobody
// else sees it yet), then, under the lock, takes it up: running tasks
// whose process lives on are followed to their end (the others are lost),
// and waiting tasks queue again in submission order.
func (room *Room) takeUp(dir string) error {
	// Two brokers replaying one journal would run the same task twice.
	if err := room.claim(dir); err != nil {
		return err
	}
	if err := room.run.Open(dir); err != nil {
		return err
	}
	life, err := journal.Open(dir, journal.Options{
		Lock: &room.mu, Keep: room.policy().Tasks.KeepEnded, KeepPerUser: room.policy().Tasks.KeepEndedPer,
		Ended: room.endedLocked, Log: room.log, Boot: room.boot,
	})
	if err != nil {
		return err
	}
	room.mu.Lock()
	defer room.unlock()
	room.loading = true
	room.life, room.running, room.taskErr = life, life.RunningByUser(), nil
	var all []*Task
	life.Each(func(t *journal.Task) bool {
		if !t.IsEnded() {
			all = append(all, &Task{Task: t})
		}
		return true
	})
	room.run.TakeUp(all)
	// Running tasks first: they hold their CPU slots and count against
	// their users' caps before anything waiting is scheduled.
	var gone []*Task
	for _, j := range all {
		t := j.Task
		if t.State != journal.Running {
			continue
		}
		room.jobs[t.ID] = j
		if room.adoptLocked(j) {
			continue
		}
		gone = append(gone, j)
		reason := "its supervisor was gone when the broker restarted; exit status unknown"
		if t.Boot != "" && t.Boot != room.boot {
			reason = "the machine restarted while it ran; exit status unknown"
		}
		life.EndNow(t, journal.Lost, reason)
	}
	for _, j := range all {
		if j.IsWaiting() {
			room.jobs[j.ID] = j
			room.settleLocked(j)
		}
	}
	room.loading = false
	room.serveLocked()
	// What a gone process left is killed, with the lock let go during the
	// look through /proc.
	for _, j := range gone {
		room.run.Kill(j)
	}
	return nil
}

// adoptLocked takes up a task that was running when the broker stopped:
// its process, if still there, reports to this broker. It tells whether
// the process is there. One from another boot never is: its pid and start
// time may name an unrelated process now.
func (room *Room) adoptLocked(j *Task) bool {
	t := j.Task
	if t.Boot != "" && t.Boot != room.boot {
		return false
	}
	if !room.run.Adopt(j) {
		return false
	}
	if t.Slot >= 0 && t.Slot < len(room.cpuFree) {
		room.cpuFree[t.Slot] = false
	}
	// Its account, as a task submitted to this broker has one (what its
	// end may submit again is checked against it; a lookup that gives no
	// answer now is made again then).
	j.acct = room.accounts.Lookup(t.UID)
	msg := fmt.Sprintf("task %d is still running (supervisor pid %d)", t.ID, t.PID)
	if left := room.backstopLocked(j); left > 0 {
		msg += fmt.Sprintf("; the broker kills it if it runs %s more", quantity.Duration(left))
	}
	room.log.Print(msg)
	return true
}
