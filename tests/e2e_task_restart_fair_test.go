package tests

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/npurun/npurun/broker/client"
)

// TestTaskRestartInterleaves: pending tasks of two users that survive a
// broker restart start interleaved across the users, as they would have
// without the restart: the restarted broker puts every task back in line
// before it starts any, so the user whose tasks were submitted first does
// not take every free device.
func TestTaskRestartInterleaves(t *testing.T) {
	a, bu := newUser(t), newUser(t)
	b := StartBroker(t, taskConfig(2))
	adir, bdir := userDir(t, &a, 0o755), userDir(t, &bu, 0o755)
	// Both devices held: every task waits.
	h := hold(t, b, "holder", "-n", "2")
	owner := map[uint64]string{}
	var ids []uint64
	for _, s := range []struct {
		u   *testUser
		dir string
	}{{&a, adir}, {&a, adir}, {&a, adir}, {&bu, bdir}, {&bu, bdir}, {&bu, bdir}} {
		id := submitTask(t, b, s.u, s.dir, "--log", filepath.Join(s.dir, idStr(uint64(len(ids)))+".log"), "--", "sleep", "600")
		owner[id] = s.u.Name
		ids = append(ids, id)
	}
	t.Cleanup(func() {
		for _, id := range ids {
			runTaskCmd(t, b.TaskSubmit("cancel", idStr(id)))
		}
		for _, id := range ids {
			waitTask(t, b, id)
		}
	})
	// The devices are freed while no broker runs: the restarted broker
	// finds them free as it takes up the waiting tasks.
	b.Kill()
	h.release()
	b.Start()

	var started []uint64
	for _, ti := range listTasks(t, b, nil, true) {
		if slices.Contains(ids, ti.ID) && ti.State == client.StateRunning {
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
