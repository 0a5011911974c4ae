package tasks

import (
	"github.com/npurun/npurun/broker/tasks/journal"
)

// Notice tells running task id's notify command, if it has one, state
// (wire.NoticeIdle: the [idle] policy's warning that the task's devices
// have been idle): the runner runs the command as the task's end
// notification is run, as its submitter with NPURUN_TASK_STATE=state,
// without waiting for it. A task that is not running, or has no notify
// command, is told nothing; so is one whose runner runs too many notices
// already. It reports whether a notice was started.
func (room *Room) Notice(id uint64, state string) bool {
	if room == nil {
		return false
	}
	room.mu.Lock()
	t := room.jobs[id]
	if t == nil || t.State != journal.Running || t.Notify == "" || room.life == nil {
		room.unlock()
		return false
	}
	spec := room.specLocked(t.Task)
	spec.Notice = state
	run := room.run.Notice(t, spec)
	room.unlock()
	if run == nil {
		return false
	}
	go run()
	return true
}
