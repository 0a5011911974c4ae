package tasks

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// fileOwner is the uid owning path, and its permission bits.
func fileOwner(t *testing.T, path string) (uint32, os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Uid, fi.Mode().Perm()
}

// TestTaskRunsAsSubmitter: a task runs with its submitter's uid, primary
// and supplementary groups, directory and environment, never as root, and
// its log is the submitter's.
func TestTaskRunsAsSubmitter(t *testing.T) {
	gname, gid2 := harness.NewGroup(t)
	u := harness.NewUser(t)
	if out, err := exec.Command("usermod", "-a", "-G", gname, u.Name).CombinedOutput(); err != nil {
		t.Fatalf("usermod -G %s %s: %v: %s", gname, u.Name, err, out)
	}
	b := harness.StartBroker(t, harness.TaskConfig(1))
	dir := harness.UserDir(t, &u, 0o700)
	marker := "marker-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	log := filepath.Join(dir, "task.log")

	cmd := harness.AsUser(b.TaskSubmit("--json", "--no-device", "--log", log,
		"--run", `{ id -u; id -G; pwd; echo "$NPURUN_E2E_MARKER"; } > out`), &u, dir, gid2)
	cmd.Env = append(cmd.Env, "NPURUN_E2E_MARKER="+marker)
	r := harness.RunTaskCmd(t, cmd)
	if r.Code != 0 {
		t.Fatalf("submit as %s: %s", u.Name, r)
	}
	var sub struct{ ID uint64 }
	if err := json.Unmarshal([]byte(r.Stdout), &sub); err != nil || sub.ID == 0 {
		t.Fatalf("submit --json printed %q: %v", r.Stdout, err)
	}
	id := sub.ID
	if w := harness.WaitTask(t, b, id); w.Code != 0 {
		t.Fatalf("wait %d: %s\nlog: %s", id, w, readFile(log))
	}
	ti := harness.ShowTask(t, b, id)
	if ti.UID != u.UID || ti.User != u.Name {
		t.Errorf("task of %s (%d) listed as %s (%d)", u.Name, u.UID, ti.User, ti.UID)
	}

	out := filepath.Join(dir, "out")
	lines := strings.Split(strings.TrimRight(readFile(out), "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("task wrote %q, want 4 lines", lines)
	}
	if lines[0] != strconv.Itoa(int(u.UID)) {
		t.Errorf("task ran as uid %s, want %d", lines[0], u.UID)
	}
	gotGroups := strings.Fields(lines[1])
	wantGroups := []string{strconv.Itoa(int(u.GID)), strconv.Itoa(int(gid2))}
	slices.Sort(gotGroups)
	slices.Sort(wantGroups)
	if !slices.Equal(gotGroups, wantGroups) {
		t.Errorf("task ran with groups %v, want %v (primary and %s)", gotGroups, wantGroups, gname)
	}
	if lines[2] != dir {
		t.Errorf("task ran in %q, want %q", lines[2], dir)
	}
	if lines[3] != marker {
		t.Errorf("task saw NPURUN_E2E_MARKER=%q, want %q", lines[3], marker)
	}
	for _, p := range []string{out, log} {
		if owner, _ := fileOwner(t, p); owner != u.UID {
			t.Errorf("%s is owned by uid %d, want %s's %d", p, owner, u.Name, u.UID)
		}
	}
}

// TestTaskPrivacy: another user sees that a task exists, and whose it is,
// but not its directory or log, nor its command where show_commands =
// "own" keeps command lines from others (as status does); may not show,
// wait for, cancel, follow or depend on it; and cannot read its log.
func TestTaskPrivacy(t *testing.T) {
	a, bu := harness.NewUser(t), harness.NewUser(t)
	b := harness.StartBroker(t, harness.TaskConfig(1)+"[status]\nshow_commands = \"own\"\n")
	adir, bdir := harness.UserDir(t, &a, 0o755), harness.UserDir(t, &bu, 0o700)
	gate := filepath.Join(adir, "gate")
	harness.MakeFIFO(t, gate)
	alog := filepath.Join(adir, "a.log")
	id := harness.SubmitTask(t, b, &a, adir, "--no-device", "--log", alog,
		"--", "sh", "-c", `echo private output; read x < "$1"`, "sh", gate)
	w := harness.OpenFIFO(t, gate, os.O_WRONLY) // A's task runs

	if mine := harness.FindTask(harness.ListTasks(t, b, &a, false), id); mine == nil || mine.Command == "" || mine.Log != alog {
		t.Fatalf("A's own list shows %+v, want the command and log", mine)
	}
	seen := harness.FindTask(harness.ListTasks(t, b, &bu, true), id)
	switch {
	case seen == nil:
		t.Errorf("B's list --all lacks A's task %d", id)
	case seen.User != a.Name || seen.UID != a.UID || seen.State != wire.StateRunning:
		t.Errorf("B's list --all shows A's task as %+v", seen)
	case seen.Command != "" || seen.Cwd != "" || seen.Log != "" || len(seen.Env) > 0:
		t.Errorf("B's list --all shows A's private fields: command %q cwd %q log %q env %q", seen.Command, seen.Cwd, seen.Log, seen.Env)
	}
	if got := harness.FindTask(harness.ListTasks(t, b, &bu, false), id); got != nil {
		t.Errorf("B's own list has A's task: %+v", got)
	}
	for _, args := range [][]string{
		{"show", harness.IDStr(id)},
		{"show", "--json", harness.IDStr(id)},
		{"cancel", harness.IDStr(id)},
		{"wait", harness.IDStr(id)},
		{"logs", harness.IDStr(id)},
		{"--log", filepath.Join(bdir, "b.log"), "--after", harness.IDStr(id), "--", "true"},
	} {
		r := harness.RunTaskCmd(t, harness.AsUser(b.TaskSubmit(args...), &bu, bdir))
		if r.Code != 1 || !strings.Contains(r.Stderr, "no task") || strings.Contains(r.Stdout+r.Stderr, adir) {
			t.Errorf("B's task-submit %q on A's task: %s; want exit 1, \"no task\", nothing of A's", args, r)
		}
	}

	if owner, mode := fileOwner(t, alog); owner != a.UID || mode != 0o600 {
		t.Errorf("A's log is uid %d mode %o, want uid %d mode 600", owner, mode, a.UID)
	}
	r := harness.RunTaskCmd(t, harness.AsUser(exec.Command("cat", alog), &bu, bdir))
	if r.Code == 0 || !strings.Contains(r.Stderr, "Permission denied") || strings.Contains(r.Stdout, "private") {
		t.Errorf("B reading A's log: %s; want permission denied", r)
	}

	// B's cancel did nothing: the task still runs, and ends well.
	if ti := harness.ShowTask(t, b, id); ti.State != wire.StateRunning {
		t.Errorf("A's task after B's cancel: %s, want running", ti.State)
	}
	w.Write([]byte("go\n"))
	w.Close()
	if r := harness.WaitTask(t, b, id); r.Code != 0 {
		t.Errorf("wait %d: %s", id, r)
	}
	if ti := harness.ShowTask(t, b, id); ti.State != wire.StateDone {
		t.Errorf("A's task ended %s (%s), want done", ti.State, ti.Reason)
	}
	if !strings.Contains(readFile(alog), "private output") {
		t.Errorf("A's log lacks the task's output:\n%s", readFile(alog))
	}
}

// TestTaskLogSymlink: a --log path that leads, through a symbolic link the
// submitter placed, to a file or directory only root may reach is never
// written. task-submit refuses it at submission, as the submitter; a link
// placed after the submission (while the task waits) is met by the
// supervisor, which opens the log with the submitter's privileges (and
// without following a final link), so the task fails instead.
func TestTaskLogSymlink(t *testing.T) {
	a := harness.NewUser(t)
	b := harness.StartBroker(t, harness.TaskConfig(1))
	adir := harness.UserDir(t, &a, 0o755)
	root := t.TempDir() // private to root, parents included
	if err := os.Chmod(root, 0o700); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(root, "secret")
	content := []byte("root's own file\n")
	if err := os.WriteFile(secret, content, 0o644); err != nil {
		t.Fatal(err)
	}
	mtime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	if err := os.Chtimes(secret, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	rootOnly := filepath.Join(root, "only")
	if err := os.Mkdir(rootOnly, 0o700); err != nil {
		t.Fatal(err)
	}
	link := func(target, name string) {
		p := filepath.Join(adir, name)
		// A owns the link, as if A had placed it.
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, int(a.UID), int(a.GID)); err != nil {
			t.Fatal(err)
		}
	}
	gate := filepath.Join(adir, "gate")
	harness.MakeFIFO(t, gate)

	for i, c := range []struct {
		name, target, link, log string // the link adir/link → target; the log under adir
	}{
		{"log is a link to root's file", secret, "file%d.log", "file%d.log"},
		{"log dir is a link to root's dir", rootOnly, "logs%d", "logs%d/task.log"},
		{"log dir to be made under a link to root's dir", rootOnly, "logs%d", "logs%d/sub/task.log"},
	} {
		t.Run(c.name, func(t *testing.T) {
			name, log := fmt.Sprintf(c.link, i), filepath.Join(adir, fmt.Sprintf(c.log, i))
			// Placed before: refused at submission, nothing recorded.
			link(c.target, name)
			r := harness.RunTaskCmd(t, harness.AsUser(b.TaskSubmit("--no-device", "--log", log, "--", "echo", "written by the task"), &a, adir))
			if r.Code != 1 || !strings.Contains(r.Stderr, "nothing was submitted") {
				t.Errorf("submit with log %s: %s; want it refused with status 1", log, r)
			}
			// Placed after: the task, held back by a gate, meets it.
			if err := os.Remove(filepath.Join(adir, name)); err != nil {
				t.Fatal(err)
			}
			hold := harness.SubmitTask(t, b, &a, adir, "--no-device", "--log", filepath.Join(adir, "hold.log"), "--", "sh", "-c", `read x < "$1"`, "sh", gate)
			w := harness.OpenFIFO(t, gate, os.O_WRONLY)
			id := harness.SubmitTask(t, b, &a, adir, "--no-device", "--log", log, "--after", harness.IDStr(hold), "--", "echo", "written by the task")
			link(c.target, name)
			w.Write([]byte("go\n"))
			w.Close()
			r = harness.WaitTask(t, b, id)
			ti := harness.ShowTask(t, b, id)
			if ti.State == wire.StateDone || r.Code == 0 {
				t.Errorf("task with log %s ended %s (wait %s); want it failed, having no log", log, ti.State, r)
			} else {
				t.Logf("task %d: %s: %s", id, ti.State, ti.Reason)
			}
			got, err := os.ReadFile(secret)
			if err != nil || !bytes.Equal(got, content) {
				t.Errorf("root's file now holds %q (%v), want %q", got, err, content)
			}
			if fi, err := os.Stat(secret); err != nil || !fi.ModTime().Equal(mtime) {
				t.Errorf("root's file modified: %v, %v", fi.ModTime(), err)
			}
			if ents, _ := os.ReadDir(rootOnly); len(ents) > 0 {
				t.Errorf("something wrote into root's directory: %v", ents)
			}
			os.Remove(filepath.Join(adir, name))
		})
	}
}

// readFile is a file's text, or the error reading it.
func readFile(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return string(data)
}
