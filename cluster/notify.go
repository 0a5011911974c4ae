package cluster

import (
	"strconv"
	"strings"

	"github.com/npurun/npurun/wire"
)

// A task's notify command (task-submit --notify, or the login
// configuration's [tasks] notify) goes with its job: Slurm runs no command
// of a submitter's at a job's end but mail, so the job's batch script
// runs it, on the job's node, as the job's user, once the command has
// ended, with the box's variables (wire.Notify*): the job's id, the state
// as list shows it (done, failed; cancelled where the job, or its
// command, was ended by SIGTERM, as Slurm ends one: scancel, its time
// limit, a preemption; the command's end may come before the script's
// own SIGTERM), the exit status (128+N
// for signal N), the signal's name, the task's name and its log. It runs
// by /bin/sh in the job's directory, its input /dev/null and its outputs
// appended to the job's output, killed after wire.NotifyFor; the job's
// own end, as Slurm records it, stays the command's: its exit status, or
// the same signal raised again. A job that is killed at once (SIGKILL,
// its node lost) runs no notify command, nor does one whose KillWait
// runs out first.

// notifyScript is the batch script of command line shell, run by /bin/sh,
// that runs notify after it. name and log are the task's name and log
// ("" for Slurm's default output file in the job's directory).
func notifyScript(shell, notify, name, log string) string {
	if log == "" {
		log = `$PWD/slurm-$SLURM_JOB_ID.out`
	} else {
		log = ShellJoin([]string{log})
	}
	var b strings.Builder
	b.WriteString("npurun_term=\ntrap 'npurun_term=1' TERM\n")
	b.WriteString("/bin/sh -c " + ShellJoin([]string{shell}) + "\n")
	b.WriteString(`npurun_s=$?
npurun_sig=
if [ "$npurun_s" -gt 128 ] && [ "$npurun_s" -lt 193 ]; then npurun_sig=$(kill -l $((npurun_s - 128)) 2>/dev/null); fi
if [ -n "$npurun_term" ] || [ "$npurun_s" -eq 143 ]; then npurun_state=cancelled; elif [ "$npurun_s" -eq 0 ]; then npurun_state=done; else npurun_state=failed; fi
`)
	b.WriteString(wire.NotifyID + `="$SLURM_JOB_ID" ` + wire.NotifyState + `="$npurun_state" ` + wire.NotifyExit + `="$npurun_s" ` +
		wire.NotifySignal + `="${npurun_sig:+SIG$npurun_sig}" ` + wire.NotifyName + "=" + ShellJoin([]string{name}) + " " + wire.NotifyLog + "=" + log + " \\\n")
	b.WriteString("\ttimeout -s KILL " + strconv.Itoa(int(wire.NotifyFor.Seconds())) + " /bin/sh -c " + ShellJoin([]string{notify}) + " </dev/null\n")
	b.WriteString(`if [ -n "$npurun_sig" ]; then trap - "$npurun_sig"; kill -s "$npurun_sig" $$; fi
exit "$npurun_s"
`)
	return b.String()
}
