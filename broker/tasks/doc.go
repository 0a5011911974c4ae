// Package tasks is the broker's task room (Room): it owns the detached
// tasks from submission to end: their checks and tokens, their journal
// (package journal, the only writer of it), their place in the lease
// table's line (and the CPU slots' queue for --no-device tasks), their
// grant and its lease, their start at most once (the start record before
// the go-ahead), the pause of task starts while the journal cannot be
// written, the lookups that wait for the user database, their time-limit
// backstop, the end of their lease with them, their take-up at a restart,
// and what status reads of them (Supervisor, Counts, CPULine: copies). How
// a granted task's processes run is a Runner's, made by Config.Runner:
// the local runner (package local, which broker.New gives the room: warm
// and idle supervisors, the supervisor program's trust walk, control
// groups, adoption) is today's, and a second way to run a task (a Slurm batch
// job) is a sibling implementing Runner, not a branch inside it. A task
// for devices that an allocator outside the line hands out (Slurm's, in
// allocate mode: the broker's Slurm room) waits in the line as any, is
// refused and told why it waits by that allocator (Outside), and is
// started or failed on its word (Deliver, Refuse). The room
// has one lock, shared by the journal and the runner; it comes after the
// broker's (which calls Schedule, Unwatch and the views holding its own)
// and before the lease table's. The room must never touch a client's
// socket or the wire's replies (it answers with data and Refusals, and
// tells its Owner and Watchers what happened only once its lock is let
// go), nor wait, fork, write to disk or look through /proc holding its
// lock (the journal and the runner let it go meanwhile), nor read the
// status ledger.
package tasks
