package tasks

import (
	"fmt"
	"slices"
	"time"

	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/broker/tasklife"
	"github.com/npurun/npurun/internal/quantity"
)

// Retries out of device memory (task-submit --oom-retries N, for a share:
// --mem). A task that failed with an out-of-memory message of the device's
// runtime in the tail of its run's log (the supervisor looks:
// supervisor.OOMMessages, the one list) ends failed as any, and is
// submitted again as a new task, its declaration raised to 1.25× the most
// it was seen to use (or to 1.25× its declaration, if that was more or
// is all that is known), one retry fewer left, logging to the same log,
// recorded in the journal as any submission (so a restart keeps it). Any
// other failure ends the task and uses no retry. The ended task's reason
// names its retry; the retry's RetryOf names the task it retries.

// oomRaise is the declaration a retry gets, in MiB: 1.25× the larger of
// what the task declared and the most it was seen to use, rounded up to
// 256 MiB.
func oomRaise(mem, peak int64) int64 {
	x := max(mem, peak)
	x += x / 4
	return (x + 255) / 256 * 256
}

// oomRetryLocked submits retry id of task t, which has just ended failed
// out of device memory (its reason names the retry); sub is its
// submission as it was before its end (an ended task's environment is
// dropped), its declaration raised already (oomRaise), acct its
// submitter. A retry that cannot be recorded is logged.
func (rt *Runtime) oomRetryLocked(t *tasklife.Task, id uint64, sub client.Submission, acct *Account) {
	sub.OOMRetries--
	sub.RetryOf = t.ID
	sub.Token = "" // a token names the first submission alone
	sub.After = nil
	nt := &Task{acct: acct, Task: &tasklife.Task{
		ID: id, UID: t.UID, User: t.User, Sub: sub, Argv: slices.Clone(t.Argv), Log: t.Log, TimeSec: t.TimeSec,
		Submitted: time.Now().UnixMilli(), Slot: -1,
	}}
	if err := rt.life.Submit(nt.Task); err != nil {
		rt.log.Printf("task %d ran out of device memory: its retry could not be recorded: %v", t.ID, err)
		return
	}
	rt.jobs[nt.ID] = nt
	rt.log.Printf("task %d ran out of device memory: retried as task %d with --mem %s (%s)", t.ID, nt.ID, quantity.Size(sub.Mem),
		quantity.Count(sub.OOMRetries, "retry left", "retries left"))
	rt.settleLocked(nt)
}

// oomReason is the reason an ended task gives for its retry.
func oomReason(id uint64, mem int64) string {
	return fmt.Sprintf("out of device memory: retried as task %d with --mem %s", id, quantity.Size(mem))
}
