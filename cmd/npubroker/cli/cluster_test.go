package cli

import (
	"strings"
	"testing"
	"time"
)

func TestGresCount(t *testing.T) {
	for gres, want := range map[string]int{"gpu:4": 4, "gpu:910b:8(S:0)": 8, "shard:8,gpu:2": 2, "npu:4": 0, "": 0, "gpu:x": 0} {
		if got := gresCount(gres, "gpu"); got != want {
			t.Errorf("gresCount(%q) = %d, want %d", gres, got, want)
		}
	}
}

// TestClusterBoardTable: a down node's devices say so, a held one names
// its job, the line and the users follow.
func TestClusterBoardTable(t *testing.T) {
	now := time.Date(2026, 12, 7, 14, 0, 0, 0, time.UTC)
	b := &ClusterBoard{Time: now.UnixMilli(),
		Nodes: []ClusterNode{
			{Name: "n1", State: "mixed", Devices: []ClusterDevice{{Index: 0, Job: 7, User: "alice", Since: now.Add(-2 * time.Minute).UnixMilli(), Command: "python train.py"}, {Index: 1}}},
			{Name: "n2", State: "down*", Down: true, Reason: "Not responding", Devices: []ClusterDevice{{Index: 0}}},
		},
		Line:  []ClusterWaiting{{Job: 8, User: "bob", Partition: "npu", Place: 1, Devices: "gpu:2", Reason: "Resources", Submitted: now.Add(-time.Minute).UnixMilli(), Command: "python eval.py"}},
		Users: []ClusterUserSummary{{User: "alice", Devices: 1, Running: 1}, {User: "bob", Waiting: 1}},
	}
	var out strings.Builder
	if err := writeClusterBoard(Env{Stdout: &out}, b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"n1    0       held   7    alice  2m     python train.py",
		"n1    1       free",
		"n2    0       down   -    -      -      Not responding",
		"1st   8    bob   npu        gpu:2  1m       -      python eval.py (Resources)",
		"alice  1        1        0",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no line %q in:\n%s", want, out.String())
		}
	}
}
