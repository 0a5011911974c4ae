package containers

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// Issue 17: npurun docker run and npurun podman run hold the lease for
// exactly the container's life. The container tests share this workload:
// a shell in the container that says what it got, whether it may open its
// device (ENXIO: allowed, no driver) and another (EPERM: the device
// cgroup refuses), and waits on a FIFO of the test's on a shared volume.

// probe is the container's script: it prints "in DEVICES fd20=LINK",
// "own: ERROR" and "other: ERROR", then "waiting", and exits once a line
// comes on /m/go.
const probe = `echo "in $NPURUN_DEVICES lease=$NPURUN_LEASE visible=$ASCEND_RT_VISIBLE_DEVICES fd20=$(readlink /proc/self/fd/20)"
echo "own: $(cat /dev/davinci$NPURUN_DEVICES 2>&1)"
mknod /tmp/other c $1 $2 && echo "other: $(cat /tmp/other 2>&1)"
echo waiting
read x < /m/go
echo done`

// fifo makes the FIFO go in a new shared directory, for /m.
func fifo(t *testing.T) string {
	t.Helper()
	dir := harness.SharedDir(t)
	if err := unix.Mkfifo(filepath.Join(dir, "go"), 0o666); err != nil {
		t.Fatal(err)
	}
	return dir
}

// releaseProbe lets the probe in a container of dir go on to its end.
func releaseProbe(t *testing.T, dir string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, "go"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("go\n")
	f.Close()
}

// otherNode is the major and minor of dev's davinci<id>, as words for
// the probe.
func otherNode(t *testing.T, dev string, id int) []string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dev, "davinci"+strconv.Itoa(id)), &st); err != nil {
		t.Fatal(err)
	}
	return []string{strconv.Itoa(int(unix.Major(st.Rdev))), strconv.Itoa(int(unix.Minor(st.Rdev)))}
}

// TestContainerDockerForeground: npurun docker run (attached) gives the
// container its device's node and the control nodes, the variables as
// inside numbers them, and the lease at descriptor 20; the container's
// processes, and nothing else, hold it; it ends with the container.
func TestContainerDockerForeground(t *testing.T) {
	dev := harness.ContainerDev(t, 2)
	b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 2, ""))
	d := harness.StartDockerd(t, b, "")
	m := fifo(t)
	args := append([]string{"-d", "1", harness.DockerBin, "-H", "unix://" + d.Sock, "run", "--rm", "-v", m + ":/m", "local/mini", "sh", "-c", probe, "probe"}, otherNode(t, dev, 0)...)
	p := harness.StartProc(t, "npurun docker run", harness.NpurunIn(b, harness.ContainerClient(b, dev), args...))
	line := p.WaitLine("in ")
	if want := "in 1 lease=1:20 visible=0 fd20=" + filepath.Join(b.RunDir, "locks", "npu1.lock"); line != want {
		t.Errorf("the container got %q, want %q", line, want)
	}
	if own := p.WaitLine("own:"); !strings.Contains(own, "No such device or address") {
		t.Errorf("its own device: %q, want ENXIO (may open it; no driver)", own)
	}
	if other := p.WaitLine("other:"); !strings.Contains(other, "Operation not permitted") {
		t.Errorf("another device: %q, want EPERM (the device cgroup refuses it)", other)
	}
	p.WaitLine("waiting")
	cid := d.DockerOut("ps", "-q", "--no-trunc")
	harness.OnlyContainerHolds(t, b, 1, cid)
	if !harness.LeaseHeld(t, b, 1) {
		t.Fatal("npu 1 is free while its container runs")
	}
	releaseProbe(t, m)
	p.MustSucceed()
	if harness.LeaseHeld(t, b, 1) {
		t.Error("npu 1 is still leased after its container ended")
	}
}

// TestContainerDockerDetached: with -d, npurun ends as docker run does,
// at once, and the container holds its lease until docker kill ends it.
func TestContainerDockerDetached(t *testing.T) {
	dev := harness.ContainerDev(t, 1)
	b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 1, ""))
	d := harness.StartDockerd(t, b, "")
	code, out := harness.ExitCode(t, harness.NpurunIn(b, harness.ContainerClient(b, dev), harness.DockerBin, "-H", "unix://"+d.Sock, "run", "-d", "--name", "bg", "local/mini", "sleep", "600"))
	if code != 0 {
		t.Fatalf("npurun docker run -d: exit %d\n%s", code, out)
	}
	cid := strings.TrimSpace(out)
	harness.OnlyContainerHolds(t, b, 0, cid)
	if !harness.LeaseHeld(t, b, 0) {
		t.Fatal("npu 0 is free while its detached container runs")
	}
	waiter := harness.StartProc(t, "npurun -d 0", b.Npurun("-v", "-d", "0", "sh", "-c", "echo granted"))
	waiter.WaitLine("waiting for")
	killed := time.Now()
	d.DockerOut("kill", "bg")
	waiter.WaitLine("granted")
	t.Logf("npu 0 granted %s after docker kill", time.Since(killed).Round(time.Millisecond))
	waiter.MustSucceed()
}

// TestContainerDockerdKilled: the container's processes hold the lease,
// not the engine: a SIGKILL of dockerd leaves it held while the container
// runs; the restarted dockerd ends the container (no live-restore), and
// the lease with it.
func TestContainerDockerdKilled(t *testing.T) {
	dev := harness.ContainerDev(t, 1)
	b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 1, ""))
	d := harness.StartDockerd(t, b, "")
	cid := d.DockerOut("version", "-f", "{{.Server.Version}}") // answers
	_ = cid
	code, out := harness.ExitCode(t, harness.NpurunIn(b, harness.ContainerClient(b, dev), harness.DockerBin, "-H", "unix://"+d.Sock, "run", "-d", "local/mini", "sleep", "600"))
	if code != 0 {
		t.Fatalf("npurun docker run -d: exit %d\n%s", code, out)
	}
	cid = strings.TrimSpace(out)
	d.Kill()
	harness.OnlyContainerHolds(t, b, 0, cid)
	if !harness.LeaseHeld(t, b, 0) {
		t.Fatal("npu 0 is free after dockerd was killed, while its container runs")
	}
	waiter := harness.StartProc(t, "npurun -d 0", b.Npurun("-v", "-d", "0", "sh", "-c", "echo granted"))
	waiter.WaitLine("waiting for")
	d.Start()
	waiter.WaitLine("granted")
	waiter.MustSucceed()
	if pids := harness.LockHolders(t, b, 0); len(pids) != 0 {
		t.Errorf("npu 0 held by %v after the restarted dockerd ended its container", pids)
	}
}

// TestContainerDockerExec: a process that docker exec starts in the
// container may open the container's device (its own lease's), and the
// lease stays the container's before, during and after.
func TestContainerDockerExec(t *testing.T) {
	dev := harness.ContainerDev(t, 1)
	b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 1, ""))
	d := harness.StartDockerd(t, b, "")
	code, out := harness.ExitCode(t, harness.NpurunIn(b, harness.ContainerClient(b, dev), harness.DockerBin, "-H", "unix://"+d.Sock, "run", "-d", "--name", "ex", "local/mini", "sleep", "600"))
	if code != 0 {
		t.Fatalf("npurun docker run -d: exit %d\n%s", code, out)
	}
	cid := strings.TrimSpace(out)
	got := d.DockerOut("exec", "ex", "sh", "-c", `echo "$NPURUN_DEVICES $(cat /dev/davinci0 2>&1)"`)
	if !strings.HasPrefix(got, "0 ") || !strings.Contains(got, "No such device or address") {
		t.Errorf("docker exec: %q, want the device's variables and ENXIO opening it", got)
	}
	harness.OnlyContainerHolds(t, b, 0, cid)
	d.DockerOut("rm", "-f", "ex")
	harness.AwaitFree(t, b, 0)
}

// tailLog follows file (made empty now) as a process whose lines are
// events.
func tailLog(t *testing.T, file string) *harness.Proc {
	t.Helper()
	if err := os.WriteFile(file, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	return harness.StartProc(t, "tail "+filepath.Base(file), exec.Command("tail", "-n", "+1", "-F", file))
}

// markerScript marks device $NPURUN_DEVICES's use with an O_EXCL file in
// /m (set -C: the shell creates with O_EXCL), and says COLLISION in
// /m/log where the file exists already: two users of one device at once.
const markerScript = `mark() { for d in $(echo $NPURUN_DEVICES | sed 's/,/ /g'); do (set -C; : > /m/npu$d) 2>/dev/null || echo "COLLISION npu$d $1" >> /m/log; done; }
unmark() { for d in $(echo $NPURUN_DEVICES | sed 's/,/ /g'); do rm -f /m/npu$d; done; }
`

// TestContainerRestartAlways: a container restarted by its engine gets a
// new lease of its devices before it runs, asked on behalf of its owner
// (the user whose npurun started it), waiting in line for them as any
// request: it never runs on them while another holds them.
func TestContainerRestartAlways(t *testing.T) {
	dev := harness.ContainerDev(t, 1)
	b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 1, ""))
	d := harness.StartDockerd(t, b, "")
	alice := harness.NewUser(t)
	// alice may use this dockerd (as the docker group would let her).
	if err := os.Chown(d.Sock, int(alice.UID), -1); err != nil {
		t.Fatal(err)
	}
	m := fifo(t)
	log := tailLog(t, filepath.Join(m, "log"))
	script := markerScript + `n=$(cat /m/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /m/n
mark run$n
echo "run $n fd20=$(readlink /proc/self/fd/20)" >> /m/log
[ $n -eq 1 ] && read x < /m/go
[ $n -ge 2 ] && exec sleep 600
unmark; exit 1`
	env := append(harness.ContainerClient(b, dev), "DOCKER_CONFIG="+harness.SharedDir(t))
	cmd := alice.As(harness.NpurunIn(b, env, harness.DockerBin, "-H", "unix://"+d.Sock, "run", "-d", "--restart=always", "--name", "rs", "-v", m+":/m", "local/mini", "sh", "-c", script), m)
	code, out := harness.ExitCode(t, cmd)
	if code != 0 {
		t.Fatalf("npurun docker run -d --restart=always: exit %d\n%s", code, out)
	}
	lock := filepath.Join(b.RunDir, "locks", "npu0.lock")
	log.WaitLine("run 1 fd20=" + lock)
	other := harness.StartProc(t, "npurun -d 0", b.Npurun("-v", "-d", "0", "sh", "-c", markerScript+`mark host; echo held; read x; unmark`))
	other.WaitLine("waiting for")
	w := harness.WatchBoards(t, b, nil)
	releaseProbe(t, m)
	other.WaitLine("held")
	// The restarted container's request waits behind the holder, for alice.
	w.Next("the restart waiting for npu 0, for "+alice.Name, func(bd *wire.Board) bool {
		for _, l := range bd.Waiting {
			for _, wi := range l.Waiters {
				if wi.User == alice.Name && slices.Contains(wi.Devices, 0) {
					return true
				}
			}
		}
		return false
	})
	other.Stdin.Close()
	other.MustSucceed()
	log.WaitLine("run 2 fd20=" + lock)
	bd := b.Board(t)
	if l := bd.Devices[0].Lease; l == nil || l.User != alice.Name {
		t.Errorf("npu 0 after the restart: %+v, want a lease of %s", bd.Devices[0].Lease, alice.Name)
	}
	harness.OnlyContainerHolds(t, b, 0, d.DockerOut("inspect", "-f", "{{.Id}}", "rs"))
	if strings.Contains(log.Output(), "COLLISION") {
		t.Errorf("two users of npu 0 at once:\n%s", log.Output())
	}
	d.DockerOut("rm", "-f", "rs")
	harness.AwaitFree(t, b, 0)
}

// TestContainerNeverShared: containers started at once by npurun on two
// devices never use one device together; each marks its device with an
// O_EXCL file on a shared volume while it runs.
func TestContainerNeverShared(t *testing.T) {
	dev := harness.ContainerDev(t, 2)
	b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 2, ""))
	d := harness.StartDockerd(t, b, "")
	m := harness.SharedDir(t)
	const runs = 6
	script := markerScript + `mark $1; echo "ran $NPURUN_DEVICES" >> /m/log; sleep 0.3; unmark`
	var ps []*harness.Proc
	for i := range runs {
		ps = append(ps, harness.StartProc(t, "container "+strconv.Itoa(i), harness.NpurunIn(b, harness.ContainerClient(b, dev),
			harness.DockerBin, "-H", "unix://"+d.Sock, "run", "--rm", "-v", m+":/m", "local/mini", "sh", "-c", script, "sh", strconv.Itoa(i))))
	}
	for _, p := range ps {
		p.MustSucceed()
	}
	data, err := os.ReadFile(filepath.Join(m, "log"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(string(data), "ran ") != runs || strings.Contains(string(data), "COLLISION") {
		t.Errorf("want %d runs and no collision:\n%s", runs, data)
	}
}

// TestContainerWithoutLease: with npurun-runtime as the engine's runtime,
// a container that may open a device without a lease is what
// [containers] unleased says: refused (the default), given a lease of
// its own, or let run.
func TestContainerWithoutLease(t *testing.T) {
	dev := harness.ContainerDev(t, 2)
	for _, tc := range []struct {
		name   string
		policy string
		want   string // in the output
		code   int
	}{
		{"refuse", "", "npurun-runtime: container ", 125},
		{"lease", `unleased = "lease"`, "fd20=", 0},
		{"report", `unleased = "report"`, "fd20=\n", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 2, tc.policy))
			d := harness.StartDockerd(t, b, `"default-runtime": "npurun", `)
			code, out := harness.ExitCode(t, d.Docker("run", "--rm", "--device", filepath.Join(dev, "davinci1")+":/dev/davinci1", "local/mini",
				"sh", "-c", `echo "fd20=$(readlink /proc/self/fd/20)"`))
			if code != tc.code || !strings.Contains(out, tc.want) {
				t.Fatalf("docker run --device davinci1: exit %d, want %d with %q:\n%s", code, tc.code, tc.want, out)
			}
			switch tc.policy {
			case "":
				if !strings.Contains(out, "it may open npu 1 ("+filepath.Join(dev, "davinci1")+") without a lease: start it with npurun docker run") {
					t.Errorf("the engine's error does not say why:\n%s", out)
				}
			case `unleased = "lease"`:
				if !strings.Contains(out, "fd20="+filepath.Join(b.RunDir, "locks", "npu1.lock")) {
					t.Errorf("the container did not hold npu 1's lease:\n%s", out)
				}
			}
			// A container that asks for no device runs as ever.
			if out := d.DockerOut("run", "--rm", "local/mini", "echo", "plain"); out != "plain" {
				t.Errorf("a container without devices: %q", out)
			}
		})
	}
}

// TestContainerRefusals: what npurun refuses, before any lease: an
// engine's command that starts no container, a run whose container would
// escape its lease.
func TestContainerRefusals(t *testing.T) {
	dev := harness.ContainerDev(t, 2)
	b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 2, ""))
	// Were a refusal to fail, the engine would run: on files of the
	// test's (podman), or against no daemon (docker), never the machine's.
	pm := harness.NewPodman(t, nil)
	env := pm.Env(harness.ContainerClient(b, dev))
	none := "unix://" + filepath.Join(harness.SharedDir(t), "none.sock")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"docker", "-H", none, "ps"}, "npurun: docker ps: not a run: npurun hands a lease to a container that docker run starts"},
		{[]string{"docker", "-H", none, "run", "--privileged", "img"}, "npurun: docker run --privileged opens every device to the container, and the lease holds npu 0 only"},
		{[]string{"docker", "-H", none, "run", "--runtime", "runc", "img"}, `npurun: docker run --runtime runc: the lease reaches the container through npurun's runtime ("npurun"), which runs runc itself`},
		{[]string{"docker", "-H", none, "run", "--device", filepath.Join(dev, "davinci1"), "img"}, "is not in the lease, which holds npu 0"},
		{[]string{"podman", "run", "--restart=always", "img"}, "npurun: podman run --restart always: podman would start the container again without its lease"},
		{[]string{"podman", "run", "--preserve-fds", "1", "img"}, "npurun: podman run --preserve-fds: npurun passes the lease's descriptors itself"},
		{[]string{"--container", "docker", "/bin/true", "ps"}, "npurun: docker ps: not a run"},
	} {
		code, out := harness.ExitCode(t, harness.NpurunIn(b, env, append([]string{"-d", "0"}, tc.args...)...))
		if code != 2 || !strings.Contains(out, tc.want) {
			t.Errorf("npurun %s: exit %d, want 2 with %q:\n%s", strings.Join(tc.args, " "), code, tc.want, out)
		}
	}
	if harness.LeaseHeld(t, b, 0) {
		t.Error("a refused run left npu 0 leased")
	}
}

// TestContainerPodman: npurun podman run passes the lease with
// --preserve-fds, at 20 as everywhere; detached, the container holds it
// (and conmon, its monitor, which ends with it) until it ends.
func TestContainerPodman(t *testing.T) {
	dev := harness.ContainerDev(t, 2)
	b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 2, ""))
	pm := harness.NewPodman(t, nil)
	env := pm.Env(harness.ContainerClient(b, dev))
	m := fifo(t)
	args := append([]string{"-d", "1", harness.PodmanBin, "run", "-d", "--name", "pd", "-v", m + ":/m", "--rootfs", harness.ContainerRootfs(t), "sh", "-c", probe, "probe"}, otherNode(t, dev, 0)...)
	code, out := harness.ExitCode(t, harness.NpurunIn(b, env, args...))
	if code != 0 {
		t.Fatalf("npurun podman run -d: exit %d\n%s", code, out)
	}
	cid := strings.TrimSpace(out)
	logs := harness.StartProc(t, "podman logs -f", pm.Podman("logs", "-f", "pd"))
	if line, want := logs.WaitLine("in "), "in 1 lease=1:20 visible=0 fd20="+filepath.Join(b.RunDir, "locks", "npu1.lock"); line != want {
		t.Errorf("the container got %q, want %q", line, want)
	}
	if own := logs.WaitLine("own:"); !strings.Contains(own, "No such device or address") {
		t.Errorf("its own device: %q, want ENXIO", own)
	}
	if other := logs.WaitLine("other:"); !strings.Contains(other, "Operation not permitted") {
		t.Errorf("another device: %q, want EPERM", other)
	}
	logs.WaitLine("waiting")
	harness.OnlyContainerHolds(t, b, 1, cid, "conmon")
	waiter := harness.StartProc(t, "npurun -d 1", b.Npurun("-v", "-d", "1", "sh", "-c", "echo granted"))
	waiter.WaitLine("waiting for")
	releaseProbe(t, m)
	waiter.WaitLine("granted")
	waiter.MustSucceed()
}

// TestContainerTask: task-submit -- docker run runs the container as the
// task: the container holds the task's lease (handed over by the
// supervisor, as npurun does), and the task's time limit ends it, lease
// and all. A detached run is refused at once: the task would end, and its
// container with it.
func TestContainerTask(t *testing.T) {
	dev := harness.ContainerDev(t, 1)
	b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 1, ""))
	d := harness.StartDockerd(t, b, "")
	m := fifo(t)
	submit := func(args ...string) *exec.Cmd {
		cmd := b.TaskSubmit(args...)
		cmd.Env = harness.ContainerClient(b, dev)
		cmd.Dir = m
		return cmd
	}
	r := harness.RunTaskCmd(t, submit("-n", "1", "--", harness.DockerBin, "-H", "unix://"+d.Sock, "run", "-d", "local/mini", "true"))
	if r.Code != 2 || !strings.Contains(r.Stderr, "docker run --detach: a task's container runs attached") {
		t.Errorf("task-submit -- docker run -d: %s", r)
	}
	r = harness.RunTaskCmd(t, submit("--json", "-n", "1", "--time", "3s", "--", harness.DockerBin, "-H", "unix://"+d.Sock, "run", "--rm", "-v", m+":/m", "local/mini",
		"sh", "-c", `echo "task fd20=$(readlink /proc/self/fd/20)" > /m/go; exec sleep 600`))
	if r.Code != 0 {
		t.Fatalf("task-submit: %s", r)
	}
	var s struct{ ID uint64 }
	if err := json.Unmarshal([]byte(r.Stdout), &s); err != nil {
		t.Fatal(err)
	}
	got := harness.OpenFIFO(t, filepath.Join(m, "go"), os.O_RDONLY)
	line, _ := bufio.NewReader(got).ReadString('\n')
	if want := "task fd20=" + filepath.Join(b.RunDir, "locks", "npu0.lock") + "\n"; line != want {
		t.Errorf("the task's container says %q, want %q", line, want)
	}
	cid := d.DockerOut("ps", "-q", "--no-trunc")
	harness.OnlyContainerHolds(t, b, 0, cid)
	start := time.Now()
	res := harness.WaitTask(t, b, s.ID)
	ti := harness.ShowTask(t, b, s.ID)
	if !strings.Contains(ti.Reason, "time limit 3s reached") {
		t.Errorf("task %d ended %q (%s), want by its time limit", s.ID, ti.Reason, res)
	}
	harness.AwaitFree(t, b, 0)
	if pids := harness.LockHolders(t, b, 0); len(pids) != 0 {
		t.Errorf("npu 0 held by %v after the task ended", pids)
	}
	t.Logf("task ended (%d); its lease free %s after its container started", res.Code, time.Since(start).Round(time.Millisecond))
	// The container ended with the task: none of its processes is left
	// (docker removes it, --rm, in a while).
	for _, pid := range pidsOf(t) {
		if in, comm := harness.ContainerOf(pid); in == cid {
			t.Errorf("pid %d (%s) of the task's container runs on", pid, comm)
		}
	}
}

// pidsOf lists the processes in /proc.
func pidsOf(t testing.TB) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestCheckConfigDockerGroup: a restricted account in the docker group
// runs containers as root, which open any device: check-config warns,
// and the broker says so at its start.
func TestCheckConfigDockerGroup(t *testing.T) {
	harness.NeedEngines(t, "docker")
	student := harness.NewUser(t) // userdel takes it out of the group again
	if out, err := exec.Command("usermod", "-a", "-G", "docker", student.Name).CombinedOutput(); err != nil {
		t.Fatalf("usermod -a -G docker %s: %v\n%s", student.Name, err, out)
	}
	conf := harness.FakeConfig(1) + fmt.Sprintf("\n[restrict]\nusers = [%q]\n", student.Name)
	path := filepath.Join(harness.SharedDir(t), "npurun.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`[restrict] users: warning: restricted user %q is in group "docker", which may run containers as root (root in all but name): it opens any device without a lease`, student.Name)
	code, out := harness.ExitCode(t, exec.Command(harness.Bins(t).Broker, "check-config", path))
	if code != 0 || !strings.Contains(out, path+":6: "+want) {
		t.Errorf("check-config: exit %d, want 0 and\n%s:6: %s\ngot:\n%s", code, path, want, out)
	}
	b := harness.StartBroker(t, conf)
	b.WaitLog(0, want)
}

// TestContainerPodmanRuntime: with npurun-runtime as podman's runtime, the
// lease npurun podman run passes (--preserve-fds) goes through, checked,
// and a container that may open a device without one is refused, the
// reason in podman's error.
func TestContainerPodmanRuntime(t *testing.T) {
	dev := harness.ContainerDev(t, 2)
	b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 2, ""))
	pm := harness.NewPodman(t, b)
	env := pm.Env(harness.ContainerClient(b, dev))
	code, out := harness.ExitCode(t, harness.NpurunIn(b, env, harness.PodmanBin, "run", "--rm", "--rootfs", harness.ContainerRootfs(t), "sh", "-c", `echo "fd20=$(readlink /proc/self/fd/20)"`))
	if want := "fd20=" + filepath.Join(b.RunDir, "locks", "npu0.lock"); code != 0 || !strings.Contains(out, want) {
		t.Errorf("npurun podman run under npurun-runtime: exit %d, want 0 and %q:\n%s", code, want, out)
	}
	cmd := pm.Podman("run", "--rm", "--device", filepath.Join(dev, "davinci1")+":/dev/davinci1", "--rootfs", harness.ContainerRootfs(t), "true")
	code, out = harness.ExitCode(t, cmd)
	if want := "it may open npu 1 (" + filepath.Join(dev, "davinci1") + ") without a lease: start it with npurun podman run"; code == 0 || !strings.Contains(out, want) {
		t.Errorf("podman run --device without npurun: exit %d, want a failure saying %q:\n%s", code, want, out)
	}
	if harness.LeaseHeld(t, b, 0) || harness.LeaseHeld(t, b, 1) {
		t.Error("a lease is left held")
	}
}

// TestContainerDockerErrorPassedOn (issue 27.20): where docker run fails
// for a reason of its own (an image it cannot find), npurun passes its
// error and exit status on and does not blame the runtime's registration;
// where Docker does not know npurun's runtime, npurun says that is what
// failed.
func TestContainerDockerErrorPassedOn(t *testing.T) {
	dev := harness.ContainerDev(t, 1)
	b := harness.StartBroker(t, harness.ContainerConfig(t, dev, 1, ""))
	d := harness.StartDockerd(t, b, "")
	code, out := harness.ExitCode(t, harness.NpurunIn(b, harness.ContainerClient(b, dev), harness.DockerBin, "-H", "unix://"+d.Sock, "run", "--rm", "--pull=never", "local/none", "true"))
	if code != 125 || !strings.Contains(out, "local/none") {
		t.Errorf("npurun docker run of an image that is not there: exit %d, want docker's 125 and its error naming the image\n%s", code, out)
	}
	if strings.Contains(out, "runtime") {
		t.Errorf("npurun blames the runtime for docker's own error:\n%s", out)
	}
	harness.AwaitFree(t, b, 0)
	env := append(harness.ContainerClient(b, dev), "NPURUN_DOCKER_RUNTIME=unregistered")
	code, out = harness.ExitCode(t, harness.NpurunIn(b, env, harness.DockerBin, "-H", "unix://"+d.Sock, "run", "--rm", "local/mini", "true"))
	if code == 0 || !strings.Contains(out, `npurun: Docker has no runtime "unregistered"`) || !strings.Contains(out, "npurun: hint: register npurun-runtime") {
		t.Errorf("npurun docker run with a runtime Docker does not know: exit %d, want a failure naming the registration\n%s", code, out)
	}
}
