package policy

import (
	"reflect"
	"slices"
)

// NeedsRestart names what differs between c, the configuration a broker
// runs with, and n, one it is asked to reload, that a running broker
// cannot take up: the device list ([devices] vendor, ids, dev_dir,
// npu_smi: the lock files, the watchers
// and the device claims are made at start), the state directory and what
// was set up in it or beside it ([tasks] state_dir, cgroup, cpu_slots,
// keep_ended, keep_ended_per_user; [usage]), the metrics endpoint
// ([broker] metrics_listen), a Slurm node's [slurm] and, there, its
// [pools] (Slurm's devices and the line's are split at start). Each is
// named as the file names it ("[devices] ids"); none: n may be taken up.
// The socket and the run directory are command-line options, not the
// file's, and never change. Everything else is reloaded: the pools,
// [limits], [user.NAME], [group.NAME], [restrict], [status] (util_interval
// from the next sample), [idle], [devices]
// health_interval, nvidia_smi, fake_health and fake_util (from the health
// checks' and the utilization's next round), [broker] max_connections, max_waiting_per_user and default_pool, [tasks]
// time_limit, max_time, max_tasks, kill_grace, cpu_threads,
// idle_priority, [containers] (npurun-runtime's, read by it), [scheduling] and
// [share] over_declared.
func (c *Config) NeedsRestart(n *Config) []string {
	var out []string
	diff := func(name string, a, b any) {
		if !reflect.DeepEqual(a, b) {
			out = append(out, name)
		}
	}
	diff("[devices] vendor", c.Vendor, n.Vendor)
	diff("[devices] ids", c.IDs, n.IDs)
	diff("[devices] dev_dir", c.DevDir, n.DevDir)
	diff("[devices] npu_smi", c.NPUSmi, n.NPUSmi)
	diff("[tasks] state_dir", c.Tasks.StateDir, n.Tasks.StateDir)
	diff("[tasks] cgroup", c.Tasks.Cgroup, n.Tasks.Cgroup)
	diff("[tasks] cpu_slots", c.Tasks.CPUSlots, n.Tasks.CPUSlots)
	diff("[tasks] keep_ended", c.Tasks.KeepEnded, n.Tasks.KeepEnded)
	diff("[tasks] keep_ended_per_user", c.Tasks.KeepEndedPer, n.Tasks.KeepEndedPer)
	diff("[broker] metrics_listen", c.MetricsListen, n.MetricsListen)
	diff("[usage]", c.Usage, n.Usage)
	diff("[slurm]", c.Slurm, n.Slurm)
	// Which devices hold shares, and how much, is the lease table's from
	// its start; over_declared is read as it acts.
	diff("[share] pools, capacity, capacities, margin", []any{c.Share.Pools, c.Share.Capacity, c.Share.Capacities, c.Share.Margin},
		[]any{n.Share.Pools, n.Share.Capacity, n.Share.Capacities, n.Share.Margin})
	if c.Slurm.Active() && !slices.EqualFunc(c.Pools, n.Pools, func(a, b Pool) bool { return a.Name == b.Name && slices.Equal(a.IDs, b.IDs) }) {
		out = append(out, "[pools] (on a Slurm node)")
	}
	return out
}

// Changed names the tables of n that differ from c's, as the file names
// them ("[limits]", "[user.NAME]"): what a reload of n changes.
func (c *Config) Changed(n *Config) []string {
	var out []string
	diff := func(name string, a, b any) {
		if !reflect.DeepEqual(a, b) {
			out = append(out, name)
		}
	}
	diff("[devices]", []any{c.Vendor, c.IDs, c.DevDir, c.NPUSmi, c.NVIDIASmi, c.HealthInterval, c.FakeHealth, c.FakeUtil},
		[]any{n.Vendor, n.IDs, n.DevDir, n.NPUSmi, n.NVIDIASmi, n.HealthInterval, n.FakeHealth, n.FakeUtil})
	diff("[pools]", c.Pools, n.Pools)
	diff("[broker]", []any{c.MaxConnections, c.MaxWaitingPerUser, c.DefaultPool, c.MetricsListen},
		[]any{n.MaxConnections, n.MaxWaitingPerUser, n.DefaultPool, n.MetricsListen})
	diff("[limits]", c.Default, n.Default)
	diff("[user.NAME]", c.Users, n.Users)
	diff("[group.NAME]", c.Groups, n.Groups)
	diff("[tasks]", c.Tasks, n.Tasks)
	diff("[status]", c.Status, n.Status)
	diff("[usage]", c.Usage, n.Usage)
	diff("[restrict]", c.Restrict, n.Restrict)
	diff("[slurm]", c.Slurm, n.Slurm)
	diff("[containers]", c.Containers, n.Containers)
	diff("[share]", c.Share, n.Share)
	diff("[idle]", c.Idle, n.Idle)
	diff("[scheduling]", c.Scheduling, n.Scheduling)
	return out
}
