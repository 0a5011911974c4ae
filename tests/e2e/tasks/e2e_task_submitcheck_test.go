package tasks

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// TestTaskBoundToFail: a task that cannot but fail is not reported as
// started. A log its submitter may not write, or no home directory for the
// default log, is refused before anything is submitted (exit 1); a task
// --after a task that failed is recorded failed, and task-submit exits 1.
func TestTaskBoundToFail(t *testing.T) {
	u := harness.NewUser(t) // useradd --no-create-home: its home does not exist
	b := harness.StartBroker(t, harness.TaskConfig(1))
	udir := harness.UserDir(t, &u, 0o755)
	rootOnly := harness.SharedDir(t) // root's, mode 0755: others may not create files in it
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"log in a directory not theirs", []string{"--log", filepath.Join(rootOnly, "x.log")}, "you may not create files in " + rootOnly},
		{"log under a directory not theirs", []string{"--log", filepath.Join(rootOnly, "sub", "x.log")}, "you may not create files in " + rootOnly},
		{"no home directory for the default log", nil, "home directory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append(append([]string{"--no-device"}, c.args...), "--", "true")
			r := harness.RunTaskCmd(t, harness.AsUser(b.TaskSubmit(args...), &u, udir))
			if r.Code != 1 || !strings.Contains(r.Stderr, c.want) || !strings.Contains(r.Stderr, "--log") {
				t.Errorf("task-submit %q: %s; want exit 1 saying %q and naming --log", args, r, c.want)
			}
		})
	}
	if ts := harness.ListTasks(t, b, &u, false); len(ts) != 0 {
		t.Errorf("refused submissions were recorded: %+v", ts)
	}

	log := filepath.Join(udir, "log")
	failed := harness.SubmitTask(t, b, &u, udir, "--no-device", "--log", log, "--", "false")
	harness.WaitTask(t, b, failed)
	r := harness.RunTaskCmd(t, harness.AsUser(b.TaskSubmit("--no-device", "--log", log, "--after", harness.IDStr(failed), "--", "true"), &u, udir))
	if r.Code != 1 || !strings.Contains(r.Stdout, "submitted: failed") || !strings.Contains(r.Stderr, "will not run: dependency "+harness.IDStr(failed)) {
		t.Errorf("submit --after a failed task: %s; want exit 1, the task's id and why it will not run", r)
	}
	if _, err := os.Stat(filepath.Join(rootOnly, "x.log")); err == nil {
		t.Errorf("a refused task's log was made")
	}
}

// TestTaskShowWaitReason: show says why a waiting task waits beyond its
// turn: its user's max_running_tasks, as npurun says max_devices.
func TestTaskShowWaitReason(t *testing.T) {
	b := harness.StartBroker(t, harness.TaskConfig(1)+"[limits]\nmax_running_tasks = 1\n")
	dir := t.TempDir()
	gate := filepath.Join(harness.SharedDir(t), "gate")
	harness.MakeFIFO(t, gate)
	first := harness.SubmitTask(t, b, nil, dir, "--no-device", "--log", filepath.Join(dir, "1.log"), "--", "sh", "-c", `read x < "$1"`, "sh", gate)
	w := harness.OpenFIFO(t, gate, os.O_WRONLY) // the first runs
	second := harness.SubmitTask(t, b, nil, dir, "--no-device", "--log", filepath.Join(dir, "2.log"), "--", "true")
	ti := harness.ShowTask(t, b, second)
	if ti.State != "pending" || !strings.Contains(ti.Reason, "runs 1 of 1 task allowed (the default [limits])") {
		t.Errorf("show of a task held by max_running_tasks: %s, reason %q", ti.State, ti.Reason)
	}
	if out := harness.RunTaskCmd(t, b.TaskSubmit("show", harness.IDStr(second))).Stdout; !strings.Contains(out, "reason: ") {
		t.Errorf("show does not say why the task waits:\n%s", out)
	}
	w.Write([]byte("go\n"))
	w.Close()
	for _, id := range []uint64{first, second} {
		if r := harness.WaitTask(t, b, id); r.Code != 0 {
			t.Errorf("wait %d: %s", id, r)
		}
	}
}
