package tasks

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// TestTaskRestartInterleaves: pending tasks of two users that survive a
// broker restart start interleaved across the users, as they would have
// without the restart: the restarted broker puts every task back in line
// before it starts any, so the user whose tasks were submitted first does
// not take every free device.
func TestTaskRestartInterleaves(t *testing.T) {
	a, bu := harness.NewUser(t), harness.NewUser(t)
	b := harness.StartBroker(t, harness.TaskConfig(2))
	adir, bdir := harness.UserDir(t, &a, 0o755), harness.UserDir(t, &bu, 0o755)
	// Both devices held: every task waits.
	h := harness.Hold(t, b, "holder", "-n", "2")
	owner := map[uint64]string{}
	var ids []uint64
	for _, s := range []struct {
		u   *harness.TestUser
		dir string
	}{{&a, adir}, {&a, adir}, {&a, adir}, {&bu, bdir}, {&bu, bdir}, {&bu, bdir}} {
		id := harness.SubmitTask(t, b, s.u, s.dir, "--log", filepath.Join(s.dir, harness.IDStr(uint64(len(ids)))+".log"), "--", "sleep", "600")
		owner[id] = s.u.Name
		ids = append(ids, id)
	}
	t.Cleanup(func() {
		for _, id := range ids {
			harness.RunTaskCmd(t, b.TaskSubmit("cancel", harness.IDStr(id)))
		}
		for _, id := range ids {
			harness.WaitTask(t, b, id)
		}
	})
	// The devices are freed while no broker runs: the restarted broker
	// finds them free as it takes up the waiting tasks.
	b.Kill()
	h.Release()
	b.Start()

	var started []uint64
	for _, ti := range harness.ListTasks(t, b, nil, true) {
		if slices.Contains(ids, ti.ID) && ti.State == wire.StateRunning {
			started = append(started, ti.ID)
		}
	}
	slices.Sort(started)
	// In line: a's first, b's first, a's second, …; two devices free.
	if want := []uint64{ids[0], ids[3]}; !slices.Equal(started, want) {
		var whose []string
		for _, id := range started {
			whose = append(whose, owner[id])
		}
		t.Errorf("after the restart tasks %v (of %v) run, want %v: one of each user's (%s, %s)", started, whose, want, a.Name, bu.Name)
	}
}

// TestTaskLostAtRestartReapedOnce: a task whose supervisor is gone when
// the broker restarts is lost, and its control group is reaped once, by
// its end: the restart's sweep of ended tasks' groups, which comes after,
// must not reap it again. A group the test makes below the task's (root
// may) keeps it from being removed, so the reaping says that it goes on
// trying: once per reaper.
func TestTaskLostAtRestartReapedOnce(t *testing.T) {
	u := harness.ContainUser(t)
	b := harness.StartBroker(t, harness.TaskConfig(1))
	if !harness.ContainedBy(t, b) {
		t.Skip("no control groups for tasks on this machine")
	}
	id, pid := harness.SleepingTask(t, b, u)
	sup := findSupervisor(t, b, id)
	group := filepath.Join(b.Cgroup, "task-"+harness.IDStr(id))
	b.Kill()
	// Everything of the task is killed while no broker runs.
	if err := os.WriteFile(filepath.Join(group, "cgroup.kill"), []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	if !harness.ProcGone(t, sup, "") || !harness.ProcGone(t, pid, "") {
		t.Fatalf("task %d's supervisor %d or command %d outlived its group's kill", id, sup, pid)
	}
	hold := filepath.Join(group, "hold")
	if err := os.Mkdir(hold, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Rmdir(hold) })
	mark := b.LogLen()
	b.Start()
	line := fmt.Sprintf("processes are still dying in control group %s;", group)
	b.WaitLog(mark, line)
	if ti := harness.ShowTask(t, b, id); ti.State != wire.StateLost {
		t.Errorf("task %d after the restart: %s (%s), want lost", id, ti.State, ti.Reason)
	}
	if err := syscall.Rmdir(hold); err != nil {
		t.Fatal(err)
	}
	harness.AwaitRemoved(t, group)
	b.Stop() // its log is complete
	if n := strings.Count(b.Log()[mark:], line); n != 1 {
		t.Errorf("task %d's group was reaped %d times after the restart, want once; log:\n%s", id, n, b.Log()[mark:])
	}
}
