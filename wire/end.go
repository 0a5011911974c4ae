package wire

import "strconv"

// EndHow says how a process ended, in the one wording of task-submit's
// lines about a task that ended and of the supervisor's last line of a
// task's log: "exit 3" or "killed by SIGKILL", with why after it in
// parentheses ("killed by SIGKILL (time limit 1h0m0s reached)"); why alone
// where neither an exit code nor a signal is known ("its processes could
// not be killed within 10s"); "" where nothing is. The caller says what
// became of the task around it ("failed: …", "ended: …").
func EndHow(exit *int, signal, reason string) string {
	how := ""
	switch {
	case exit != nil:
		how = "exit " + strconv.Itoa(*exit)
	case signal != "":
		how = "killed by " + signal
	}
	switch {
	case how == "":
		return reason
	case reason == "":
		return how
	}
	return how + " (" + reason + ")"
}
