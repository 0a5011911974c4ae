package policy

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseCluster(t *testing.T) {
	for _, tc := range []struct {
		name, conf string
		want       Cluster
		err        string
	}{
		{name: "absent", conf: "", want: Cluster{}},
		{name: "slurm", conf: "[cluster]\nscheduler = \"slurm\"\n",
			want: Cluster{Scheduler: "slurm", GRES: "gpu", Shares: "none"}},
		{name: "all", conf: "[cluster]\nscheduler = \"slurm\"\ngres_name = \"npu\"\npartition = \"npu\"\nshares = \"shard\"\nshard_mem = \"4G\"\nslurm_bin = \"/opt/slurm/bin\"\n",
			want: Cluster{Scheduler: "slurm", GRES: "npu", Partition: "npu", Shares: "shard", ShardMem: 4096, Bin: "/opt/slurm/bin"}},
		{name: "no scheduler", conf: "[cluster]\ngres_name = \"npu\"\n", err: "npurun.conf:1: [cluster]: names no scheduler"},
		{name: "unknown scheduler", conf: "[cluster]\nscheduler = \"pbs\"\n", err: `scheduler: unknown scheduler "pbs"`},
		{name: "bad gres", conf: "[cluster]\nscheduler = \"slurm\"\ngres_name = \"-x\"\n", err: `gres_name: bad name "-x"`},
		{name: "shard without mem", conf: "[cluster]\nscheduler = \"slurm\"\nshares = \"shard\"\n", err: "needs shard_mem"},
		{name: "npurun shares", conf: "[cluster]\nscheduler = \"slurm\"\nshares = \"npurun\"\n",
			want: Cluster{Scheduler: "slurm", GRES: "gpu", Shares: "npurun"}},
		{name: "npurun shares with shard_mem", conf: "[cluster]\nscheduler = \"slurm\"\nshares = \"npurun\"\nshard_mem = \"4G\"\n", err: "applies to shares = \"shard\" only"},
		{name: "unknown shares", conf: "[cluster]\nscheduler = \"slurm\"\nshares = \"mps\"\n", err: `unknown share form "mps" (want "none", "shard" or "npurun")`},
		{name: "mem without shard", conf: "[cluster]\nscheduler = \"slurm\"\nshard_mem = \"4G\"\n", err: "applies to shares = \"shard\" only"},
		{name: "unknown key", conf: "[cluster]\nscheduler = \"slurm\"\nnodes = 2\n", err: "nodes: unknown key"},
		{name: "boards", conf: "[cluster]\nscheduler = \"slurm\"\n[cluster.boards]\nn1 = \"http://n1:9401/\"\n\"gpu-2\" = \"https://gpu-2.lab:9401\"\n",
			want: Cluster{Scheduler: "slurm", GRES: "gpu", Shares: "none", Boards: map[string]string{"n1": "http://n1:9401", "gpu-2": "https://gpu-2.lab:9401"}}},
		{name: "board not a URL", conf: "[cluster]\nscheduler = \"slurm\"\n[cluster.boards]\nn1 = \"n1:9401\"\n", err: `npurun.conf:4: [cluster.boards] n1: want the URL of the node's npuboard such as "http://n1:9401", not "n1:9401"`},
		{name: "board with a path", conf: "[cluster]\nscheduler = \"slurm\"\n[cluster.boards]\nn1 = \"http://n1:9401/api/status\"\n", err: `[cluster.boards] n1: want the URL`},
		{name: "board not a string", conf: "[cluster]\nscheduler = \"slurm\"\n[cluster.boards]\nn1 = 9401\n", err: `[cluster.boards] n1: must be a string`},
		{name: "boards not a table", conf: "[cluster]\nscheduler = \"slurm\"\nboards = [\"http://n1:9401\"]\n", err: `[cluster] boards: must be a table`},
		{name: "board of a bad node name", conf: "[cluster]\nscheduler = \"slurm\"\n[cluster.boards]\n\"n 1\" = \"http://n1:9401\"\n", err: `bad node name "n 1"`},
		{name: "relative bin", conf: "[cluster]\nscheduler = \"slurm\"\nslurm_bin = \"bin\"\n", err: "must be an absolute path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse("npurun.conf", []byte(tc.conf))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(c.Cluster, tc.want) {
				t.Errorf("got %+v, want %+v", c.Cluster, tc.want)
			}
		})
	}
}
