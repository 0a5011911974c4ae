package policy

import (
	"strings"

	"github.com/npurun/npurun/internal/quantity"
)

// Cluster is the [cluster] table of a login node (a node without devices,
// or a box that sends work to others): task-submit and npurun submit
// through the named scheduler instead of this machine's broker.
type Cluster struct {
	Scheduler string // SchedulerSlurm; "" when [cluster] is absent
	GRES      string // the GRES name of the nodes' devices in --gres ("gpu", "npu")
	Partition string // the partition when no --pool is given; "" for Slurm's default
	Shares    string // how --mem is asked for: SharesNone, SharesShard, SharesNpurun
	ShardMem  int64  // SharesShard: the device memory of one Slurm shard, MiB
	Bin       string // the directory of Slurm's commands; "" for $PATH
	// Boards are the nodes' npuboards ([cluster.boards] NODE = URL), which
	// status --cluster asks for each node's holders; a node with none is
	// shown from Slurm's view.
	Boards map[string]string
}

// MaxClusterBoards bounds [cluster.boards].
const MaxClusterBoards = 1024

// Schedulers and share forms of [cluster].
const (
	SchedulerSlurm = "slurm"
	// SharesNone: the nodes take whole devices only; --mem is refused.
	SharesNone = "none"
	// SharesShard: --mem is asked of Slurm as shards of one device
	// (--gres=shard:K), K = the memory over shard_mem, rounded up.
	SharesShard = "shard"
	// SharesNpurun: --mem is a share of the node's own npurun devices
	// (split mode: the devices not Slurm's, in pools with shares): the
	// job asks Slurm for no GRES, and runs its command under npurun --mem
	// on the node, whose broker grants the share.
	SharesNpurun = "npurun"
)

// Active tells whether work goes to a cluster's scheduler.
func (c Cluster) Active() bool { return c.Scheduler != "" }

// cluster reads the [cluster] table.
func (p *parser) cluster(raw map[string]any) Cluster {
	c := Cluster{GRES: DefaultSlurmGRES, Shares: SharesNone}
	table := []string{"cluster"}
	t, ok := p.table(nil, raw, "cluster")
	if !ok {
		return Cluster{}
	}
	p.unknown(table, t, "scheduler", "gres_name", "partition", "shares", "shard_mem", "slurm_bin", "boards")
	if v, ok := p.str(table, t, "scheduler"); ok {
		if v == SchedulerSlurm {
			c.Scheduler = v
		} else {
			p.errorf(table, "scheduler", "unknown scheduler %q (want %q)", v, SchedulerSlurm)
		}
	} else if _, present := t["scheduler"]; !present {
		p.errorf(table, "", "names no scheduler: give scheduler = %q", SchedulerSlurm)
	}
	for _, f := range []struct {
		key string
		out *string
	}{{"gres_name", &c.GRES}, {"partition", &c.Partition}} {
		if v, ok := p.str(table, t, f.key); ok {
			if !slurmName.MatchString(v) || len(v) > 256 {
				p.errorf(table, f.key, "bad name %q (letters, digits, _, . and -)", v)
			} else {
				*f.out = v
			}
		}
	}
	if v, ok := p.str(table, t, "shares"); ok {
		if v == SharesNone || v == SharesShard || v == SharesNpurun {
			c.Shares = v
		} else {
			p.errorf(table, "shares", "unknown share form %q (want %q, %q or %q)", v, SharesNone, SharesShard, SharesNpurun)
		}
	}
	if v, ok := p.str(table, t, "shard_mem"); ok {
		mib, err := quantity.ParseSize(v)
		switch {
		case err != nil:
			p.errorf(table, "shard_mem", "bad size %q: %v", v, err)
		case mib <= 0:
			p.errorf(table, "shard_mem", "must be positive")
		default:
			c.ShardMem = mib
		}
	}
	switch _, set := t["shard_mem"]; {
	case c.Shares == SharesShard && !set:
		p.errorf(table, "shares", "shares = %q needs shard_mem, the device memory of one shard (e.g. \"4G\")", SharesShard)
	case c.Shares != SharesShard && set:
		p.errorf(table, "shard_mem", "applies to shares = %q only", SharesShard)
	}
	if v, ok := p.absPath(table, t, "slurm_bin"); ok {
		c.Bin = v
	}
	if bt, ok := p.table(table, t, "boards"); ok {
		btable := []string{"cluster", "boards"}
		if len(bt) > MaxClusterBoards {
			p.errorf(table, "boards", "at most %d nodes, not %d", MaxClusterBoards, len(bt))
			return c
		}
		c.Boards = map[string]string{}
		for node := range bt {
			u, ok := p.str(btable, bt, node)
			switch {
			case !ok:
			case !slurmName.MatchString(node) || len(node) > 256:
				p.errorf(btable, node, "bad node name %q (letters, digits, _, . and -)", node)
			case !BoardURL(u):
				p.errorf(btable, node, "want the URL of the node's npuboard such as \"http://%s:9401\", not %q", node, u)
			default:
				c.Boards[node] = strings.TrimSuffix(u, "/")
			}
		}
	}
	return c
}
