package cli

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/cluster"
	"github.com/npurun/npurun/internal/clusterconf"
	"github.com/npurun/npurun/internal/exitcode"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
)

// On a login node ([cluster] scheduler = "slurm" in npurun.conf) every
// command goes through Slurm (package cluster): a task is a Slurm job
// and its id the job's. The answers are the broker path's, written by
// the same formatters from the jobs turned into wire.TaskInfo.

// clusterPollInterval is how often wait and logs -f ask Slurm about a
// job: Slurm tells no one when a job ends but its submitter's mail.
var clusterPollInterval = time.Second

// loginCluster is the cluster of this node's configuration, or nil; a
// configuration that does not parse is reported, with its exit status.
func loginCluster() (*cluster.Slurm, int) {
	s, err := cluster.Load(clusterconf.Path())
	if err != nil {
		warn("%v", err)
		return nil, exitcode.Failure
	}
	return s, 0
}

// runCluster carries out a parsed command line through Slurm.
func runCluster(o *options, s *cluster.Slurm) int {
	switch o.cmd {
	case "submit":
		return clusterSubmit(o, s)
	case "list":
		return clusterList(o, s)
	case "show":
		return clusterShow(o, s)
	case "logs":
		return clusterLogs(o, s)
	case "wait":
		return clusterWait(o, s)
	case "cancel", "hold", "release":
		return clusterControl(o, s)
	}
	warn("%s is a box's broker's: through Slurm, use scontrol requeue %d", o.cmd, o.id)
	return exitcode.Usage
}

// clusterFailure reports an error of Slurm's and returns its exit status:
// 75 (try again) for a command that failed, 2 for a request Slurm cannot
// be asked.
func clusterFailure(err error, id uint64) int {
	var ce *cluster.Error
	switch {
	case errors.Is(err, cluster.ErrNoJob):
		warn("no task %d: Slurm knows no job %d (ended long ago, or never was)", id, id)
		return exitcode.Failure
	case errors.As(err, &ce):
		warn("%v", err)
		if ce.Down {
			hint("Slurm's controller does not answer; try again later (scontrol ping)")
		}
		return exitcode.TempFail
	}
	warn("%v", err)
	return exitcode.Usage
}

func clusterSubmit(o *options, s *cluster.Slurm) int {
	sub := &o.sub
	switch {
	case len(sub.Devices) > 0:
		warn("-d names devices of one box; Slurm places the task on a node")
		hint("give a count instead: -n %d", len(sub.Devices))
		return exitcode.Usage
	case sub.OOMRetries > 0:
		warn("--oom-retries is a box's broker's: Slurm sees no device's memory")
		return exitcode.Usage
	}
	cwd, err := os.Getwd()
	if err != nil {
		warn("current directory: %v", err)
		return exitcode.Failure
	}
	r := &cluster.Request{N: sub.N, Mem: sub.Mem, TimeSec: sub.TimeSec, After: sub.After, Name: sub.Name, Pool: sub.Pool, CPUs: o.cpus, Log: sub.Log}
	if r.N == 0 && !sub.NoDevice {
		r.N = 1
	}
	if r.Log != "" && !filepath.IsAbs(r.Log) {
		r.Log = filepath.Join(cwd, r.Log)
	}
	shell := sub.Shell
	if shell == "" {
		shell = cluster.ShellJoin(sub.Argv)
	}
	r.Command = shell
	if !sub.NoNotify {
		r.Notify = cmp.Or(sub.Notify, s.Notify)
	}
	r.Token = sub.Token
	id, partition, existing, err := clusterSubmitOnce(s, r, cwd, shell)
	if err != nil {
		code := clusterFailure(err, 0)
		if code == exitcode.TempFail {
			warn("the task was not submitted")
		}
		return code
	}
	if existing {
		warn("token %s names task %d, submitted already: no other task was made", r.Token, id)
	}
	if o.json {
		err = writeJSON(stdout, submitted{ID: id, Pool: partition, State: wire.StatePending, Token: r.Token, Existing: existing})
	} else {
		where := ""
		if partition != "" {
			where = ", partition " + partition
		}
		_, err = fmt.Fprintf(stdout, "task %d submitted (Slurm job %d%s)\n", id, id, where)
	}
	if err != nil {
		warn("%v", err)
		return exitcode.Failure
	}
	return 0
}

// clusterSubmitOnce submits r, or, where its token names a job of the
// caller's that slurmctld keeps, finds that job instead (existing). The
// caller's submissions with tokens take turns (tokenLock), so two at
// once with one token make one job; without a lock file to take they go
// on, as Slurm's own do.
func clusterSubmitOnce(s *cluster.Slurm, r *cluster.Request, cwd, shell string) (id uint64, partition string, existing bool, err error) {
	if r.Token == "" {
		id, partition, err = s.Submit(r, cwd, shell)
		return id, partition, false, err
	}
	if f := tokenLock(); f != nil {
		defer f.Close()
	}
	j, err := s.ByToken(r.Token)
	switch {
	case err != nil:
		return 0, "", false, err
	case j != nil:
		return j.ID, j.Partition, true, nil
	}
	id, partition, err = s.Submit(r, cwd, shell)
	return id, partition, false, err
}

// tokenLock takes the caller's lock of submissions with tokens, the file
// cluster-token.lock in ~/.local/state/npurun (a shared home's lock is
// every login node's), else in $XDG_RUNTIME_DIR; nil where neither can
// be made. Closing the file lets it go.
func tokenLock() *os.File {
	var dirs []string
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, filepath.Dir(wire.DefaultLogDir)))
	}
	if run := os.Getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(run) {
		dirs = append(dirs, run)
	}
	for _, dir := range dirs {
		if os.MkdirAll(dir, 0o700) != nil {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, "cluster-token.lock"), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			continue
		}
		for {
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
			if err != unix.EINTR {
				break
			}
		}
		if err == nil {
			return f
		}
		f.Close()
	}
	return nil
}

// clusterTask is a Slurm job as task-submit shows it: a task, and the
// node it runs on.
type clusterTask struct {
	wire.TaskInfo
	Node   string `json:"node,omitempty"`
	Reason string `json:"wait_reason,omitempty"` // why it waits: Priority, Resources …
}

// taskOf turns a Slurm job into a task.
func taskOf(j *cluster.Job) clusterTask {
	t := wire.TaskInfo{ID: j.ID, User: j.User, UID: j.UID, Command: j.Command, Cwd: j.Cwd, Log: j.Output, Token: j.Token,
		Pool: j.Partition, TimeSec: j.TimeSec, Held: j.Held, Submitted: unixMs(j.Submitted), Started: unixMs(j.Started), Ended: unixMs(j.Ended)}
	if j.Name != "wrap" && j.Name != cluster.FirstWord(j.Command) {
		t.Name = j.Name
	}
	if n, err := strconv.Atoi(j.GRES[strings.LastIndexByte(j.GRES, ':')+1:]); err == nil {
		t.N = n
	}
	t.NoDevice = j.GRES == ""
	t.Devices = j.Devices
	if j.Mem > 0 { // a share: of Slurm's shards, or of the node's own npurun devices (no GRES)
		t.Mem, t.N, t.NoDevice = j.Mem, j.MemN, false
	}
	ct := clusterTask{Node: j.Node}
	switch j.State {
	case cluster.StatePending:
		t.State = wire.StatePending
		if j.Reason == "Dependency" {
			t.State = wire.StateBlocked
		}
		ct.Reason = j.Reason
	case cluster.StateRunning, "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING":
		t.State = wire.StateRunning
	case cluster.StateCompleted:
		t.State = wire.StateDone
	case cluster.StateCancelled:
		t.State = wire.StateCancelled
		t.Reason = "cancelled"
	case "NODE_FAIL":
		t.State = wire.StateLost
		t.Reason = "node failure"
	default: // FAILED, TIMEOUT, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE, PREEMPTED
		t.State = wire.StateFailed
		if j.State != cluster.StateFailed {
			t.Reason = strings.ToLower(strings.ReplaceAll(j.State, "_", " "))
		} else if j.Reason != "" && j.Reason != "NonZeroExitCode" {
			t.Reason = j.Reason
		}
	}
	if j.Over() {
		t.NeverRan = j.Started.IsZero() || j.Node == ""
		switch sig := j.Signal(); {
		case sig != 0:
			t.Signal = unix.SignalName(sig)
		case t.NeverRan || t.State == wire.StateLost:
			// No command ran to its end: no status of its own.
		default:
			code := j.ExitStatus()
			t.Exit = &code
		}
	}
	ct.TaskInfo = t
	return ct
}

func unixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func clusterList(o *options, s *cluster.Slurm) int {
	jobs, err := s.Jobs()
	if err != nil {
		return clusterFailure(err, 0)
	}
	uid := uint32(os.Getuid())
	var ts []clusterTask
	waiting := false
	for i := range jobs {
		j := &jobs[i]
		if (!o.all && j.UID != uid) || j.Over() != o.ended {
			continue
		}
		ts = append(ts, taskOf(j))
		waiting = waiting || j.State == cluster.StatePending
	}
	if waiting {
		if starts, err := s.Starts(); err == nil {
			for i := range ts {
				if st, ok := starts[ts[i].ID]; ok && !st.At.IsZero() {
					ts[i].Start = st.At.UnixMilli()
				}
			}
		}
	}
	switch {
	case o.json:
		if ts == nil {
			ts = []clusterTask{}
		}
		err = writeJSON(stdout, ts)
	case len(ts) > 0 && o.ended:
		infos := make([]wire.TaskInfo, len(ts))
		for i := range ts {
			infos[i] = ts[i].TaskInfo
		}
		sortEnded(infos)
		err = writeHistory(stdout, infos, true, time.Now())
	case len(ts) > 0:
		err = writeClusterTable(stdout, ts, time.Now())
	}
	if err != nil {
		warn("%v", err)
		return exitcode.Failure
	}
	return 0
}

// writeClusterTable writes list's table of Slurm's jobs: ID USER STATE
// NODE DEVICES SINCE, then the name or command, with the estimated start
// and Slurm's reason for a waiting one.
func writeClusterTable(w io.Writer, cts []clusterTask, now time.Time) error {
	ts := make([]wire.TaskInfo, len(cts))
	for i := range cts {
		ts[i] = cts[i].TaskInfo
	}
	i := 0
	return writeTaskRowsLast(w, ts, true, []string{"STATE", "NODE", "DEVICES", "SINCE"}, func(t *wire.TaskInfo) []string {
		ct := &cts[i]
		i++
		node := "-"
		if ct.Node != "" && t.Started != 0 {
			node = ct.Node
		}
		devices := "-"
		switch {
		case t.Started != 0 && len(t.Devices) > 0:
			devices = npu.FormatIDs(t.Devices)
		case t.Started == 0 && !t.NoDevice:
			devices = deviceCell(t)
		}
		return []string{stateCell(t), node, devices, sinceCell(t, now)}
	}, func(t *wire.TaskInfo, j int) string {
		last := nameOrCommand(t)
		if t.State != wire.StatePending && t.State != wire.StateBlocked {
			return last
		}
		var notes []string
		if t.Start != 0 {
			notes = append(notes, "est. start "+timeCell(t.Start, now))
		}
		if r := cts[j].Reason; r != "" {
			notes = append(notes, r)
		}
		if len(notes) > 0 {
			last += "   (" + strings.Join(notes, ", ") + ")"
		}
		return last
	})
}

// sinceCell is how long a task has been in its state: waiting since its
// submission, running since its start, ended since its end.
func sinceCell(t *wire.TaskInfo, now time.Time) string {
	at := t.Submitted
	switch {
	case t.Ended != 0:
		at = t.Ended
	case t.Started != 0:
		at = t.Started
	}
	if at == 0 {
		return "-"
	}
	return quantity.Approx(now.Sub(time.UnixMilli(at)))
}

// clusterJob is one of the caller's jobs (root: anyone's).
func clusterJob(o *options, s *cluster.Slurm) (*cluster.Job, int) {
	j, err := s.Job(o.id)
	if err != nil {
		return nil, clusterFailure(err, o.id)
	}
	return j, 0
}

func clusterShow(o *options, s *cluster.Slurm) int {
	j, code := clusterJob(o, s)
	if j == nil {
		return code
	}
	ct := taskOf(j)
	var err error
	if o.json {
		err = writeJSON(stdout, ct)
	} else {
		err = writeShow(stdout, &ct.TaskInfo, time.Local)
		if err == nil && ct.Node != "" && ct.Started != 0 {
			_, err = fmt.Fprintf(stdout, "node: %s\n", ct.Node)
		}
		if err == nil && ct.Reason != "" {
			_, err = fmt.Fprintf(stdout, "waits for: %s\n", ct.Reason)
		}
	}
	if err != nil {
		warn("%v", err)
		return exitcode.Failure
	}
	return 0
}

// clusterAwait polls Slurm until job id has ended, or until ready says
// so of the job; it returns the job as last read.
func clusterAwait(s *cluster.Slurm, id uint64, ready func(*cluster.Job) bool) (*cluster.Job, error) {
	for {
		j, err := s.Job(id)
		if err != nil {
			return nil, err
		}
		if j.Over() || (ready != nil && ready(j)) {
			return j, nil
		}
		time.Sleep(clusterPollInterval)
	}
}

func clusterWait(o *options, s *cluster.Slurm) int {
	j, err := clusterAwait(s, o.id, nil)
	if err != nil {
		return clusterFailure(err, o.id)
	}
	t := taskOf(j).TaskInfo
	code := waitStatus(&t)
	if code != 0 || t.State != wire.StateDone {
		warn("task %d %s", t.ID, describeEnd(&t))
	}
	return code
}

func clusterControl(o *options, s *cluster.Slurm) int {
	j, code := clusterJob(o, s)
	if j == nil {
		return code
	}
	var err error
	switch o.cmd {
	case "cancel":
		if !j.Over() {
			err = s.Cancel(o.id)
		}
	case "hold":
		err = s.Hold(o.id)
	case "release":
		err = s.Release(o.id)
	}
	if err != nil {
		return clusterFailure(err, o.id)
	}
	before := taskOf(j).TaskInfo
	if j, err = s.Job(o.id); err != nil {
		return clusterFailure(err, o.id)
	}
	t := taskOf(j).TaskInfo
	var line string
	switch {
	case o.cmd != "cancel":
		line = holdLine(&t)
	case ended(&before):
		line = cancelLine(&before)
	case before.State == wire.StateRunning:
		line = fmt.Sprintf("task %d: cancelled through Slurm (scancel): its processes get SIGTERM, then SIGKILL after Slurm's KillWait", t.ID)
	default:
		line = fmt.Sprintf("task %d cancelled", t.ID)
	}
	if _, err := fmt.Fprintln(stdout, line); err != nil {
		warn("%v", err)
		return exitcode.Failure
	}
	return 0
}

func clusterLogs(o *options, s *cluster.Slurm) int {
	j, code := clusterJob(o, s)
	if j == nil {
		return code
	}
	t := taskOf(j).TaskInfo
	if t.Log == "" {
		warn("Slurm did not say where the output of task %d is", t.ID)
		return exitcode.Failure
	}
	if j.State == cluster.StatePending && !o.follow {
		warn("task %d has not started; its output will be %s", t.ID, t.Log)
		return exitcode.Failure
	}
	if o.follow {
		if j, err := clusterAwait(s, o.id, func(j *cluster.Job) bool { return j.State != cluster.StatePending }); err != nil {
			return clusterFailure(err, o.id)
		} else {
			return followCluster(s, j, &t)
		}
	}
	f, err := openerFor(t.UID).open(t.Log)
	if err != nil {
		return clusterLogFailure(&t, j, err)
	}
	defer f.Close()
	if _, err := io.Copy(stdout, f); err != nil {
		return clusterLogFailure(&t, j, err)
	}
	return 0
}

// followCluster copies the job's output as it grows until the job ends.
func followCluster(s *cluster.Slurm, j *cluster.Job, t *wire.TaskInfo) int {
	var f *os.File
	var err error
	for f == nil {
		if f, err = openerFor(t.UID).open(t.Log); err != nil {
			if !errors.Is(err, os.ErrNotExist) || j.Over() {
				return clusterLogFailure(t, j, err)
			}
			time.Sleep(clusterPollInterval)
			if j, err = s.Job(t.ID); err != nil {
				return clusterFailure(err, t.ID)
			}
		}
	}
	defer f.Close()
	for {
		if _, err := io.Copy(stdout, f); err != nil {
			return clusterLogFailure(t, j, err)
		}
		if j.Over() {
			io.Copy(stdout, f) // what was written before it ended
			return 0
		}
		time.Sleep(clusterPollInterval)
		if j, err = s.Job(t.ID); err != nil {
			return clusterFailure(err, t.ID)
		}
	}
}

// clusterLogFailure reports an output file that cannot be read here: it
// may be on the node's disk, not shared with the login node.
func clusterLogFailure(t *wire.TaskInfo, j *cluster.Job, err error) int {
	if errors.Is(err, os.ErrNotExist) {
		warn("task %d's output is not readable here: it is %s on node %s", t.ID, t.Log, orDash(j.Node))
		hint("a job's output is written on its node; a directory shared with the login node (the home directories) makes it readable here")
		return exitcode.Failure
	}
	return logFailure(t, err)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
