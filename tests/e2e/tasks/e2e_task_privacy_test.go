package tasks

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// TestTaskReasonPrivate: why another user's task failed (it names paths and
// programs) is not in list --all; its owner and root see it. Its command
// is shown to others as status shows command lines: not with
// show_commands = "own" (TestTaskListCommandsAsStatus has both settings).
func TestTaskReasonPrivate(t *testing.T) {
	a, bu := harness.NewUser(t), harness.NewUser(t)
	b := harness.StartBroker(t, harness.TaskConfig(1)+"[status]\nshow_commands = \"own\"\n")
	adir := harness.UserDir(t, &a, 0o755)
	secret := filepath.Join(adir, "secret-project", "train-v7")
	id := harness.SubmitTask(t, b, &a, adir, "--no-device", "--log", filepath.Join(adir, "log"), "--", secret)
	harness.WaitTask(t, b, id)
	if ti := harness.ShowTask(t, b, id); ti.State != wire.StateFailed || !strings.Contains(ti.Reason, "secret-project") {
		t.Fatalf("root's show: %s (%q), want failed naming the program", ti.State, ti.Reason)
	}
	for _, c := range []struct {
		who     string
		u       *harness.TestUser
		all     bool
		private bool
	}{
		{"the owner", &a, false, true},
		{"root, list --all", nil, true, true},
		{"another user, list --all", &bu, true, false},
	} {
		got := harness.FindTask(harness.ListTasks(t, b, c.u, c.all), id)
		switch {
		case got == nil:
			t.Errorf("%s: task %d not listed", c.who, id)
		case got.State != wire.StateFailed || got.ExitStatus() != 127:
			t.Errorf("%s: task %d listed as %s, exit %d; want failed, 127", c.who, id, got.State, got.ExitStatus())
		case c.private && !strings.Contains(got.Reason, "secret-project"):
			t.Errorf("%s: reason %q, want the program named", c.who, got.Reason)
		case !c.private && got.Reason != "":
			t.Errorf("%s sees the reason %q of another's task", c.who, got.Reason)
		}
	}
	r := harness.RunTaskCmd(t, harness.AsUser(b.TaskSubmit("list", "--all", "--json"), &bu, "/"))
	if strings.Contains(r.Stdout, "secret-project") {
		t.Errorf("another user's list --all names the program:\n%s", r.Stdout)
	}
}

// TestTaskLogsAsOwner: root's task-submit logs opens a user's log with the
// user's rights: a log the user has replaced with a link to a file only
// root may read, or to which the user has no access, is refused, and one
// replaced with a FIFO does not hang it; the log as the task left it is
// shown.
func TestTaskLogsAsOwner(t *testing.T) {
	a := harness.NewUser(t)
	b := harness.StartBroker(t, harness.TaskConfig(1))
	adir := harness.UserDir(t, &a, 0o755)
	log := filepath.Join(adir, "task.log")
	id := harness.SubmitTask(t, b, &a, adir, "--no-device", "--log", log, "--", "echo", "the task's own output")
	if r := harness.WaitTask(t, b, id); r.Code != 0 {
		t.Fatalf("wait: %s", r)
	}
	if r := harness.RunTaskCmd(t, b.TaskSubmit("logs", harness.IDStr(id))); r.Code != 0 || !strings.Contains(r.Stdout, "the task's own output") {
		t.Fatalf("root's logs of the task: %s", r)
	}

	rootDir := harness.SharedDir(t) // root's, enterable by all
	secret := filepath.Join(rootDir, "secret")
	if err := os.WriteFile(secret, []byte("root's secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	replace := func(make func(path string) error) {
		t.Helper()
		if err := os.Remove(log); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if err := make(log); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Lstat(log); err != nil {
			t.Fatal(err)
		} else if fi.Mode().IsRegular() {
			return // a hard link: the file is root's still
		}
		if err := os.Lchown(log, int(a.UID), int(a.GID)); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name, want string
		make       func(path string) error
	}{
		{"a symbolic link to root's file", "symbolic link", func(p string) error { return os.Symlink(secret, p) }},
		{"a hard link to root's file", "permission denied", func(p string) error { return os.Link(secret, p) }},
		{"a FIFO", "not a regular file", func(p string) error { return unix.Mkfifo(p, 0o666) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			replace(c.make)
			r := harness.RunTaskCmd(t, b.TaskSubmit("logs", harness.IDStr(id)))
			if r.Code != 1 || strings.Contains(r.Stdout, "secret") || !strings.Contains(r.Stderr, c.want) {
				t.Errorf("root's logs of a log replaced by %s: %s; want exit 1 saying %q, nothing of root's file", c.name, r, c.want)
			}
		})
	}
}

// TestTaskListPages: a listing longer than a page comes whole, each task
// once, in id order, with its place in line, however the pages fall.
func TestTaskListPages(t *testing.T) {
	// Made before the broker, so removed after it stops: once the holder
	// is gone the tasks start, and their supervisors write their log here.
	// Under /tmp, not $TMPDIR: the pages' fill depends on the paths'
	// length (cwd and log), which must not depend on the environment.
	dir, err := os.MkdirTemp("/tmp", "npurun-lp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	b := harness.StartBroker(t, harness.TaskConfig(1)+"[limits]\nmax_queued_tasks = 0\n")
	h := harness.Hold(t, b, "holder", "-d", "0") // the tasks wait behind it
	defer h.Release()
	c := b.Dial()
	const n = 700 // pages hold 256 at most
	for i := 0; i < n; i++ {
		if _, err := c.Submit(&wire.Submission{Argv: []string{"true"}, Cwd: dir, Env: []string{"PATH=/bin"}, Log: filepath.Join(dir, "log"), N: 1}); err != nil {
			t.Fatalf("submit %d: %v", i, err)
		}
	}
	for _, all := range []bool{false, true} {
		ts := harness.ListTasks(t, b, nil, all)
		if len(ts) != n {
			t.Fatalf("list (all %v): %d tasks, want %d", all, len(ts), n)
		}
		for i, ti := range ts {
			if i > 0 && ti.ID <= ts[i-1].ID {
				t.Fatalf("list (all %v): task %d after task %d", all, ti.ID, ts[i-1].ID)
			}
			if ti.State != wire.StatePending || ti.Position != i+1 {
				t.Fatalf("list (all %v): task %d %s at place %d, want pending at %d", all, ti.ID, ti.State, ti.Position, i+1)
			}
		}
	}
	// The pages are full: 256 tasks each, as many as fit in a message
	// (the broker's guess at a task's size once stopped a page at 136 of
	// these, and a listing took twice the round trips).
	pages, got := 0, 0
	req := &wire.Request{Op: wire.OpList}
	for {
		if err := c.Send(req); err != nil {
			t.Fatal(err)
		}
		r, _, err := c.Recv(harness.EventTimeout)
		if err != nil || r.Type != wire.TypeTasks {
			t.Fatalf("list page %d: %+v %v", pages+1, r, err)
		}
		pages++
		got += len(r.Tasks)
		if !r.More {
			break
		}
		if len(r.Tasks) != 256 {
			t.Errorf("page %d holds %d tasks, want 256 (a page's cap, and they fit in a message)", pages, len(r.Tasks))
		}
		req = &wire.Request{Op: wire.OpList, After: r.Next}
	}
	if want := (n + 255) / 256; pages != want || got != n {
		t.Errorf("a listing of %d tasks came in %d pages with %d tasks, want %d pages", n, pages, got, want)
	}
}
