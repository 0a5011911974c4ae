package tasks

import (
	"fmt"

	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/internal/quantity"
)

// Retries out of device memory (task-submit --oom-retries N, for a share:
// --mem). A task that failed with an out-of-memory message of the device's
// runtime in the tail of its run's log (the supervisor looks:
// supervisor.OOMMessages, the one list) ends failed as any, and is
// submitted again the way task-submit requeue submits an ended task (one
// path, rt.submit: checked and recorded in the journal as any submission,
// so a restart keeps it; From names the task it comes from), its
// declaration raised to 1.25× the most it was seen to use (or to 1.25× its
// declaration, if that was more or is all that is known), one retry fewer
// left, RetryOf saying why. Any other failure ends the task and uses no
// retry. The ended task's reason says it was retried, and with what.

// oomRaise is the declaration a retry gets, in MiB: 1.25× the larger of
// what the task declared and the most it was seen to use, rounded up to
// 256 MiB.
func oomRaise(mem, peak int64) int64 {
	x := max(mem, peak)
	x += x / 4
	return (x + 255) / 256 * 256
}

// oomRetry submits a retry of task id, which has ended failed out of
// device memory, as by: sub is its submission as it was before its end
// (an ended task's environment is dropped), its declaration raised
// already (oomRaise). It takes the runtime's lock: call it holding none.
// A retry refused (the user's caps, a full journal) is logged.
func (rt *Runtime) oomRetry(by Submitter, id uint64, sub client.Submission) {
	sub.OOMRetries--
	sub.RetryOf = id
	sub.Token = "" // a token names the first submission alone
	sub.After = nil
	s, err := rt.submit(by, &sub, func() bool { return false }, id)
	if err != nil {
		rt.log.Printf("task %d ran out of device memory: its retry was not submitted: %v", id, err)
		return
	}
	rt.log.Printf("task %d ran out of device memory: retried as task %d with --mem %s (%s)", id, s.ID, quantity.Size(sub.Mem),
		quantity.Count(sub.OOMRetries, "retry left", "retries left"))
}

// oomReason is the reason an ended task gives for its retry.
func oomReason(mem int64) string {
	return fmt.Sprintf("out of device memory: retried with --mem %s", quantity.Size(mem))
}
