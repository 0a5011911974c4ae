package policy

import (
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
		{name: "mem without shard", conf: "[cluster]\nscheduler = \"slurm\"\nshard_mem = \"4G\"\n", err: "applies to shares = \"shard\" only"},
		{name: "unknown key", conf: "[cluster]\nscheduler = \"slurm\"\nnodes = 2\n", err: "nodes: unknown key"},
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
			if c.Cluster != tc.want {
				t.Errorf("got %+v, want %+v", c.Cluster, tc.want)
			}
		})
	}
}
