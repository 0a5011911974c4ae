package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A private Slurm of two nodes on one machine (../shared/slurm-single-node.md,
// "Two nodes on one machine"): munged, slurmctld and two slurmd, n1 and
// n2, each with its name, port, spool and log, and each with its own
// npubroker on its own fake device tree in split mode ([slurm] of its first
// Devices, npurun's own the Own after them), fed by the Prolog and Epilog (npurun-slurm, one script for
// both nodes, routed by SLURMD_NODENAME). Each node's jobs hold their
// leases through spank_npurun.so in their extern step, as on a real node:
// plugstack.conf names one broker socket, so each slurmd reads a
// slurm.conf of its own (slurm.NODE.conf: the cluster's, and
// PlugStackConfig naming the node's plugstack.NODE.conf), the login side
// the cluster's, with no plugin. A login configuration ([cluster]) sends
// task-submit and npurun to the cluster.

// SlurmClusterOptions describe the cluster a test wants.
type SlurmClusterOptions struct {
	Devices int    // each node's Slurm devices, davinci0..Devices-1 (default 4)
	Own     int    // each node's devices of npurun's own after Slurm's (split mode: not Slurm's)
	Node    string // more of each node's npurun.conf ([share], pools)
	Login   string // more of the login node's [cluster] table
	Extra   string // more slurm.conf lines, before the nodes
	More    string // more partition lines, after the nodes and partition npu
}

// SlurmClusterNode is one node: its Slurm name, broker and devices.
type SlurmClusterNode struct {
	Name string
	B    *Broker
	Dev  DevTree
}

// SlurmCluster is a running two-node cluster and its login side.
type SlurmCluster struct {
	*slurmCluster
	Nodes     []*SlurmClusterNode
	LoginConf string // the login node's npurun.conf
	Work      string // a directory any user may write: the jobs' working directory
}

// StartSlurmCluster starts the cluster and returns once both nodes are
// idle; it is stopped when the test ends.
func StartSlurmCluster(t testing.TB, o SlurmClusterOptions) *SlurmCluster {
	t.Helper()
	NeedSlurm(t)
	plugin := SpankPlugin(t)
	if o.Devices == 0 {
		o.Devices = 4
	}
	dir := SharedDir(t)
	c := &SlurmCluster{slurmCluster: &slurmCluster{t: t, Dir: dir, Conf: filepath.Join(dir, "slurm.conf"), Node: "n1"}}
	for _, d := range []string{"munge", "state", "spool", "jobs", "work"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c.Work = filepath.Join(dir, "work")
	os.Chmod(filepath.Join(dir, "jobs"), 0o1777)
	os.Chmod(c.Work, 0o1777)
	ports := freePorts(t, 3)
	// Stopped after the brokers (cleanups run last first): the brokers
	// carry SLURM_CONF, and are no leftovers of Slurm's.
	t.Cleanup(c.stop)

	prolog, epilog := filepath.Join(dir, "prolog"), filepath.Join(dir, "epilog")
	var gres, nodes strings.Builder
	for i, name := range []string{"n1", "n2"} {
		dev := NewDevTree(t, o.Devices+o.Own)
		last := o.Devices - 1
		fmt.Fprintf(&gres, "NodeName=%s Name=gpu File=%s/davinci[0-%d]\n", name, dev.Dir, last)
		fmt.Fprintf(&nodes, "NodeName=%s NodeHostname=localhost NodeAddr=127.0.0.1 Port=%d CPUs=2 RealMemory=1000 Gres=gpu:%d State=UNKNOWN\n", name, ports[1+i], o.Devices)
		conf := dev.Config(fmt.Sprintf("0-%d", last+o.Own), fmt.Sprintf("[slurm]\ngres_devices = \"0-%d\"\nmode = \"split\"\nnode = %q\ngres_conf = %q\n%s",
			last, name, filepath.Join(dir, "gres.conf"), o.Node))
		b := NewBroker(t, conf, "SLURM_CONF="+c.Conf)
		c.Nodes = append(c.Nodes, &SlurmClusterNode{Name: name, B: b, Dev: dev})
		plugstack := "required " + plugin + " socket=" + b.Socket + " timeout=10\n"
		if err := os.WriteFile(filepath.Join(dir, "plugstack."+name+".conf"), []byte(plugstack), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []string{prolog, epilog} {
		c.WriteRoute(s, func(n *SlurmClusterNode) string { return n.B.Bin.Slurm + " --socket " + n.B.Socket })
	}
	if err := os.WriteFile(filepath.Join(dir, "gres.conf"), []byte(gres.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "plugstack.conf"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`ClusterName=npurun%d
SlurmctldHost=localhost
SlurmctldPort=%d
%[3]sSchedulerParameters=sched_interval=1
PrologFlags=Alloc,Contain
Prolog=%[4]s
Epilog=%[5]s
KillWait=2
MinJobAge=600
SlurmdTimeout=6
%[6]s
%[7]sPartitionName=npu Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
%[8]s`, os.Getpid(), ports[0], slurmConfBase(dir, "%n"), prolog, epilog, o.Extra, nodes.String(), o.More)
	if err := os.WriteFile(c.Conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		own := conf + "PlugStackConfig=" + filepath.Join(dir, "plugstack."+n.Name+".conf") + "\n"
		if err := os.WriteFile(c.nodeConf(n.Name), []byte(own), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c.LoginConf = filepath.Join(dir, "login.conf")
	login := "[cluster]\nscheduler = \"slurm\"\ngres_name = \"gpu\"\npartition = \"npu\"\n" + o.Login
	if err := os.WriteFile(c.LoginConf, []byte(login), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Env = append(os.Environ(), "SLURM_CONF="+c.Conf)
	for _, n := range c.Nodes {
		n.B.Start()
	}

	c.startController(t, dir)
	for _, n := range c.Nodes {
		c.start("slurmd "+n.Name, c.SlurmdArgs(n.Name)...)
	}
	c.await("both nodes to be idle", func() bool {
		out, _ := c.Command("sinfo", "-h", "-N", "-p", "npu", "-o", "%N %t").Output()
		return strings.TrimSpace(string(out)) == "n1 idle\nn2 idle"
	})
	return c
}

// WriteRoute writes a script at path that runs, on each node (by
// SLURMD_NODENAME, as Slurm sets it in a job and its Prolog), the
// command line cmd gives for the node with the script's arguments: one
// machine's two nodes each reach their own broker.
func (c *SlurmCluster) WriteRoute(path string, cmd func(n *SlurmClusterNode) string) {
	c.t.Helper()
	route := "#!/bin/sh\ncase \"$SLURMD_NODENAME\" in\n"
	for _, n := range c.Nodes {
		route += n.Name + ") exec " + cmd(n) + " \"$@\" ;;\n"
	}
	route += "esac\necho \"no broker for node $SLURMD_NODENAME\" >&2\nexit 1\n"
	if err := os.WriteFile(path, []byte(route), 0o755); err != nil {
		c.t.Fatal(err)
	}
}

// nodeConf is the slurm.conf node name's slurmd reads.
func (c *SlurmCluster) nodeConf(name string) string {
	return filepath.Join(c.Dir, "slurm."+name+".conf")
}

// SlurmdArgs is the command line that starts node name's slurmd (for
// Restart).
func (c *SlurmCluster) SlurmdArgs(name string) []string {
	return []string{"slurmd", "-D", "-N", name, "-f", c.nodeConf(name)}
}

// stop cancels every job, waits for the queue to empty, then stops the
// daemons as a single-node cluster's are stopped.
func (c *SlurmCluster) stop() {
	if c.Daemon("slurmctld") != nil && c.running("slurmctld") {
		c.Command("scancel", "--full", "-p", "npu").Run()
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			out, err := c.Command("squeue", "-h", "-t", "PD,R,CG,CF", "-o", "%i").Output()
			if err != nil || strings.TrimSpace(string(out)) == "" {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if c.t.Failed() {
		c.t.Logf("slurmd logs:\n%s", c.NodeLogs())
	}
	c.Stop() // four daemons: it cancels nothing more, and stops them in reverse
}

// Daemon is the daemon started as name, or nil.
func (c *SlurmCluster) Daemon(name string) *slurmDaemon {
	for _, d := range c.Daemons {
		if d.Name == name {
			return d
		}
	}
	return nil
}

func (c *SlurmCluster) running(name string) bool {
	select {
	case <-c.Daemon(name).Done:
		return false
	default:
		return true
	}
}

// StopDaemon stops the daemon started as name ("slurmctld", "slurmd n2")
// by its pid, TERM then KILL after 10 s, and waits for it to exit.
func (c *SlurmCluster) StopDaemon(name string) {
	c.t.Helper()
	d := c.Daemon(name)
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.Done:
	case <-time.After(10 * time.Second):
		d.cmd.Process.Kill()
		<-d.Done
	}
}

// Restart starts a stopped daemon again under its name ("slurmctld":
// with the state it saved, not -i) and waits for it to serve.
func (c *SlurmCluster) Restart(name string, argv ...string) {
	c.t.Helper()
	for i, d := range c.Daemons {
		if d.Name == name {
			c.Daemons = append(c.Daemons[:i], c.Daemons[i+1:]...)
			break
		}
	}
	c.start(name, argv...)
	if name != "slurmctld" {
		return
	}
	// Not c.await: a daemon the test stopped on purpose has exited.
	d := c.Daemons[len(c.Daemons)-1]
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, _ := c.Command("scontrol", "ping").CombinedOutput()
		if strings.Contains(string(out), "is UP") {
			return
		}
		select {
		case <-d.Done:
			c.t.Fatalf("slurmctld exited while starting again:\n%s", d.out)
		default:
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("slurmctld does not answer within 60s of its restart:\n%s", c.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// NodeLogs are the slurmd logs' ends.
func (c *SlurmCluster) NodeLogs() string {
	var b strings.Builder
	for _, n := range c.Nodes {
		data, _ := os.ReadFile(filepath.Join(c.Dir, "slurmd."+n.Name+".log"))
		if len(data) > 8<<10 {
			data = data[len(data)-8<<10:]
		}
		fmt.Fprintf(&b, "--- slurmd.%s.log (end)\n%s\n", n.Name, data)
	}
	return b.String()
}

// Login prepares the login side's program (b.Bin's npurun, task-submit)
// run as u (nil: root) in the work directory, with the login
// configuration and the cluster's SLURM_CONF, and no broker.
func (c *SlurmCluster) Login(u *TestUser, program string, args ...string) *exec.Cmd {
	cmd := exec.Command(program, args...)
	cmd.Env = append(os.Environ(), "SLURM_CONF="+c.Conf, "NPURUN_CONF="+c.LoginConf, "NPURUN_SOCKET="+filepath.Join(c.Dir, "no-broker.sock"))
	cmd.Dir = c.Work
	if u != nil {
		u.As(cmd, c.Work)
	}
	return cmd
}
