package tasks

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// Issue 20, item 4: hold and release, requeue, notify and the history of
// ended tasks, each across a broker restart.

// taskOp runs `task-submit ARGS` as the test process; a failure fails the
// test.
func taskOp(t *testing.T, b *harness.Broker, args ...string) harness.TaskResult {
	t.Helper()
	r := harness.RunTaskCmd(t, b.TaskSubmit(args...))
	if r.Code != 0 {
		t.Fatalf("task-submit %q: %s", args, r)
	}
	return r
}

// fileWords is the words of the file at path ("" when it is missing).
func fileWords(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Fields(string(data))
}

// TestTaskHoldRelease: a held task is never started, keeps its place in
// line and stays held across a broker restart (killed: the journal says
// so, nothing else); a task released after the restart starts before
// those that came after it, as its place says; the task still held starts
// only once released. The tasks write their names to a file as they run,
// one device between them.
func TestTaskHoldRelease(t *testing.T) {
	b := harness.StartBroker(t, harness.TaskConfig(1))
	dir := t.TempDir()
	order := filepath.Join(dir, "order")
	h := harness.Hold(t, b, "holder", "-n", "1")
	submit := func(name string) uint64 {
		return harness.SubmitTask(t, b, nil, dir, "--name", name, "--log", filepath.Join(dir, name+".log"),
			"--run", "echo "+name+" >> "+order)
	}
	a, bb, c := submit("a"), submit("b"), submit("c")
	for _, id := range []uint64{a, bb} {
		r := taskOp(t, b, "hold", harness.IDStr(id))
		if want := fmt.Sprintf("task %d held (", id); !strings.HasPrefix(r.Stdout, want) {
			t.Errorf("hold %d printed %q, want %q…", id, r.Stdout, want)
		}
	}
	b.Kill()
	b.Start()
	for i, id := range []uint64{a, bb} {
		ti := harness.ShowTask(t, b, id)
		if !ti.Held || ti.State != wire.StatePending || ti.Position != i+1 {
			t.Errorf("task %d after the restart: held %v, %s, position %d; want held, pending, position %d", id, ti.Held, ti.State, ti.Position, i+1)
		}
	}
	if ls := harness.ListTasks(t, b, nil, false); harness.FindTask(ls, a) == nil || !harness.FindTask(ls, a).Held {
		t.Errorf("list --json after the restart does not show task %d held: %+v", a, ls)
	}
	var why []string
	for _, ln := range b.Board(t).Waiting {
		for _, w := range ln.Waiters {
			why = append(why, fmt.Sprintf("%d:%s", w.Task, w.Why))
		}
	}
	held := "held by its owner (task-submit release lets it start)"
	if want := []string{fmt.Sprintf("%d:%s", a, held), fmt.Sprintf("%d:%s", bb, held), fmt.Sprintf("%d:", c)}; !slicesEqual(why, want) {
		t.Errorf("status's line: %q, want %q", why, want)
	}
	taskOp(t, b, "release", harness.IDStr(bb))
	h.Release()
	harness.WaitTask(t, b, c)
	if got, want := fileWords(t, order), []string{"b", "c"}; !slicesEqual(got, want) {
		t.Errorf("tasks ran in the order %q, want %q (a held, b released in its place before c)", got, want)
	}
	if ti := harness.ShowTask(t, b, a); ti.State != wire.StatePending || !ti.Held {
		t.Errorf("held task %d: %s, held %v; want pending, held", a, ti.State, ti.Held)
	}
	if r := harness.RunTaskCmd(t, b.TaskSubmit("hold", harness.IDStr(c))); r.Code == 0 || !strings.Contains(r.Stderr, "only a waiting task can be held") {
		t.Errorf("hold of ended task %d: %s", c, r)
	}
	taskOp(t, b, "release", harness.IDStr(a))
	if r := harness.WaitTask(t, b, a); r.Code != 0 {
		t.Errorf("released task %d: %s", a, r)
	}
	if got, want := fileWords(t, order), []string{"b", "c", "a"}; !slicesEqual(got, want) {
		t.Errorf("tasks ran in the order %q, want %q", got, want)
	}
}

func slicesEqual(a, b []string) bool { return strings.Join(a, "\n") == strings.Join(b, "\n") }

// TestTaskRequeue: an ended task is submitted again after a restart, as a
// new task with a new id, its command, directory, name and log as they
// were, and the environment of the requeue (an ended task keeps none);
// only an ended task can be requeued, and only by its owner.
func TestTaskRequeue(t *testing.T) {
	u := harness.NewUser(t)
	b := harness.StartBroker(t, harness.TaskConfig(1))
	dir := harness.UserDir(t, &u, 0o755)
	out := filepath.Join(dir, "out")
	sub := harness.AsUser(b.TaskSubmit("--json", "--name", "twice", "--log", filepath.Join(dir, "log"), "--run", `echo "run $RUN" >> `+out), &u, dir)
	sub.Env = append(b.Env(), "RUN=1")
	r := harness.RunTaskCmd(t, sub)
	var first struct{ ID uint64 }
	if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &first) != nil {
		t.Fatalf("submit: %s", r)
	}
	harness.WaitTask(t, b, first.ID)
	b.Kill()
	b.Start()

	// Not by another user: the new task would be theirs.
	if r := harness.RunTaskCmd(t, b.TaskSubmit("requeue", harness.IDStr(first.ID))); r.Code == 0 || !strings.Contains(r.Stderr, "only its owner may requeue it") {
		t.Errorf("requeue by root of %s's task: %s", u.Name, r)
	}
	req := harness.AsUser(b.TaskSubmit("requeue", "--json", harness.IDStr(first.ID)), &u, "/")
	req.Env = append(b.Env(), "RUN=2")
	r = harness.RunTaskCmd(t, req)
	var again struct{ ID, From uint64 }
	if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &again) != nil {
		t.Fatalf("requeue: %s", r)
	}
	if again.ID == first.ID || again.From != first.ID {
		t.Errorf("requeue of %d made task %d from %d, want a new id from %d", first.ID, again.ID, again.From, first.ID)
	}
	if r := harness.WaitTask(t, b, again.ID); r.Code != 0 {
		t.Errorf("requeued task %d: %s", again.ID, r)
	}
	ti := harness.ShowTask(t, b, again.ID)
	if ti.Name != "twice" || ti.Cwd != dir || ti.Log != filepath.Join(dir, "log") || ti.From != first.ID || ti.User != u.Name {
		t.Errorf("requeued task: %+v, want name twice, cwd %s, its log, from %d, user %s", ti, dir, first.ID, u.Name)
	}
	if got, want := strings.Split(strings.TrimSpace(readFile(out)), "\n"), []string{"run 1", "run 2"}; !slicesEqual(got, want) {
		t.Errorf("the task's runs wrote %q, want %q", got, want)
	}

	// Not a task that has not ended.
	h := harness.Hold(t, b, "holder", "-n", "1")
	defer h.Release()
	waiting := harness.SubmitTask(t, b, &u, dir, "--log", filepath.Join(dir, "log2"), "--", "true")
	if r := harness.RunTaskCmd(t, harness.AsUser(b.TaskSubmit("requeue", harness.IDStr(waiting)), &u, "/")); r.Code == 0 || !strings.Contains(r.Stderr, "only an ended task can be requeued") {
		t.Errorf("requeue of waiting task %d: %s", waiting, r)
	}
	harness.RunTaskCmd(t, b.TaskSubmit("cancel", harness.IDStr(waiting)))
}

// TestTaskNotify: a task's notify command runs once, as the submitter, in
// the task's directory, with a clean environment and the task's id,
// state and exit status, after its end is recorded: also when the task
// ended while no broker ran (its supervisor reports to the next, then
// notifies). [tasks] notify is the default; --no-notify turns it off.
func TestTaskNotify(t *testing.T) {
	u := harness.NewUser(t)
	b := harness.StartBroker(t, harness.TaskConfig(1)+`notify = "echo default $NPURUN_TASK_ID >> notified"`+"\n")
	if !harness.ContainedBy(t, b) {
		t.Skip("no control groups for tasks on this machine: the end of a supervisor's notify command cannot be awaited")
	}
	dir := harness.UserDir(t, &u, 0o755)
	notified := filepath.Join(dir, "notified")
	fifo := filepath.Join(dir, "go")
	harness.MakeFIFO(t, fifo)
	sub := harness.AsUser(b.TaskSubmit("--json", "--log", filepath.Join(dir, "log"),
		"--notify", `echo "$NPURUN_TASK_ID $NPURUN_TASK_STATE $NPURUN_TASK_EXIT $(id -u) $(pwd) secret=$SECRET" >> notified`,
		"--run", `read x < go; exit 3`), &u, dir)
	sub.Env = append(b.Env(), "SECRET=s3cr3t")
	r := harness.RunTaskCmd(t, sub)
	var s struct{ ID uint64 }
	if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &s) != nil {
		t.Fatalf("submit: %s", r)
	}
	w := harness.OpenFIFO(t, fifo, os.O_WRONLY) // the task runs
	b.Kill()
	w.Close() // it ends while no broker runs
	b.Start()
	if r := harness.WaitTask(t, b, s.ID); r.Code != 3 {
		t.Fatalf("task %d: %s, want exit 3", s.ID, r)
	}
	awaitNotified(t, b, s.ID)
	want := fmt.Sprintf("%d failed 3 %d %s secret=", s.ID, u.UID, dir)
	if got := strings.TrimSpace(readFile(notified)); got != want {
		t.Errorf("the notify command wrote %q, want %q (once)", got, want)
	}

	// The policy's notify, and none with --no-notify.
	os.Remove(notified)
	def := harness.SubmitTask(t, b, &u, dir, "--log", filepath.Join(dir, "log"), "--", "true")
	none := harness.SubmitTask(t, b, &u, dir, "--no-notify", "--log", filepath.Join(dir, "log"), "--", "true")
	for _, id := range []uint64{def, none} {
		harness.WaitTask(t, b, id)
		awaitNotified(t, b, id)
	}
	if got, want := strings.TrimSpace(readFile(notified)), fmt.Sprintf("default %d", def); got != want {
		t.Errorf("the policy's notify wrote %q, want %q (none for --no-notify task %d)", got, want, none)
	}
}

// awaitNotified waits until task id's supervisor, which runs its notify
// command once its end is recorded, has exited: its control group, where
// the notify command runs too, is removed only then.
func awaitNotified(t *testing.T, b *harness.Broker, id uint64) {
	t.Helper()
	harness.AwaitRemoved(t, filepath.Join(b.Cgroup, "task-"+harness.IDStr(id)))
}

// TestTaskHistory: list --ended lists the ended tasks the broker keeps,
// after a restart, and those only the accounting log remembers once the
// broker keeps them no more (keep_ended_per_user = 1), with --json; not
// those that ended before --since.
func TestTaskHistory(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(1)+"[tasks]\ncpu_slots = 4\nkeep_ended_per_user = 1\n")
	dir := t.TempDir()
	var ids []uint64
	for range 3 {
		id := harness.SubmitTask(t, b, nil, dir, "--log", filepath.Join(dir, "log"), "--", "true")
		harness.WaitTask(t, b, id)
		ids = append(ids, id)
	}
	b.Kill()
	b.Start()
	r := taskOp(t, b, "list", "--ended", "--since", "1h", "--json")
	var ts []wire.TaskInfo
	if err := json.Unmarshal([]byte(r.Stdout), &ts); err != nil {
		t.Fatalf("list --ended --json printed %q: %v", r.Stdout, err)
	}
	if len(ts) != 3 {
		t.Fatalf("list --ended: %d tasks, want 3: %+v", len(ts), ts)
	}
	for i, ti := range ts[:2] { // the two the journal no longer keeps
		if ti.ID != ids[i] || ti.State != wire.StateEnded || ti.Source != wire.SourceAccounting || ti.Ended == 0 || len(ti.Devices) != 1 {
			t.Errorf("history entry %d: %+v, want task %d ended, from the accounting log, with its device", i, ti, ids[i])
		}
	}
	if last := ts[2]; last.ID != ids[2] || last.State != wire.StateDone || last.Source != "" || last.Command != "true" {
		t.Errorf("history's last entry: %+v, want task %d done, as the broker keeps it", last, ids[2])
	}
	table := taskOp(t, b, "list", "--ended").Stdout
	var rows []string
	for _, line := range strings.Split(strings.TrimSpace(table), "\n") {
		if f := strings.Fields(line); len(f) >= 2 {
			rows = append(rows, f[0]+" "+f[1])
		}
	}
	if want := []string{"ID END", harness.IDStr(ids[0]) + " ended", harness.IDStr(ids[1]) + " ended", harness.IDStr(ids[2]) + " done"}; !slicesEqual(rows, want) {
		t.Errorf("list --ended table's first columns: %q, want %q:\n%s", rows, want, table)
	}
	if r := harness.RunTaskCmd(t, b.TaskSubmit("list", "--since", "1h")); r.Code != 2 || !strings.Contains(r.Stderr, "--since is for --ended") {
		t.Errorf("list --since without --ended: %s", r)
	}
	// --since cuts at the end: none ended in the last millisecond… but a
	// task ended now is listed with any --since.
	late := harness.SubmitTask(t, b, nil, dir, "--log", filepath.Join(dir, "log"), "--", "true")
	harness.WaitTask(t, b, late)
	r = taskOp(t, b, "list", "--ended", "--since", "1s", "--json")
	if err := json.Unmarshal([]byte(r.Stdout), &ts); err != nil || harness.FindTask(ts, late) == nil {
		t.Errorf("list --ended --since 1s lacks task %d just ended: %s", late, r.Stdout)
	}
}
