package containers

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// openableDev makes a tree whose davinci0 and davinci1 are character
// devices a container may open once allowed (/dev/loop-control's number,
// which root opens without a capability; /dev/kmsg's, which a container
// opens only with CAP_SYSLOG where kernel.dmesg_restrict is 1), and
// neither is in Docker's default device rules: a container without
// --device gets EPERM. The control nodes are numbers no driver has.
func openableDev(t *testing.T) string {
	t.Helper()
	base := uint32(os.Getpid()%1000) * 200
	return harness.MkNodes(t, map[string]uint64{
		"davinci0":        unix.Mkdev(10, 237),
		"davinci1":        unix.Mkdev(1, 11),
		"davinci_manager": unix.Mkdev(harness.ContainerMajor, base+100),
		"devmm_svm":       unix.Mkdev(harness.ContainerMajor, base+101),
		"hisi_hdc":        unix.Mkdev(harness.ContainerMajor, base+102),
	})
}

// deviceOf is device id's state on the board.
func deviceOf(t *testing.T, bd *wire.Board, id int) wire.DeviceState {
	t.Helper()
	for _, d := range bd.Devices {
		if d.ID == id {
			return d
		}
	}
	t.Fatalf("no npu %d on the board", id)
	return wire.DeviceState{}
}

// TestContainerBrokerStatus: the lease a container holds is of kind
// container, names the container (engine, id, name) as soon as npurun
// docker run -d returns (the runtime told the broker), and each holder
// names it too; the table says so.
func TestContainerBrokerStatus(t *testing.T) {
	dev := harness.ContainerDev(t, 1)
	b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 1, ""))
	d := harness.StartDockerd(t, b, "")
	code, out := harness.ExitCode(t, harness.NpurunIn(b, harness.ContainerClient(b, dev), harness.DockerBin, "-H", "unix://"+d.Sock, "run", "-d", "--name", "train", "local/mini", "sleep", "600"))
	if code != 0 {
		t.Fatalf("npurun docker run -d: exit %d\n%s", code, out)
	}
	cid := strings.TrimSpace(out)
	bd := b.Board(t)
	dv := deviceOf(t, bd, 0)
	if dv.State != wire.DeviceContainer || dv.Lease == nil || dv.Lease.Kind != wire.KindContainer {
		t.Fatalf("npu 0: %+v, want state and kind container", dv)
	}
	want := wire.ContainerRef{Engine: "docker", ID: cid, Name: "train"}
	if c := dv.Lease.Container; c == nil || *c != want {
		t.Errorf("lease.container = %+v, want %+v", c, want)
	}
	if dv.Lease.User != "root" {
		t.Errorf("lease.user = %q, want the npurun's user, root", dv.Lease.User)
	}
	w := harness.WatchBoards(t, b, nil)
	// Found by the background scan (the process granted the lease is
	// gone), which reads a bounded share of root's processes at a time.
	w.NextWithin(harness.ScanTimeout, "the container's processes as the lease's holders", func(bd *wire.Board) bool {
		l := deviceOf(t, bd, 0).Lease
		if l == nil || len(l.Holders) == 0 {
			return false
		}
		for _, h := range l.Holders {
			if h.Container == nil || h.Container.ID != cid {
				return false
			}
		}
		return true
	})
	table := b.Status(t)
	if !strings.Contains(table, "container") || !strings.Contains(table, "train") {
		t.Errorf("the table does not name the container:\n%s", table)
	}
}

// TestContainerBrokerRestart: a container restarted by its engine holds a
// lease of kind container for its owner, naming it.
func TestContainerBrokerRestart(t *testing.T) {
	dev := harness.ContainerDev(t, 1)
	b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 1, ""))
	d := harness.StartDockerd(t, b, "")
	alice := harness.NewUser(t)
	if err := os.Chown(d.Sock, int(alice.UID), -1); err != nil {
		t.Fatal(err)
	}
	m := fifo(t)
	env := append(harness.ContainerClient(b, dev), "DOCKER_CONFIG="+harness.SharedDir(t))
	script := `n=$(cat /m/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /m/n; [ $n -eq 1 ] && read x < /m/go; exec sleep 600`
	cmd := alice.As(harness.NpurunIn(b, env, harness.DockerBin, "-H", "unix://"+d.Sock, "run", "-d", "--restart=always", "--name", "rs", "-v", m+":/m", "local/mini", "sh", "-c", script), m)
	if code, out := harness.ExitCode(t, cmd); code != 0 {
		t.Fatalf("npurun docker run: exit %d\n%s", code, out)
	}
	w := harness.WatchBoards(t, b, nil)
	releaseProbe(t, m)
	cid := d.DockerOut("inspect", "-f", "{{.Id}}", "rs")
	w.Next("the restarted container's lease, kind container, alice's", func(bd *wire.Board) bool {
		l := deviceOf(t, bd, 0).Lease
		return l != nil && l.Kind == wire.KindContainer && l.User == alice.Name && l.Container != nil && l.Container.ID == cid && l.Container.Name == "rs"
	})
}

// TestContainerBrokerUnleased: a container started without npurun that
// opens a device (unleased = "report": the runtime lets it run) is
// reported, naming the container, though its processes are root's (exempt
// from the report by default on the host).
func TestContainerBrokerUnleased(t *testing.T) {
	dev := openableDev(t)
	b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 2, "unleased = \"report\"\n\n[status]\nscan_interval = \"1s\"\nunleased_grace = \"1s\"\n"))
	// npurun's runtime is Docker's default: it lets the container run
	// (report) and tells the broker its name.
	d := harness.StartDockerd(t, b, `"default-runtime": "npurun", `)
	out := d.DockerOut("run", "-d", "--name", "sneak", "--device", filepath.Join(dev, "davinci0")+":/dev/davinci0", "local/mini",
		"sh", "-c", "exec 3</dev/davinci0; exec sleep 600")
	cid := strings.TrimSpace(out)
	w := harness.WatchBoards(t, b, nil)
	bd, _ := w.NextWithin(2*harness.EventTimeout, "the container's use of npu 0 reported", func(bd *wire.Board) bool {
		for _, u := range bd.Unleased {
			if u.Device == 0 && u.Container != nil && u.Container.ID == cid {
				return true
			}
		}
		return false
	})
	for _, u := range bd.Unleased {
		if u.Device == 0 && u.Container != nil && u.Container.Name != "sneak" {
			t.Errorf("unleased use names the container %+v, want its name sneak", u.Container)
		}
	}
	if table := b.Status(t); !strings.Contains(table, "sneak") {
		t.Errorf("the table's UNLEASED USE does not name the container:\n%s", table)
	}
}

// TestContainerBrokerExec: a process that docker exec starts in a
// container holding a lease, and that opens the lease's device, is not
// unleased use: its container holds the lease.
func TestContainerBrokerExec(t *testing.T) {
	dev := openableDev(t)
	b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 2, "\n[status]\nscan_interval = \"1s\"\nunleased_grace = \"1s\"\nunleased_exempt_users = []\n"))
	d := harness.StartDockerd(t, b, "")
	code, out := harness.ExitCode(t, harness.NpurunIn(b, harness.ContainerClient(b, dev), "-d", "0", harness.DockerBin, "-H", "unix://"+d.Sock, "run", "-d", "--name", "ex", "local/mini", "sleep", "600"))
	if code != 0 {
		t.Fatalf("npurun docker run -d: exit %d\n%s", code, out)
	}
	ex := harness.StartProc(t, "docker exec", d.Docker("exec", "ex", "sh", "-c", "exec 3</dev/davinci0 && echo fd3-is-davinci0; exec sleep 600"))
	ex.WaitLine("fd3-is-davinci0")
	// Two whole scans after the exec'd process opened the node: it would be
	// reported by now, were it judged without its container.
	w := harness.WatchBoards(t, b, nil)
	first, _ := w.NextWithin(2*harness.EventTimeout, "a scan", func(bd *wire.Board) bool { return bd.Scan.Last > 0 })
	w.NextWithin(2*harness.EventTimeout, "two scans later", func(bd *wire.Board) bool { return bd.Scan.Last > first.Scan.Last+int64(2*1000) })
	for _, u := range b.Board(t).Unleased {
		if u.Device == 0 {
			t.Errorf("a process of the container holding npu 0 reported as unleased use: %+v", u)
		}
	}
}

// TestContainerBrokerUsage: a container's device time is counted under
// kind container.
func TestContainerBrokerUsage(t *testing.T) {
	dev := harness.ContainerDev(t, 1)
	b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 1, ""))
	d := harness.StartDockerd(t, b, "")
	if code, out := harness.ExitCode(t, harness.NpurunIn(b, harness.ContainerClient(b, dev), harness.DockerBin, "-H", "unix://"+d.Sock, "run", "--rm", "local/mini", "sleep", "1")); code != 0 {
		t.Fatalf("npurun docker run: exit %d\n%s", code, out)
	}
	harness.AwaitFree(t, b, 0)
	cmd := exec.Command(b.Bin.Broker, "usage", "--since", "1h", "--json")
	cmd.Env = b.Env()
	got, err := cmd.Output()
	if err != nil {
		t.Fatalf("npubroker usage: %v", err)
	}
	var rep wire.UsageReport
	if err := json.Unmarshal(got, &rep); err != nil {
		t.Fatalf("npubroker usage --json: %v\n%s", err, got)
	}
	if !slices.ContainsFunc(rep.Rows, func(r wire.UsageRow) bool {
		return r.Kind == wire.KindContainer && r.User == "root" && r.Leases == 1 && r.DeviceSeconds >= 1
	}) {
		t.Errorf("usage has no row of kind container for root's lease of at least 1s:\n%s", got)
	}
}

// TestContainerBrokerRestartBroker: the broker killed and restarted while a
// container holds a lease finds it again as a container's (from its
// holders' control groups) and names it.
func TestContainerBrokerRestartBroker(t *testing.T) {
	dev := harness.ContainerDev(t, 1)
	b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 1, ""))
	d := harness.StartDockerd(t, b, "")
	code, out := harness.ExitCode(t, harness.NpurunIn(b, harness.ContainerClient(b, dev), harness.DockerBin, "-H", "unix://"+d.Sock, "run", "-d", "--name", "kept", "local/mini", "sleep", "600"))
	if code != 0 {
		t.Fatalf("npurun docker run -d: exit %d\n%s", code, out)
	}
	cid := strings.TrimSpace(out)
	b.Kill()
	b.Start()
	w := harness.WatchBoards(t, b, nil)
	w.Next("npu 0 found held by container kept", func(bd *wire.Board) bool {
		l := deviceOf(t, bd, 0).Lease
		return l != nil && l.Container != nil && l.Container.ID == cid
	})
}

// TestContainerBrokerRestartNoRecord: a lease held by a container's
// processes alone, which the accounting log does not know (the log lost
// while the broker was down), is found at start as that container's (kind
// container, from its holders' control groups) rather than as root's.
func TestContainerBrokerRestartNoRecord(t *testing.T) {
	dev := harness.ContainerDev(t, 1)
	b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 1, ""))
	d := harness.StartDockerd(t, b, "")
	code, out := harness.ExitCode(t, harness.NpurunIn(b, harness.ContainerClient(b, dev), harness.DockerBin, "-H", "unix://"+d.Sock, "run", "-d", "--name", "lost", "local/mini", "sleep", "600"))
	if code != 0 {
		t.Fatalf("npurun docker run -d: exit %d\n%s", code, out)
	}
	cid := strings.TrimSpace(out)
	b.Kill()
	lost, _ := filepath.Glob(filepath.Join(b.StateDir, "usage.log*"))
	for _, f := range lost {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	b.Start()
	l := deviceOf(t, b.Board(t), 0).Lease
	if l == nil || l.Kind != wire.KindContainer || l.Container == nil || l.Container.ID != cid || l.Container.Engine != "docker" || !l.Adopted {
		t.Fatalf("npu 0 after a restart without its record: %+v, want a lease found held of kind container, container %s", l, cid)
	}
}

// TestContainerBrokerHolderAtOnce (issue 27.22): as soon as npurun docker
// run -d returns, status shows the container's first process holding its
// lease (the runtime told the broker its pid once runc had made it), not
// "no holder found yet" until a background scan; and the group it was
// made in, which the broker keeps for itself, is not shown.
func TestContainerBrokerHolderAtOnce(t *testing.T) {
	dev := harness.ContainerDev(t, 1)
	// A background scan a minute away: only the runtime's word can tell.
	b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 1, "\n[status]\nscan_interval = \"60s\"\n"))
	d := harness.StartDockerd(t, b, "")
	code, out := harness.ExitCode(t, harness.NpurunIn(b, harness.ContainerClient(b, dev), harness.DockerBin, "-H", "unix://"+d.Sock, "run", "-d", "--name", "quick", "local/mini", "sleep", "600"))
	if code != 0 {
		t.Fatalf("npurun docker run -d: exit %d\n%s", code, out)
	}
	cid := strings.TrimSpace(out)
	pid := d.DockerOut("inspect", "-f", "{{.State.Pid}}", cid)
	l := deviceOf(t, b.Board(t), 0).Lease
	if l == nil || !slices.ContainsFunc(l.Holders, func(h wire.Holder) bool { return strconv.Itoa(h.PID) == pid }) {
		t.Fatalf("right after docker run -d, npu 0's lease %+v, want the container's first process (pid %s) among its holders", l, pid)
	}
	for _, h := range l.Holders {
		if h.Container == nil || h.Container.ID != cid || h.Container.Cgroup != "" || h.Container.PID != 0 {
			t.Errorf("holder %d: container %+v, want %s by engine, id and name only", h.PID, h.Container, cid[:12])
		}
	}
	if c := l.Container; c == nil || c.Cgroup != "" || c.PID != 0 {
		t.Errorf("lease.container = %+v, want engine, id and name only", c)
	}
	if table := b.Status(t); strings.Contains(table, "no holder found") {
		t.Errorf("the table says no holder is found:\n%s", table)
	}
}

// TestContainerHandoverSquat (issue 27.5): once the npurun that started a
// container is gone, another user binds its hand-over address (in the
// container's environment, and in /proc/net/unix for everyone) and answers
// the runtime with a lease of her own when the container starts again.
// The runtime takes nothing from her: the container's recorded owner's
// hand-over alone counts, and the restart gets a new lease for its owner.
func TestContainerHandoverSquat(t *testing.T) {
	// Devices without nodes: the container's device rules ask for none,
	// so a lease of any device would do for it, as far as they tell.
	b := harness.StartBroker(t, harness.FakeConfig(2)+fmt.Sprintf("\n[containers]\nstate_dir = %q\n", filepath.Join(harness.SharedDir(t), "containers")))
	d := harness.StartDockerd(t, b, "")
	alice, mallory := harness.NewUser(t), harness.NewUser(t)
	if err := os.Chown(d.Sock, int(alice.UID), -1); err != nil {
		t.Fatal(err)
	}
	m := fifo(t)
	log := tailLog(t, filepath.Join(m, "log"))
	script := `n=$(cat /m/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /m/n
echo "run $n fd20=$(readlink /proc/self/fd/20)" >> /m/log
[ $n -eq 1 ] && { read x < /m/go; exit 1; }
exec sleep 600`
	env := append(b.Env(), "DOCKER_CONFIG="+harness.SharedDir(t))
	cmd := alice.As(harness.NpurunIn(b, env, harness.DockerBin, "-H", "unix://"+d.Sock, "run", "-d", "--restart=always", "--name", "sq", "-v", m+":/m", "local/mini", "sh", "-c", script), m)
	if code, out := harness.ExitCode(t, cmd); code != 0 {
		t.Fatalf("npurun docker run -d --restart=always: exit %d\n%s", code, out)
	}
	lock := func(id int) string { return filepath.Join(b.RunDir, "locks", fmt.Sprintf("npu%d.lock", id)) }
	log.WaitLine("run 1 fd20=" + lock(0))
	var addr string
	for _, kv := range strings.Fields(d.DockerOut("inspect", "-f", `{{range .Config.Env}}{{println .}}{{end}}`, "sq")) {
		if v, ok := strings.CutPrefix(kv, "NPURUN_HANDOVER="); ok {
			addr = v
		}
	}
	if addr == "" {
		t.Fatal("the container's environment has no NPURUN_HANDOVER")
	}
	// Mallory, with a lease of npu 1, answers at the address.
	sq := harness.StartProc(t, "mallory squats", mallory.As(b.Npurun("-d", "1", "--", b.Bin.Workload, "-squat", addr), "/"))
	sq.WaitLine("squatting")
	releaseProbe(t, m)
	log.WaitLine("run 2 fd20=")
	if !strings.Contains(log.Output(), "run 2 fd20="+lock(0)) {
		t.Errorf("the restarted container runs on another lease than its owner's npu 0:\n%s", log.Output())
	}
	bd := b.Board(t)
	if l := deviceOf(t, bd, 0).Lease; l == nil || l.User != alice.Name || l.Kind != wire.KindContainer {
		t.Errorf("npu 0 after the restart: %+v, want alice's lease, of kind container", l)
	}
	if l := deviceOf(t, bd, 1).Lease; l == nil || l.User != mallory.Name || l.Container != nil {
		t.Errorf("npu 1 after the restart: %+v, want mallory's lease, in no container", l)
	}
	if strings.Contains(sq.Output(), "served") {
		t.Errorf("mallory's hand-over was taken:\n%s", sq.Output())
	}
	d.DockerOut("rm", "-f", "sq")
	sq.Stdin.Close()
}

// TestContainerShareHandover: npurun -m SIZE docker run hands its share
// of a shared device to the container, which runs, and the broker names
// the share's container (op container finds a lease by its share lock file
// too, not only by the device's whole lease), as it does a whole lease's.
func TestContainerShareHandover(t *testing.T) {
	dev := harness.ContainerDev(t, 1)
	b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 1, "\n[share]\npools = \"all\"\ncapacity = \"8G\"\nmargin = \"0\"\n"))
	d := harness.StartDockerd(t, b, "")
	code, out := harness.ExitCode(t, harness.NpurunIn(b, harness.ContainerClient(b, dev), "-m", "1G", harness.DockerBin, "-H", "unix://"+d.Sock, "run", "--rm", "local/mini", "sh", "-c", "echo devices=$NPURUN_DEVICES"))
	if code != 0 || !strings.Contains(out, "devices=0") {
		t.Fatalf("npurun -m 1G docker run: exit %d, want 0 and the share's device in the container\n%s", code, out)
	}
	code, out = harness.ExitCode(t, harness.NpurunIn(b, harness.ContainerClient(b, dev), "-m", "1G", harness.DockerBin, "-H", "unix://"+d.Sock, "run", "-d", "--name", "shared", "local/mini", "sleep", "600"))
	if code != 0 {
		t.Fatalf("npurun -m 1G docker run -d: exit %d\n%s", code, out)
	}
	cid := strings.TrimSpace(out)
	sh := deviceOf(t, b.Board(t), 0).Shares
	if len(sh) != 1 || sh[0].Kind != wire.KindContainer || sh[0].Container == nil || sh[0].Container.ID != cid || sh[0].Container.Name != "shared" {
		t.Errorf("npu 0's shares: %+v, want one, of kind container, naming container shared (%.12s)", sh, cid)
	}
}
