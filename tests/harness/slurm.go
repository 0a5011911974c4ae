package harness

import (
	"bytes"
	"cmp"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/wire"
)

// slurmNode is a broker and a private Slurm sharing devices 0..n-1: Slurm
// manages those of gres_devices.
type slurmNode struct {
	B   *Broker
	C   *slurmCluster
	Dev DevTree
}

type SlurmNodeOptions struct {
	Devices   int    // devices of the machine, davinci0..Devices-1
	Slurm     int    // the last Slurm devices: gres_devices = "Devices-Slurm..Devices-1"
	Mode      string // split or allocate
	Config    string // more of npurun.conf (pools, [restrict], [tasks])
	Partition string // more of Slurm's partition line
	NoPlugin  bool   // plugstack.conf without spank_npurun.so: no extern step holds a lease, the broker holds it until the Epilog
}

func StartSlurmNode(t testing.TB, o SlurmNodeOptions) *slurmNode {
	t.Helper()
	plugin := ""
	if !o.NoPlugin {
		plugin = SpankPlugin(t)
	}
	NeedSlurm(t)
	dev := NewDevTree(t, o.Devices)
	first := o.Devices - o.Slurm
	scripts := SharedDir(t)
	prolog, epilog := filepath.Join(scripts, "prolog"), filepath.Join(scripts, "epilog")
	c := StartSlurm(t, SlurmOptions{Devices: o.Slurm, GresFirst: first, DevDir: dev.Dir, Prolog: prolog, Epilog: epilog, Partition: o.Partition})
	conf := dev.Config(fmt.Sprintf("0-%d", o.Devices-1), fmt.Sprintf("[slurm]\ngres_devices = \"%d-%d\"\nmode = %q\nnode = %q\ngres_conf = %q\n%s",
		first, o.Devices-1, o.Mode, c.Node, filepath.Join(c.Dir, "gres.conf"), o.Config))
	b := NewBroker(t, conf, "SLURM_CONF="+c.Conf)
	for _, s := range []string{prolog, epilog} {
		if err := os.WriteFile(s, []byte("#!/bin/sh\nexec "+b.Bin.Slurm+" --socket "+b.Socket+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	plugstack := ""
	if plugin != "" {
		plugstack = "required " + plugin + " socket=" + b.Socket + " timeout=10\n"
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "plugstack.conf"), []byte(plugstack), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Env = append(c.Env, "NPURUN_SOCKET="+b.Socket)
	b.Start()
	return &slurmNode{B: b, C: c, Dev: dev}
}

// AwaitBoard waits for the board to satisfy ok, through status --watch.
func (n *slurmNode) AwaitBoard(t testing.TB, what string, ok func(*wire.Board) bool) *wire.Board {
	t.Helper()
	w := WatchBoards(t, n.B, nil)
	board, _ := w.Next(what, ok)
	return board
}

// A private single-node Slurm for tests (the recipe checked on this kind
// of machine: Debian 12's slurm-wlm 22.05 and munge 0.5.15): munged on a
// socket of its own, slurmctld and slurmd on free ports, every file in a
// temporary directory, nothing of /etc/slurm or of the machine's munge
// touched. Each daemon is stopped by the pid the test started, TERM then
// KILL; what Slurm started for jobs (slurmstepd, the jobs' processes),
// known by the SLURM_CONF in their environment, is ended after them.

// SlurmOptions describe the cluster a test wants.
type SlurmOptions struct {
	Devices   int    // GRES devices: davinciF..F+Devices-1 of DevDir, F = GresFirst (default 4)
	GresFirst int    // the first GRES device's N
	DevDir    string // device nodes the test made (FakeDev); "" for nodes of the harness's own
	GresType  string // gres.conf Type= ("910b"); "" for none
	Prolog    string // slurm.conf Prolog= (a program: slurmd passes no arguments); "" for none
	Epilog    string // slurm.conf Epilog=; "" for none
	PlugStack string // plugstack.conf beside slurm.conf; "" for none
	Extra     string // more slurm.conf lines
	CPUs      int    // the node's CPUs (default 2: one per job step at a time, each job one)
	Partition string // more of the partition's line ("DefaultTime=1")
	Scheduler string // slurm.conf SchedulerParameters= (default "sched_interval=1")
}

// slurmCluster is a running private Slurm.
type slurmCluster struct {
	t      testing.TB
	Dir    string   // everything of the cluster's; 0755, other users may enter
	Conf   string   // slurm.conf
	DevDir string   // the GRES device nodes
	Node   string   // the node's name, "localhost"
	Env    []string // for Slurm's commands: SLURM_CONF

	Daemons []*slurmDaemon // in the order started
}

type slurmDaemon struct {
	Name string
	cmd  *exec.Cmd
	Done chan struct{}
	out  *bytes.Buffer
}

// NeedSlurm skips a test that runs a private Slurm where it cannot run
// (not root; Slurm or munge missing), except in CI, where .ci/run
// installs them and a skip is a failure.
func NeedSlurm(t testing.TB) {
	t.Helper()
	NeedRoot(t)
	NeedTool(t, "slurmctld", "slurmctld")
	NeedTool(t, "slurmd", "slurmd")
	NeedTool(t, "slurm-client", "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
	NeedTool(t, "munge", "munged", "mungekey")
}

// freePorts returns n TCP ports that were free a moment ago.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return ports
}

// slurmConfBase is what the private clusters' slurm.conf files share:
// root daemons, munge on its socket in dir, state, spool, pid and log
// files in dir (each node's named by node, Slurm's "%n", where node is
// given), and the plugins a test machine can run.
func slurmConfBase(dir, node string) string {
	spool, file := "", ""
	if node != "" {
		spool, file = "/"+node, "."+node
	}
	return fmt.Sprintf(`SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=%[1]s/munge/munge.sock
CredType=cred/munge
StateSaveLocation=%[1]s/state
SlurmdSpoolDir=%[1]s/spool%[2]s
SlurmctldPidFile=%[1]s/slurmctld.pid
SlurmdPidFile=%[1]s/slurmd%[3]s.pid
SlurmctldLogFile=%[1]s/slurmctld.log
SlurmdLogFile=%[1]s/slurmd%[3]s.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
`, dir, spool, file)
}

// StartSlurm starts a private single-node Slurm and returns once its node
// is idle; it is stopped when the test ends.
func StartSlurm(t testing.TB, o SlurmOptions) *slurmCluster {
	t.Helper()
	NeedSlurm(t)
	if o.Devices == 0 {
		o.Devices = 4
	}
	if o.CPUs == 0 {
		o.CPUs = 2
	}
	dir := SharedDir(t)
	c := &slurmCluster{t: t, Dir: dir, Conf: filepath.Join(dir, "slurm.conf"), DevDir: o.DevDir, Node: "localhost"}
	for _, d := range []string{"munge", "state", "spool", "jobs"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(dir, "jobs"), 0o1777) // the jobs' output, any user's
	if c.DevDir == "" {
		c.DevDir = filepath.Join(dir, "dev")
		if err := os.Mkdir(c.DevDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range o.Devices {
			// gres.conf's File= must be a character device; the numbers
			// are /dev/null's, which no npurun test looks at here.
			if err := unix.Mknod(filepath.Join(c.DevDir, "davinci"+strconv.Itoa(o.GresFirst+i)), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
				t.Fatal(err)
			}
		}
	}
	ports := freePorts(t, 2)
	typ := ""
	if o.GresType != "" {
		typ = " Type=" + o.GresType
	}
	gres := fmt.Sprintf("Name=gpu%s File=%s/davinci[%d-%d]\n", typ, c.DevDir, o.GresFirst, o.GresFirst+o.Devices-1)
	if err := os.WriteFile(filepath.Join(dir, "gres.conf"), []byte(gres), 0o644); err != nil {
		t.Fatal(err)
	}
	if o.PlugStack != "" {
		if err := os.WriteFile(filepath.Join(dir, "plugstack.conf"), []byte(o.PlugStack), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	conf := fmt.Sprintf(`ClusterName=npurun%d
SlurmctldHost=localhost
SlurmctldPort=%d
SlurmdPort=%d
%[4]sSlurmdDebug=debug2
SchedulerParameters=%[5]s
PrologFlags=Alloc,Contain
KillWait=5
MinJobAge=2
`, os.Getpid(), ports[0], ports[1], slurmConfBase(dir, ""), cmp.Or(o.Scheduler, "sched_interval=1"))
	if o.Prolog != "" {
		conf += "Prolog=" + o.Prolog + "\n"
	}
	if o.Epilog != "" {
		conf += "Epilog=" + o.Epilog + "\n"
	}
	conf += o.Extra
	conf += fmt.Sprintf("NodeName=localhost CPUs=%d RealMemory=1000 Gres=gpu:%d State=UNKNOWN\n", o.CPUs, o.Devices)
	conf += "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP " + o.Partition + "\n"
	if err := os.WriteFile(c.Conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Env = append(os.Environ(), "SLURM_CONF="+c.Conf)
	t.Cleanup(c.Stop)

	c.startController(t, dir)
	c.start("slurmd", "slurmd", "-D", "-N", c.Node)
	c.await("the node to be idle", func() bool {
		out, _ := c.Command("sinfo", "-h", "-n", c.Node, "-o", "%t").Output()
		return strings.TrimSpace(string(out)) == "idle"
	})
	return c
}

// start runs a daemon of the cluster.
func (c *slurmCluster) start(name string, argv ...string) {
	c.t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = c.Env
	cmd.Dir = c.Dir
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start %s: %v", name, err)
	}
	d := &slurmDaemon{Name: name, cmd: cmd, Done: make(chan struct{}), out: out}
	go func() { cmd.Wait(); close(d.Done) }()
	c.Daemons = append(c.Daemons, d)
}

// await polls a daemon's readiness (no event tells it) every 100 ms, for
// at most 60 s, and fails the test, with the daemons' logs, if it never
// comes or a daemon exits first.
func (c *slurmCluster) await(what string, ready func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !ready() {
		for _, d := range c.Daemons {
			select {
			case <-d.Done:
				c.t.Fatalf("%s exited while waiting for %s:\n%s\n%s", d.Name, what, d.out, c.Logs())
			default:
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("no %s within 60s:\n%s", what, c.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startController starts munged with a fresh key and slurmctld, from
// the configuration and state in dir, and waits until slurmctld answers.
func (c *slurmCluster) startController(t testing.TB, dir string) {
	t.Helper()
	key := filepath.Join(dir, "munge.key")
	if out, err := exec.Command("mungekey", "--create", "--keyfile="+key).CombinedOutput(); err != nil {
		t.Fatalf("mungekey: %v\n%s", err, out)
	}
	sock := filepath.Join(dir, "munge", "munge.sock")
	c.start("munged", "munged", "-F", "--socket="+sock, "--key-file="+key, "--pid-file="+filepath.Join(dir, "munge", "munged.pid"),
		"--log-file="+filepath.Join(dir, "munged.log"), "--seed-file="+filepath.Join(dir, "munge", "munged.seed"))
	c.await("munged's socket", func() bool { _, err := os.Stat(sock); return err == nil })
	c.start("slurmctld", "slurmctld", "-D", "-i")
	c.await("slurmctld to answer scontrol ping", func() bool {
		out, _ := c.Command("scontrol", "ping").CombinedOutput()
		return strings.Contains(string(out), "is UP")
	})
}

// Logs are the daemons' log files, for a failure's message.
func (c *slurmCluster) Logs() string {
	var b strings.Builder
	for _, name := range []string{"slurmctld.log", "slurmd.log", "munged.log"} {
		data, _ := os.ReadFile(filepath.Join(c.Dir, name))
		if len(data) > 16<<10 {
			data = data[len(data)-16<<10:]
		}
		fmt.Fprintf(&b, "--- %s (end)\n%s\n", name, data)
	}
	return b.String()
}

// Command prepares one of Slurm's commands against this cluster.
func (c *slurmCluster) Command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = c.Env
	cmd.Dir = c.Dir
	return cmd
}

// As prepares a Slurm command run as u (nil: root).
func (c *slurmCluster) As(u *TestUser, name string, args ...string) *exec.Cmd {
	cmd := c.Command(name, args...)
	if u != nil {
		u.As(cmd, c.Dir)
	}
	return cmd
}

// Sbatch submits a job as u (nil: root) and returns its id; args are
// sbatch's (a --wrap, --gres and the like).
func (c *slurmCluster) Sbatch(u *TestUser, args ...string) uint32 {
	c.t.Helper()
	out, err := c.As(u, "sbatch", append([]string{"--parsable", "-o", filepath.Join(c.Dir, "jobs", "%j.out")}, args...)...).CombinedOutput()
	if err != nil {
		c.t.Fatalf("sbatch %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	id, err := strconv.ParseUint(strings.TrimSpace(strings.Split(string(out), ";")[0]), 10, 32)
	if err != nil {
		c.t.Fatalf("sbatch printed %q, not a job id", out)
	}
	return uint32(id)
}

// JobOutput is what job id wrote to its standard output (Sbatch's -o).
func (c *slurmCluster) JobOutput(id uint32) string {
	data, _ := os.ReadFile(filepath.Join(c.Dir, "jobs", strconv.FormatUint(uint64(id), 10)+".out"))
	return string(data)
}

// JobState is job id's state as squeue shows it ("" once it has left the
// queue).
func (c *slurmCluster) JobState(id uint32) string {
	out, _ := c.Command("squeue", "-h", "-j", strconv.FormatUint(uint64(id), 10), "-o", "%T").Output()
	return strings.TrimSpace(string(out))
}

// AwaitJobGone waits (polling slurmctld, as Slurm's own clients do) until
// job id has left the queue, for at most within.
func (c *slurmCluster) AwaitJobGone(id uint32, within time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for c.JobState(id) != "" {
		if time.Now().After(deadline) {
			c.t.Fatalf("job %d still %s after %s:\n%s", id, c.JobState(id), within, c.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// AwaitJobState waits until job id is in state (RUNNING, PENDING), for at
// most within.
func (c *slurmCluster) AwaitJobState(id uint32, state string, within time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for {
		s := c.JobState(id)
		if s == state {
			return
		}
		if s == "" || time.Now().After(deadline) {
			c.t.Fatalf("job %d is %q, not %s, after waiting:\n%s", id, s, state, c.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop cancels every job, waits for the queue to empty, stops the daemons
// by pid (TERM, KILL after 10 s) and ends what Slurm started that is left.
func (c *slurmCluster) Stop() {
	if len(c.Daemons) == 3 {
		c.Command("scancel", "--full", "-p", "debug").Run()
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			out, err := c.Command("squeue", "-h", "-o", "%i").Output()
			if err != nil || strings.TrimSpace(string(out)) == "" {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for i := len(c.Daemons) - 1; i >= 0; i-- {
		d := c.Daemons[i]
		d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.Done:
		case <-time.After(10 * time.Second):
			c.t.Errorf("%s did not stop on SIGTERM within 10s: killed", d.Name)
			d.cmd.Process.Kill()
			<-d.Done
		}
	}
	if c.t.Failed() {
		c.t.Logf("Slurm's logs:\n%s", c.Logs())
	}
	// What Slurm started for this cluster: slurmstepd, jobs, the extern
	// steps' sleep. They carry its SLURM_CONF.
	for range 3 {
		left := c.leftovers()
		if len(left) == 0 {
			return
		}
		for _, pid := range left {
			c.t.Logf("ending %d, left by Slurm: %s", pid, ProcCmdline(pid))
			unix.Kill(pid, unix.SIGKILL)
		}
		deadline := time.Now().Add(EventTimeout)
		for _, pid := range left {
			AwaitReaped(pid, deadline)
		}
	}
	if left := c.leftovers(); len(left) > 0 {
		c.t.Errorf("processes of the private Slurm left running: %v", left)
	}
}

// leftovers are the processes whose environment names this cluster's
// slurm.conf, the test's own process aside.
func (c *slurmCluster) leftovers() []int {
	mark := []byte("SLURM_CONF=" + c.Conf + "\x00")
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil {
			continue
		}
		if bytes.Contains(append(env, 0), mark) {
			if st, _ := os.ReadFile("/proc/" + e.Name() + "/stat"); bytes.Contains(st, []byte(") Z ")) {
				continue // a zombie: gone, not yet reaped by its parent
			}
			pids = append(pids, pid)
		}
	}
	return pids
}

func ProcCmdline(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return strings.TrimSpace(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
}
