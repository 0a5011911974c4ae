// Package exitcode is the one table of the exit statuses that npurun,
// task-submit and npubroker give of themselves. It imports nothing and must
// hold no other table.
package exitcode

// The statuses. npurun(1), task-submit(1) and npubroker(8) list them
// under EXIT STATUS; the values above 2 are sysexits(3)'s where one fits.
const (
	OK      = 0
	Failure = 1 // a failure the caller cannot fix by waiting: refused, a protocol error
	Usage   = 2 // a bad command line; also an unknown pool or device
	// Unknown is task-submit's alone: a submission was sent, its answer
	// lost, and whether the broker recorded it cannot be told.
	Unknown     = 3
	Unavailable = 69  // no broker answers, or it went away during the call (EX_UNAVAILABLE)
	TempFail    = 75  // try again later: nothing free (--no-wait, --timeout), or a cap of the broker's reached (EX_TEMPFAIL)
	Denied      = 77  // the policy, or the broker, refuses the caller (EX_NOPERM)
	NoExec      = 126 // npurun: the command cannot be executed
	NotFound    = 127 // npurun: the command was not found
	// SlurmEnded is npurun's in Slurm's allocate mode: Slurm ended the
	// placeholder job through which the command held its devices
	// (scancel, its time limit, preemption), and the command was ended
	// with it: 128+SIGTERM, as a shell reports a command SIGTERM ended.
	// It is also what a shell reports of an npurun whose lease the
	// broker reclaimed as idle ([idle] action = "reclaim"): npurun is its
	// command by then, and the broker ends it with SIGTERM. npurun(1)
	// says both.
	SlurmEnded = 143
)
