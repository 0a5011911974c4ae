package tasks

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// TestTaskListCommandsAsStatus: whether another user sees a task's command
// in task-submit list --all is the rule by which npubroker status shows
// them the command of its holder: [status] show_commands (everyone's with
// "all", the default; their own only with "own"), root and the owner
// always (issue 27.25: list --all showed "-" where status showed the
// command). The directory, log and reason stay the owner's and root's.
func TestTaskListCommandsAsStatus(t *testing.T) {
	for _, show := range []string{"all", "own"} {
		t.Run(show, func(t *testing.T) {
			a, bu := harness.NewUser(t), harness.NewUser(t)
			b := harness.StartBroker(t, harness.TaskConfig(1)+"[status]\nshow_commands = \""+show+"\"\n")
			adir := harness.UserDir(t, &a, 0o755)
			id := harness.SubmitTask(t, b, &a, adir, "-n", "1", "--log", filepath.Join(adir, "log"), "--", "sleep", "600")
			t.Cleanup(func() { harness.RunTaskCmd(t, b.TaskSubmit("cancel", harness.IDStr(id))) })
			harness.WaitBoard(t, b, func(bd *wire.Board) bool {
				d := harness.Device(t, bd, 0)
				return d.Lease != nil && len(d.Lease.Holders) > 0 && d.Lease.Holders[0].Command == "sleep 600"
			})

			cmd := harness.AsUser(exec.Command(b.Bin.Broker, "status", "--json"), &bu, "/")
			cmd.Env = b.Env()
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("status as another user: %v\n%s", err, harness.StderrOf(err))
			}
			var bd wire.Board
			if err := json.Unmarshal(out, &bd); err != nil {
				t.Fatal(err)
			}
			statusShows := harness.Device(t, &bd, 0).Lease.Holders[0].Command != ""
			if statusShows != (show == "all") {
				t.Fatalf("status with show_commands = %q shows another's command: %v", show, statusShows)
			}

			got := harness.FindTask(harness.ListTasks(t, b, &bu, true), id)
			if got == nil {
				t.Fatalf("task %d not in another user's list --all", id)
			}
			if listShows := got.Command == "sleep 600"; listShows != statusShows || (!listShows && got.Command != "") {
				t.Errorf("list --all shows another user the command %q, status shows its holder's: %v", got.Command, statusShows)
			}
			if got.Cwd != "" || got.Log != "" || got.Token != "" {
				t.Errorf("list --all shows another user the task's directory %q, log %q or token %q", got.Cwd, got.Log, got.Token)
			}
			table := harness.RunTaskCmd(t, harness.AsUser(b.TaskSubmit("list", "--all"), &bu, "/"))
			if row := strings.Join(tableRow(table.Stdout, id), " "); strings.Contains(row, "sleep 600") != statusShows {
				t.Errorf("list --all's table row %q: command shown %v, want %v as status", row, !statusShows, statusShows)
			}
			// Root and the owner see it whatever the setting.
			for who, u := range map[string]*harness.TestUser{"root": nil, "the owner": &a} {
				if got := harness.FindTask(harness.ListTasks(t, b, u, true), id); got == nil || got.Command != "sleep 600" || got.Cwd != adir {
					t.Errorf("%s's list --all: %+v, want the command and directory", who, got)
				}
			}
		})
	}
}

// TestTaskAfterFailedNeverRan: a task whose --after task failed ends
// failed without running, and says so (issue 27.25): never_ran in --json
// (list, list --all for another user, show), STARTED "never" in list's
// table, "started: never" in show, "failed without running" from wait;
// the task that ran and failed says none of it.
func TestTaskAfterFailedNeverRan(t *testing.T) {
	a, bu := harness.NewUser(t), harness.NewUser(t)
	b := harness.StartBroker(t, harness.TaskConfig(1))
	adir := harness.UserDir(t, &a, 0o755)
	f1 := harness.SubmitTask(t, b, &a, adir, "--no-device", "--log", filepath.Join(adir, "f1.log"), "--", "sh", "-c", "sleep 0.2; exit 3")
	f2 := harness.SubmitTask(t, b, &a, adir, "--no-device", "--log", filepath.Join(adir, "f2.log"), "--after", harness.IDStr(f1), "--", "true")
	if r := harness.WaitTask(t, b, f2); r.Code != 1 || !strings.Contains(r.Stderr, "failed without running") {
		t.Errorf("wait %d: %s; want 1 and failed without running", f2, r)
	}
	for who, u := range map[string]*harness.TestUser{"the owner": &a, "another user": &bu} {
		ts := harness.ListTasks(t, b, u, true)
		if got := harness.FindTask(ts, f2); got == nil || got.State != wire.StateFailed || !got.NeverRan {
			t.Errorf("%s's list --all: task %d %+v, want failed and never_ran", who, f2, got)
		}
		if got := harness.FindTask(ts, f1); got == nil || got.State != wire.StateFailed || got.NeverRan {
			t.Errorf("%s's list --all: task %d %+v, want failed, and run", who, f1, got)
		}
	}
	if ti := harness.ShowTask(t, b, f2); !ti.NeverRan || ti.Started != 0 {
		t.Errorf("show --json %d: %+v, want never_ran", f2, ti)
	}
	table := harness.RunTaskCmd(t, harness.AsUser(b.TaskSubmit("list"), &a, "/"))
	if row := tableRow(table.Stdout, f2); len(row) < 5 || row[1] != "failed" || row[4] != "never" {
		t.Errorf("list's row of task %d: %q, want failed, STARTED never:\n%s", f2, row, table.Stdout)
	}
	show := harness.RunTaskCmd(t, harness.AsUser(b.TaskSubmit("show", harness.IDStr(f2)), &a, "/"))
	if !strings.Contains(show.Stdout, "\nstarted: never: it ended without running\n") {
		t.Errorf("show %d does not say it never ran:\n%s", f2, show.Stdout)
	}
	if show := harness.RunTaskCmd(t, harness.AsUser(b.TaskSubmit("show", harness.IDStr(f1)), &a, "/")); strings.Contains(show.Stdout, "never") {
		t.Errorf("show %d says a task that ran never did:\n%s", f1, show.Stdout)
	}
}

// tableRow is the fields of the row of task id in list's table.
func tableRow(table string, id uint64) []string {
	for _, l := range strings.Split(table, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == harness.IDStr(id) {
			return f
		}
	}
	return nil
}
