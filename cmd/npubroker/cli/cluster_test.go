package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/wire"
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

// TestClusterBoardFromBoards: a node whose npuboard answered is shown as
// its broker's table (holder, pid, command); one whose board did not is
// shown from Slurm, saying so.
func TestClusterBoardFromBoards(t *testing.T) {
	now := time.Date(2026, 12, 7, 14, 0, 0, 0, time.UTC)
	st := &wire.Board{Time: now.UnixMilli(), Devices: []wire.DeviceState{
		{ID: 0, Name: "gpu0", State: "leased", Since: now.Add(-time.Minute).UnixMilli(), Lease: &wire.LeaseInfo{ID: 3, Kind: wire.KindSlurm, User: "alice", UID: 1000, SlurmJob: 7,
			Holders: []wire.Holder{{PID: 4242, User: "alice", UID: 1000, Command: "python train.py"}}}},
		{ID: 1, Name: "gpu1", State: "free"},
	}}
	b := &ClusterBoard{Time: now.UnixMilli(),
		Nodes: []ClusterNode{
			{Name: "n1", State: "mixed", From: "board", Board: "http://n1:9401", Status: st, Devices: []ClusterDevice{{Index: 0, Job: 7, User: "alice"}, {Index: 1}}},
			{Name: "n2", State: "idle", From: "slurm", Board: "http://n2:9401", BoardDown: "no answer within 2s", Devices: []ClusterDevice{{Index: 0}}},
		},
	}
	var out strings.Builder
	if err := writeClusterBoard(Env{Stdout: &out, Getenv: func(string) string { return "" }}, b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"n2    0       free",
		"n2: board down, from Slurm (http://n2:9401: no answer within 2s)",
		"n1: mixed, from its board (http://n1:9401)",
		"gpu0    -     job 7  alice  4242  python train.py",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no line %q in:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "n1    0") {
		t.Errorf("n1 shown from Slurm too:\n%s", out.String())
	}
}
