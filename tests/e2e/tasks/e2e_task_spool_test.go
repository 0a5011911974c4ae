package tasks

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// TestTaskSpoolKill9: a burst of 1000 acknowledged submissions, with the
// broker killed with SIGKILL midway and restarted, runs every acknowledged
// task exactly once: each task creates a marker named by its id with
// O_EXCL (a second run finds it and says so), and none is missing. A
// submission that got no acknowledgement may or may not have become a
// task, but runs at most once too.
func TestTaskSpoolKill9(t *testing.T) {
	const (
		total   = 1000
		workers = 8
		killAt  = 300 // acknowledgements before the kill
	)
	// One user's 1000 tasks are all kept to be counted: more than the
	// default of ended tasks kept per user.
	// Supervisors of the same program that were there before are not
	// this test's (a parallel test's, one an earlier test left).
	before := busySupervisors(harness.Bins(t))
	b := harness.StartBroker(t, harness.TaskConfig(1)+"keep_ended_per_user = 2000\n")
	dir := t.TempDir()
	markers, logs := filepath.Join(dir, "markers"), filepath.Join(dir, "logs")
	for _, d := range []string{markers, logs} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// set -C: the redirection opens with O_EXCL.
	script := `set -C; : > "$1/$NPURUN_TASK_ID" || { echo "$$" >> "$1/DOUBLE.$NPURUN_TASK_ID"; exit 3; }`
	logOf := func(n int64) string { return filepath.Join(logs, fmt.Sprintf("s%d.log", n)) }

	var (
		slots    atomic.Int64 // acknowledgements reserved
		attempts atomic.Int64 // submissions sent, numbering their logs
		killed   atomic.Bool
		mu       sync.Mutex
		acked    = map[uint64]int64{} // id → submission number
		errored  = map[int64]error{}  // submission number → error
	)
	reachedKill := make(chan struct{})
	restarted := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			failures := 0
			// redial waits for the broker to be back after the kill; an error
			// before the kill, or many after the restart, is a failure.
			redial := func(err error) bool {
				if !killed.Load() {
					t.Errorf("submission failed before the broker was killed: %v", err)
					return false
				}
				if failures++; failures > 100 {
					t.Errorf("submissions keep failing after the restart: %v", err)
					return false
				}
				select {
				case <-restarted:
					return true
				case <-time.After(2 * harness.EventTimeout):
					t.Errorf("broker not back: %v", err)
					return false
				}
			}
			for slots.Load() < total {
				c, err := wire.Dial(b.Socket)
				if err != nil {
					if !redial(err) {
						return
					}
					continue
				}
				for {
					if slots.Add(1) > total {
						slots.Add(-1)
						c.Close()
						return
					}
					n := attempts.Add(1)
					sub := wire.Submission{
						Argv: []string{"sh", "-c", script, "sh", markers}, Cwd: dir,
						Env: []string{"PATH=/usr/bin:/bin"}, NoDevice: true, Log: logOf(n),
					}
					r, err := c.Submit(&sub)
					if err != nil {
						slots.Add(-1)
						mu.Lock()
						errored[n] = err
						mu.Unlock()
						c.Close()
						if !redial(err) {
							return
						}
						break
					}
					mu.Lock()
					if prev, dup := acked[r.ID]; dup {
						t.Errorf("id %d acknowledged twice: submissions %d and %d", r.ID, prev, n)
					}
					acked[r.ID] = n
					if len(acked) == killAt {
						close(reachedKill)
					}
					mu.Unlock()
				}
			}
		}()
	}
	select {
	case <-reachedKill:
	case <-time.After(2 * harness.EventTimeout):
		t.Fatalf("%d acknowledgements within %s", killAt, 2*harness.EventTimeout)
	}
	killed.Store(true)
	b.Kill()
	b.Start()
	close(restarted)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	mu.Lock()
	defer mu.Unlock()
	if len(acked) != total {
		t.Fatalf("%d acknowledgements, want %d", len(acked), total)
	}
	t.Logf("%d acknowledged, %d submissions failed at the kill", len(acked), len(errored))

	// Every task the broker holds, acknowledged or not, runs to its end;
	// wait for each (a wait answers at once for an ended task).
	c := b.Dial()
	var all []wire.TaskInfo
	gotList := make(chan error, 1)
	go func() {
		var err error
		all, err = c.List(false)
		gotList <- err
	}()
	select {
	case err := <-gotList:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(harness.EventTimeout):
		b.Signal(syscall.SIGQUIT) // its goroutines, in the log
		t.Fatalf("list got no answer within %s", harness.EventTimeout)
	}
	done := make(chan error, 1)
	go func() {
		for _, ti := range all {
			if _, err := c.Wait(ti.ID); err != nil {
				done <- fmt.Errorf("wait %d: %w", ti.ID, err)
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the %d tasks did not all end within 60s", len(all))
	}

	// A task the broker gave up as lost may still be run by its
	// supervisor: wait for those supervisors to be gone before counting
	// markers. Every end has been acknowledged, and nothing waits: no
	// supervisor of this broker's is left but the idle ones, which have
	// no task (an idle one given a task has no id on its command line, so
	// they are waited for all together).
	for _, pid := range busySupervisors(b.Bin) {
		if slices.Contains(before, pid) {
			continue
		}
		if !harness.ProcGone(t, pid, "") {
			st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			t.Errorf("supervisor %d (%q) is left after every task ended", pid, st)
		}
	}
	t.Logf("tasks adopted at the restart: %d", strings.Count(b.Log(), "is still running"))

	r := harness.RunTaskCmd(t, b.TaskSubmit("list", "--json"))
	if r.Code != 0 {
		t.Fatalf("list: %s", r)
	}
	var listed []wire.TaskInfo
	if err := json.Unmarshal([]byte(r.Stdout), &listed); err != nil {
		t.Fatal(err)
	}
	ran := map[uint64]bool{}
	ents, err := os.ReadDir(markers)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "DOUBLE.") {
			t.Errorf("task %s ran more than once (pids %q)", strings.TrimPrefix(e.Name(), "DOUBLE."), readFile(filepath.Join(markers, e.Name())))
			continue
		}
		id, err := strconv.ParseUint(e.Name(), 10, 64)
		if err != nil {
			t.Errorf("stray marker %q", e.Name())
		}
		ran[id] = true
	}

	seen := map[uint64]int{}
	byLog := map[string]uint64{}
	unacked, neverRan := 0, 0
	for _, ti := range listed {
		seen[ti.ID]++
		if prev, dup := byLog[ti.Log]; dup {
			t.Errorf("tasks %d and %d are the same submission (log %s)", prev, ti.ID, ti.Log)
		}
		byLog[ti.Log] = ti.ID
		n, ok := acked[ti.ID]
		switch {
		case ok && ti.Log != logOf(n):
			t.Errorf("task %d has log %s, but was acknowledged for submission %d", ti.ID, ti.Log, n)
		case !ok:
			unacked++
			num, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(ti.Log), "s"), ".log"), 10, 64)
			if _, failed := errored[num]; !failed {
				t.Errorf("task %d (log %s) is no submission that was sent", ti.ID, ti.Log)
			}
		}
		switch {
		case ti.State == wire.StateDone && ran[ti.ID]:
		case ti.State == wire.StateLost && !ran[ti.ID] && strings.Contains(ti.Reason, "gone when the broker restarted"):
			// Started but never run: the supervisor died with the broker
			// before it got its spec. At most once allows this.
			neverRan++
			t.Logf("task %d: lost before it ran (%s)", ti.ID, ti.Reason)
		case ran[ti.ID]:
			t.Errorf("task %d ran, but ended %s (exit %v, %q)", ti.ID, ti.State, ti.Exit, ti.Reason)
		default:
			t.Errorf("task %d never ran: %s (%q)", ti.ID, ti.State, ti.Reason)
		}
	}
	for id := range acked {
		if seen[id] != 1 {
			t.Errorf("acknowledged task %d is listed %d times", id, seen[id])
		}
	}
	for id := range ran {
		if seen[id] == 0 {
			t.Errorf("task %d ran, but is not listed", id)
		}
	}
	if unacked > len(errored) {
		t.Errorf("%d tasks were never acknowledged, more than the %d failed submissions", unacked, len(errored))
	}
	if neverRan > 4 { // the CPU slots: only tasks being started when the broker died
		t.Errorf("%d tasks lost before they ran, more than could be starting at once", neverRan)
	}
}
