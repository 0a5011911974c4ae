package status

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// TestIdleTaskNotify: with [idle] kinds naming tasks, a task whose device
// every sample finds idle has its notify command run, as its submitter,
// with NPURUN_TASK_STATE=idle (its exit and signal empty) at the warning,
// before its lease is reclaimed; the reclaim then ends the task (its
// command SIGTERM'd: failed, 143), and the notify command runs again for
// that end.
func TestIdleTaskNotify(t *testing.T) {
	user := harness.NewUser(t) // first: removed after the broker stops
	u := newUtilFiles(t)
	u.set(0, "0")
	conf := harness.FakeConfig(1) + u.conf() + strings.Replace(idleConf, "warn_before", `kinds = ["task"]`+"\nwarn_before", 1)
	b := harness.StartBroker(t, conf)
	contained := harness.ContainedBy(t, b)
	dir := harness.UserDir(t, &user, 0o755)
	fifo := filepath.Join(dir, "notified")
	harness.MakeFIFO(t, fifo)
	// Read and write, so that the notify command's open never waits and
	// the reads never see an end.
	r, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func(what string) string {
		t.Helper()
		select {
		case l := <-lines:
			return l
		case <-time.After(harness.EventTimeout):
			t.Fatalf("the notify command did not run for %s within %s; broker log:\n%s", what, harness.EventTimeout, b.Log())
			return ""
		}
	}

	id := harness.SubmitTask(t, b, &user, dir, "-d", "0", "--log", filepath.Join(dir, "log"),
		"--notify", `echo "$NPURUN_TASK_ID $NPURUN_TASK_STATE exit=$NPURUN_TASK_EXIT signal=$NPURUN_TASK_SIGNAL $(id -u)" > notified`,
		"--", "sleep", "1000")
	harness.WaitBoard(t, b, func(x *wire.Board) bool { l := leaseOn(x, 0); return l != nil && l.Kind == wire.KindTask })

	if got, want := next("the warning"), fmt.Sprintf("%d idle exit= signal= %d", id, user.UID); got != want {
		t.Errorf("at the warning the notify command wrote %q, want %q", got, want)
	}
	b.WaitLog(0, "is reclaimed ([idle] after = 3s)")
	res := harness.WaitTask(t, b, id)
	if res.Code != 143 {
		t.Errorf("task %d reclaimed: %s, want exit status 143 (SIGTERM)", id, res)
	}
	if got, want := next("the task's end"), fmt.Sprintf("%d failed exit=143 signal=SIGTERM %d", id, user.UID); got != want {
		t.Errorf("at the task's end the notify command wrote %q, want %q", got, want)
	}
	if ti := harness.ShowTask(t, b, id); ti.State != wire.StateFailed || ti.Signal != "SIGTERM" {
		t.Errorf("task %d after the reclaim: %+v, want failed by SIGTERM", id, ti)
	}
	if contained {
		awaitGroupRemoved(t, b, id)
	}
	select {
	case l := <-lines:
		t.Errorf("the notify command ran once more: %q", l)
	default:
	}
	if n := strings.Count(b.Log(), "its holders are warned"); n != 1 {
		t.Errorf("warned %d times in the log, want once:\n%s", n, b.Log())
	}
}

// awaitGroupRemoved waits until task id's control group, where its notify
// commands run, is removed: nothing of it runs on.
func awaitGroupRemoved(t *testing.T, b *harness.Broker, id uint64) {
	t.Helper()
	harness.AwaitRemoved(t, filepath.Join(b.Cgroup, "task-"+harness.IDStr(id)))
}
