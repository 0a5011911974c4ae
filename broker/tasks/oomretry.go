package tasks

import (
	"fmt"
	"slices"

	"github.com/npurun/npurun/broker/tasks/journal"
	"github.com/npurun/npurun/internal/quantity"
)

// Retries out of device memory (task-submit --oom-retries N, for a share:
// --mem). A task that failed with an out-of-memory message of the device's
// runtime in the tail of its run's log (the supervisor looks:
// supervisor.OOMMessages, the one list) ends failed as any, and is
// submitted again, checked as task-submit requeue submits an ended task
// (room.resolve and room.admitLocked; From names the task it comes from), its
// declaration raised to 1.25× the most it was seen to use (or to 1.25× its
// declaration, if that was more or is all that is known), one retry fewer
// left, RetryOf saying why. The retry is recorded in the journal in the
// end's own record (the journal's EndRetried): no broker's death between the
// end and the retry loses it, and a restart replays it with the end. Any
// other failure ends the task and uses no retry. The ended task's reason
// says it was retried, and with what, or why not.

// oomRaise is the declaration a retry gets, in MiB: 1.25× the larger of
// what the task declared and the most it was seen to use, rounded up to
// 256 MiB.
func oomRaise(mem, peak int64) int64 {
	x := max(mem, peak)
	x += x / 4
	return (x + 255) / 256 * 256
}

// oomRetryLocked makes the retry of task t, which ends failed out of
// device memory with peak MiB seen in use: its submission as it was before
// its end (an ended task's environment is dropped), its declaration raised
// (oomRaise), checked and given its id as a submission is; the caller
// records it with t's end. Its account is looked up again where the
// room has none for t (a task taken up at start) or the last lookup
// gave no answer. A refusal says why there is no retry; one wrapping
// ErrBusy, that the user database gives no answer now.
func (room *Room) oomRetryLocked(t *journal.Task, peak int64) (*Task, error) {
	sub := t.Sub
	sub.Argv, sub.Env, sub.Devices = slices.Clone(sub.Argv), slices.Clone(sub.Env), slices.Clone(sub.Devices)
	sub.Mem = oomRaise(sub.Mem, peak)
	sub.OOMRetries--
	sub.RetryOf = t.ID
	sub.Token = "" // a token names the first submission alone
	sub.After = nil
	var acct *Account
	j := room.jobs[t.ID]
	if j != nil {
		acct = j.acct
	}
	if acct == nil || acct.Unanswered() != nil {
		acct = room.accounts.Lookup(t.UID)
		if j != nil {
			j.acct = acct
		}
	}
	by := Submitter{UID: t.UID, Account: acct}
	r, err := room.resolve(by, &sub)
	if err != nil {
		return nil, err
	}
	r.From = t.ID
	// t's end, in the same record, leaves room for it.
	if err := room.admitLocked(by, r, 1); err != nil {
		return nil, err
	}
	return r, nil
}

// retriedLocked puts retry, recorded with task id's end, in line.
func (room *Room) retriedLocked(id uint64, retry *Task) {
	room.jobs[retry.ID] = retry
	room.settleLocked(retry)
	room.log.Printf("task %d ran out of device memory: retried as task %d with --mem %s (%s)", id, retry.ID, quantity.Size(retry.Sub.Mem),
		quantity.Count(retry.Sub.OOMRetries, "retry left", "retries left"))
}

// oomReason is the reason an ended task gives for its retry.
func oomReason(mem int64) string {
	return fmt.Sprintf("out of device memory: retried with --mem %s", quantity.Size(mem))
}
