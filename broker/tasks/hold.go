package tasks

import (
	"errors"
	"fmt"

	"github.com/npurun/npurun/broker/refusal"
	"github.com/npurun/npurun/broker/tasks/journal"
	"github.com/npurun/npurun/wire"
)

// Hold and release, and requeue: what a user does with a task of theirs
// beyond submitting and cancelling it.

// Hold holds task id of asker uid (root: anyone's) in its place in line,
// or releases it (held false): a held task waits, settles as any, keeps
// its place, and is never started until released. The hold is in the
// journal before it is answered, so a restart keeps it; while it is
// written the task is held already, so that no grant comes meanwhile. If
// it cannot be written, nothing has changed.
func (room *Room) Hold(uid uint32, id uint64, held bool) (wire.TaskInfo, error) {
	room.mu.Lock()
	defer room.unlock()
	t, j, err := room.jobFor(uid, id)
	if err != nil {
		return wire.TaskInfo{}, err
	}
	verb := "held"
	if !held {
		verb = "released"
	}
	switch {
	case t.Busy():
		return wire.TaskInfo{}, refusal.New(ErrBusy, "", "task %d is being cancelled", t.ID)
	case !t.IsWaiting() || j == nil:
		hint := ""
		if t.Shown() == journal.Running {
			hint = fmt.Sprintf("stop it with 'task-submit cancel %d'", t.ID)
		}
		return wire.TaskInfo{}, refusal.New(ErrDenied, hint, "task %d is %s: only a waiting task can be %s", t.ID, t.Shown(), verb)
	}
	if held {
		room.holdLocked(j, true) // no grant while the hold is written
	}
	err = room.life.Hold(t, held)
	room.holdLocked(j, room.heldLocked(j))
	if err != nil {
		room.log.Printf("task %d: %v", t.ID, err)
		return wire.TaskInfo{}, refusal.New(ErrSpool, "", "the broker could not record that task %d is %s, so nothing changed: %v", t.ID, verb, err)
	}
	if held {
		room.run.Unwarm(j) // it may wait for long: its readied start goes
	} else {
		room.serveLocked()
	}
	return room.infoLocked(t, j), nil
}

// HeldWhy is why a task its owner holds waits, as status shows it.
const HeldWhy = "held by its owner (task-submit release lets it start)"

// HeldByOwner tells which of tasks ids wait held by their owner (Hold).
func (room *Room) HeldByOwner(ids ...uint64) map[uint64]bool {
	if room == nil || len(ids) == 0 {
		return nil
	}
	room.mu.Lock()
	defer room.mu.Unlock()
	if room.life == nil {
		return nil
	}
	var held map[uint64]bool
	for _, id := range ids {
		if t := room.life.Get(id); t != nil && t.Held && t.IsWaiting() {
			if held == nil {
				held = map[uint64]bool{}
			}
			held[id] = true
		}
	}
	return held
}

// Requeue submits ended task id of by again, as a new task with a new id:
// its command, directory, devices, pool, time limit, name, log and notify
// command as it was submitted, and what a submission takes from where it
// is made from s (the environment, which an ended task no longer keeps,
// the umask, the token). Its --after tasks are not named again: they were
// settled for the first one. Only the task's owner may requeue it: the new
// task is the asker's (root's tasks are root's).
func (room *Room) Requeue(by Submitter, id uint64, s *wire.Submission, left func() bool) (*Submitted, error) {
	if s == nil {
		return nil, refusal.New(ErrBadRequest, "", "requeue without the asker's environment")
	}
	room.mu.Lock()
	t, err := room.taskFor(by.UID, id)
	switch {
	case err != nil:
		room.unlock()
		if r := (*refusal.Refusal)(nil); errors.As(err, &r) && errors.Is(r, ErrNoSuchTask) {
			r.Hint = "the broker keeps a user's latest ended tasks only (see 'task-submit list --ended')"
		}
		return nil, err
	case t.UID != by.UID:
		room.unlock()
		return nil, refusal.New(ErrDenied, "", "task %d is %s's: a task is submitted again as the user who asks, so only its owner may requeue it", t.ID, t.User)
	case !t.IsEnded():
		room.unlock()
		return nil, refusal.New(ErrDenied, "cancel it first, or wait for it to end", "task %d is %s: only an ended task can be requeued", t.ID, t.Shown())
	}
	sub := t.Sub
	room.unlock()
	sub.Argv = append([]string(nil), sub.Argv...)
	sub.Devices = append([]int(nil), sub.Devices...)
	sub.Env, sub.Umask, sub.Token, sub.After = s.Env, s.Umask, s.Token, nil
	return room.submit(by, &sub, left, id)
}
