package cli

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/cluster"
	"github.com/npurun/npurun/shim"
	"github.com/npurun/npurun/wire"
)

// TestTaskOf: Slurm's jobs read as tasks, their ends as a box's.
func TestTaskOf(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		job   cluster.Job
		state string
		wait  int
		end   string
	}{
		{cluster.Job{State: "COMPLETED", Status: 0, Started: now, Ended: now, Node: "n1"}, wire.StateDone, 0, "succeeded"},
		{cluster.Job{State: "FAILED", Reason: "NonZeroExitCode", Status: 3 << 8, Started: now, Ended: now, Node: "n1"}, wire.StateFailed, 3, "failed: exit 3"},
		{cluster.Job{State: "FAILED", Status: 9, Started: now, Ended: now, Node: "n1"}, wire.StateFailed, 137, "failed: killed by SIGKILL"},
		{cluster.Job{State: "CANCELLED", Status: 15, Started: now, Ended: now, Node: "n1"}, wire.StateCancelled, 143, "cancelled (killed by SIGTERM)"},
		{cluster.Job{State: "TIMEOUT", Status: 15, Started: now, Ended: now, Node: "n1"}, wire.StateFailed, 143, "failed: killed by SIGTERM (timeout)"},
		{cluster.Job{State: "NODE_FAIL", Started: now, Ended: now, Node: "n2"}, wire.StateLost, 1, "lost (node failure)"},
		{cluster.Job{State: "CANCELLED", Submitted: now, Ended: now}, wire.StateCancelled, 1, "cancelled"},
	} {
		ct := taskOf(&tc.job)
		if ct.State != tc.state || waitStatus(&ct.TaskInfo) != tc.wait || describeEnd(&ct.TaskInfo) != tc.end {
			t.Errorf("%s %d: %s, wait %d, %q; want %s, %d, %q", tc.job.State, tc.job.Status, ct.State, waitStatus(&ct.TaskInfo), describeEnd(&ct.TaskInfo), tc.state, tc.wait, tc.end)
		}
	}
	ct := taskOf(&cluster.Job{State: "PENDING", Reason: "Dependency", GRES: "gpu:2"})
	if ct.State != wire.StateBlocked || ct.N != 2 || ct.Reason != "Dependency" {
		t.Errorf("a job waiting for another: %+v", ct)
	}
}

// TestClusterTable: list's table through Slurm, the box's formatter with
// NODE and SINCE, the estimated start and reason after a waiting task.
func TestClusterTable(t *testing.T) {
	now := time.Date(2026, 12, 7, 14, 0, 0, 0, time.Local)
	run := taskOf(&cluster.Job{ID: 48213, User: "alice", State: "RUNNING", Node: "box2", Devices: []int{1, 3}, GRES: "gpu:2",
		Command: "python train.py", Submitted: now.Add(-3 * time.Minute), Started: now.Add(-2 * time.Minute)})
	wait := taskOf(&cluster.Job{ID: 48214, User: "alice", State: "PENDING", Reason: "Priority", GRES: "gpu:1",
		Command: "python eval.py", Submitted: now.Add(-time.Minute)})
	wait.Start = now.Add(5 * time.Minute).UnixMilli()
	var b strings.Builder
	if err := writeClusterTable(&b, []clusterTask{run, wait}, now); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"ID     USER   STATE    NODE  DEVICES   SINCE  NAME/COMMAND",
		"48213  alice  running  box2  1,3       2m     python train.py",
		"48214  alice  pending  -     1 wanted  1m     python eval.py   (est. start 14:05:00, Priority)",
	}
	if got := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n"); !slices.Equal(got, want) {
		t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestParseSrun(t *testing.T) {
	o, err := parseSrun([]string{"-n", "2", "-p", "big", "-m", "4096M", "--time", "1m30s", "--timeout", "90s", "-v", "--", "python", "x.py"})
	if err != nil || o.req.N != 2 || o.req.Pool != "big" || o.req.Mem != 4096 || o.req.TimeSec != 90 || o.timeout != 90*time.Second || !o.verbose || !slices.Equal(o.argv, []string{"python", "x.py"}) {
		t.Errorf("got %+v, %v", o, err)
	}
	if o, err := parseSrun([]string{"--no-device", "--", "true"}); err != nil || o.req.N != 0 {
		t.Errorf("--no-device: %+v, %v", o, err)
	}
	for _, bad := range [][]string{{"-n"}, {"--"}, {"-x", "--", "true"}, {"-n", "2"}} {
		if _, err := parseSrun(bad); err == nil {
			t.Errorf("%q taken", bad)
		}
	}
}

// TestSrunArgsRoundTrip: what npurun on a login node writes
// (shim.ClusterArgs) __npurun reads back whole (parseSrun): every option
// npurun passes on, --time included.
func TestSrunArgsRoundTrip(t *testing.T) {
	o := shim.Options{N: 3, Pool: "big", Mem: 2048, Time: 90 * time.Second, Timeout: 2 * time.Minute, Verbose: true}
	args := shim.ClusterArgs(o, []string{"python", "x.py"})
	if len(args) < 2 || args[0] != "task-submit" || args[1] != "__npurun" {
		t.Fatalf("npurun becomes %q", args)
	}
	got, err := parseSrun(args[2:])
	if err != nil {
		t.Fatalf("__npurun refuses %q: %v", args, err)
	}
	if got.req.N != 3 || got.req.Pool != "big" || got.req.Mem != 2048 || got.req.TimeSec != 90 || got.timeout != 2*time.Minute || !got.verbose || !slices.Equal(got.argv, []string{"python", "x.py"}) {
		t.Errorf("%q read back as %+v", args, got)
	}
}
