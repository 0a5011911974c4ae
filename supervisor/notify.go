package supervisor

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/wire"
)

// A task's notify command (task-submit --notify, or [tasks] notify) is run
// by its supervisor, which is the submitter already, once the broker has
// acknowledged the task's end: so it runs at most once per end, a broker
// restart between the end and the acknowledgement included (the report is
// retried, the command run after it), and it holds up nothing, neither
// the task's devices (their locks went with the command's processes) nor
// the next task's start (the end is recorded before it runs). It runs in
// the task's directory, by /bin/sh, with a clean environment (notifyVars
// of the submitter's, and the task's NPURUN_TASK_* variables), its
// standard input /dev/null and its outputs appended to the task's log, in
// a process group of its own that is killed after wire.NotifyFor.

// notifyVars are the submitter's variables a notify command keeps: enough
// for a desktop notice (notify-send) or a mail.
var notifyVars = []string{"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TZ", "MAIL",
	"DISPLAY", "WAYLAND_DISPLAY", "DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR"}

// notifyFor bounds a notify command (a variable: tests shorten it).
var notifyFor = wire.NotifyFor

// The same command is run, the same way, by a supervisor launched for a
// notice alone (wire.Spec.Notice): NPURUN_TASK_STATE=idle while the task
// runs, with NPURUN_TASK_EXIT and NPURUN_TASK_SIGNAL empty.

// notifyEnv is the environment of spec's notify command for a task that
// ended with st; st nil: a notice (spec.Notice) while it runs.
func notifyEnv(spec *wire.Spec, st *wire.Status) []string {
	var env []string
	for _, name := range notifyVars {
		if v, ok := lookupVar(spec.Env, name); ok {
			env = append(env, name+"="+v)
		}
	}
	if _, ok := lookupVar(env, "PATH"); !ok {
		env = append(env, "PATH=/usr/local/bin:/usr/bin:/bin")
	}
	state, exit, signal := spec.Notice, "", ""
	if st != nil {
		info := wire.TaskInfo{State: wire.EndState(st), Exit: st.Exit, Signal: st.Signal}
		state, exit, signal = info.State, strconv.Itoa(info.ExitStatus()), st.Signal
	}
	env = append(env,
		wire.NotifyID+"="+strconv.FormatUint(spec.ID, 10),
		wire.NotifyState+"="+state,
		wire.NotifyExit+"="+exit,
		wire.NotifySignal+"="+signal,
		wire.NotifyName+"="+spec.Name,
		wire.NotifyLog+"="+spec.Log)
	return env
}

// lookupVar is the last value of name in env, and whether it is set.
func lookupVar(env []string, name string) (string, bool) {
	value, ok := "", false
	for _, kv := range env {
		if v, found := strings.CutPrefix(kv, name+"="); found {
			value, ok = v, true
		}
	}
	return value, ok
}

// notify runs spec's notify command for a task that ended with st (nil:
// a notice while it runs), and says in the task's log how it went when it
// did not go well.
func notify(spec *wire.Spec, st *wire.Status) {
	log, err := openLog(spec.Log)
	if err != nil {
		warn("task %d: notify: %v", spec.ID, err)
		return
	}
	defer log.Close()
	cmd := exec.Command("/bin/sh", "-c", spec.Notify)
	cmd.Dir = spec.Cwd
	if fi, err := os.Stat(spec.Cwd); err != nil || !fi.IsDir() {
		cmd.Dir = "/"
	}
	cmd.Env = notifyEnv(spec, st)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf(log, "npurun: task %d: notify command did not start: %v\n", spec.ID, err)
		return
	}
	var timedOut atomic.Bool
	kill := time.AfterFunc(notifyFor, func() {
		timedOut.Store(true)
		_ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
	})
	err = cmd.Wait()
	kill.Stop()
	var ee *exec.ExitError
	switch {
	case timedOut.Load():
		logf(log, "npurun: task %d: notify command killed after %s\n", spec.ID, quantity.Duration(notifyFor))
	case errors.As(err, &ee):
		logf(log, "npurun: task %d: notify command %s\n", spec.ID, ee.ProcessState.String())
	case err != nil:
		logf(log, "npurun: task %d: notify command: %v\n", spec.ID, err)
	}
}
