package tasks

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// oomScript is a task that runs out of device memory on its first run
// (after writing its pid to $2 and reading a line from $3, if they are
// given), and on its retry appends a line to $1/retried.
const oomScript = `if [ -e "$1/ran" ]; then echo retry >> "$1/retried"; exit 0; fi
touch "$1/ran"
if [ -n "$2" ]; then echo $$ > "$2"; read x < "$3"; fi
echo "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB" >&2; exit 1`

// retryOf waits for the retry of task id, which ran out of device memory,
// and checks that there is exactly one, run exactly once (its own count).
func checkOneRetry(t *testing.T, b *harness.Broker, id uint64, dir string) {
	t.Helper()
	var retries []uint64
	for _, ti := range harness.ListTasks(t, b, nil, true) {
		if ti.RetryOf == id {
			retries = append(retries, ti.ID)
		}
	}
	if len(retries) != 1 {
		t.Fatalf("task %d ran out of device memory with a retry left: %d retries %v, want 1\n%s", id, len(retries), retries, b.Log())
	}
	if r := harness.WaitTask(t, b, retries[0]); r.Code != 0 {
		t.Fatalf("retry %d: %s", retries[0], r)
	}
	data, _ := os.ReadFile(filepath.Join(dir, "retried"))
	if string(data) != "retry\n" {
		t.Errorf("the retry of task %d ran %d times, want once", id, strings.Count(string(data), "retry\n"))
	}
	if first := harness.ShowTask(t, b, id); first.State != "failed" || first.Reason != "out of device memory: retried with --mem 10G" {
		t.Errorf("task %d: %s, %q; want failed, retried with --mem 10G", id, first.State, first.Reason)
	}
	if b.Pid() == 0 || strings.Contains(b.Log(), "panic:") {
		t.Errorf("the broker did not survive:\n%s", b.Log())
	}
}

// TestTaskOOMRetryAdopted: a task with an out-of-memory retry left, running
// while the broker is killed with -9, is adopted by the next broker; when
// it then ends out of device memory, that broker submits its retry, which
// runs once. The adopted task had no account, and the retry's submission
// panicked the broker on a nil one (issue 27.8).
func TestTaskOOMRetryAdopted(t *testing.T) {
	b := harness.StartBroker(t, harness.ShareConfig(1, "16G"))
	dir := harness.SharedDir(t)
	pidFIFO, goFIFO := filepath.Join(dir, "pid"), filepath.Join(dir, "go")
	harness.MakeFIFO(t, pidFIFO)
	harness.MakeFIFO(t, goFIFO)
	id := harness.SubmitTask(t, b, nil, dir, "--mem", "8G", "--oom-retries", "1", "--log", filepath.Join(dir, "log"),
		"--", "sh", "-c", oomScript, "sh", dir, pidFIFO, goFIFO)
	if _, err := os.ReadFile(pidFIFO); err != nil { // returns once the task runs
		t.Fatal(err)
	}
	b.Kill()
	at := b.LogLen()
	b.Start()
	b.WaitLog(at, fmt.Sprintf("task %d is still running", id))
	harness.OpenFIFO(t, goFIFO, os.O_WRONLY).Close() // the task reads EOF and runs out of memory
	if r := harness.WaitTask(t, b, id); r.Code == 0 {
		t.Fatalf("task %d: %s; want it failed", id, r)
	}
	checkOneRetry(t, b, id, dir)
}

// TestTaskOOMRetryKilledAfterEnd: a broker killed with -9 right after it
// recorded the end of a task that ran out of device memory (stopped there
// by a test hook) loses no retry: the retry is in the end's own record,
// and the next broker's replay puts it in line, once. The retry was
// submitted after the end, in another record, and lost (issue 27.8).
func TestTaskOOMRetryKilledAfterEnd(t *testing.T) {
	b := harness.NewBroker(t, harness.ShareConfig(1, "16G"), "NPUBROKER_TEST_HOOK=after-end")
	b.Start()
	dir := harness.SharedDir(t)
	id := harness.SubmitTask(t, b, nil, dir, "--mem", "8G", "--oom-retries", "1", "--log", filepath.Join(dir, "log"),
		"--", "sh", "-c", oomScript, "sh", dir)
	b.WaitLog(0, fmt.Sprintf("test hook after-end: task %d stops here", id))
	b.Kill()
	b.ExtraEnv = harness.WithoutHook(b.ExtraEnv)
	b.Start()
	checkOneRetry(t, b, id, dir)
}
