package harness

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/container"
)

// The container tests run Debian's Docker (dockerd with its own
// containerd) and Podman, started here without systemd, on files of the
// test's own: nothing of /etc/docker, /var/lib/docker, /etc/containers or
// /var/lib/containers is read or written. dockerd and containerd write
// /run/docker/plugins and /run/containerd/s whatever their options say,
// so they run in a mount namespace of their own whose /run is a tmpfs
// (engineNS); podman is told every path (its containers.conf and
// storage.conf by CONTAINERS_CONF and CONTAINERS_STORAGE_CONF, its runc's
// state by a wrapper) and runs containers from a root file system
// directory (--rootfs), so that it keeps no image cache. Images and root
// file systems are made from busybox-static. The fake device nodes have a
// major number no driver has (so that a container that may open one gets
// ENXIO, one that may not EPERM) and outside Docker's default allow list.

// Where Debian's engines are. /usr/local/bin may hold another docker
// client: the tests name these.
const (
	DockerBin  = "/usr/bin/docker"
	DockerdBin = "/usr/sbin/dockerd"
	PodmanBin  = "/usr/bin/podman"
	BusyboxBin = "/bin/busybox"
)

// ContainerMajor is the major number of the fake devices' nodes: no
// driver's, and not in Docker's default device rules.
const ContainerMajor = 507

// NeedEngines skips a test that needs docker.io, podman and
// busybox-static (as root), except in CI, where that is a failure.
func NeedEngines(t testing.TB, engines ...string) {
	t.Helper()
	NeedRoot(t)
	need := map[string]string{"docker": DockerBin, "dockerd": DockerdBin, "podman": PodmanBin, "busybox": BusyboxBin}
	for _, e := range append(engines, "busybox") {
		for _, name := range []string{e, e + "d"} {
			p, ok := need[name]
			if !ok {
				continue
			}
			err := statBin(p)
			if err != nil {
				msg := fmt.Sprintf("needs %s (apt-get install docker.io podman busybox-static): %v", p, err)
				if os.Getenv("CI") == "true" {
					t.Fatal(msg)
				}
				t.Skip(msg)
			}
		}
	}
}

// statBin checks that p is there, and for busybox that it is static: an
// image has no C library for it.
func statBin(p string) error {
	if _, err := os.Stat(p); err != nil {
		return err
	}
	if p != BusyboxBin {
		return nil
	}
	f, err := elf.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is linked dynamically (the busybox package's, not busybox-static's)", p)
		}
	}
	return nil
}

// ContainerDev makes the fake device tree for containers: davinci0..n-1
// and the three control nodes, of major ContainerMajor, minors base+0..
// and base+100.. (base keeps two tests' trees apart).
func ContainerDev(t testing.TB, n int) string {
	t.Helper()
	base := uint32(os.Getpid()%1000) * 200
	nodes := map[string]uint64{}
	for i := range n {
		nodes["davinci"+strconv.Itoa(i)] = unix.Mkdev(ContainerMajor, base+uint32(i))
	}
	for i, name := range []string{"davinci_manager", "devmm_svm", "hisi_hdc"} {
		nodes[name] = unix.Mkdev(ContainerMajor, base+100+uint32(i))
	}
	return MkNodes(t, nodes)
}

// ContainerConfig is the broker's (and npurun-runtime's) configuration for
// dev: vendor ascend, n devices, the runtime's records in a directory of
// the test's, extra appended.
func ContainerConfig(t testing.TB, dev string, n int, extra string) string {
	t.Helper()
	return AscendConfig(dev, n, fmt.Sprintf("\n[tasks]\nkill_grace = \"1s\"\n\n[containers]\nstate_dir = %q\n%s", filepath.Join(SharedDir(t), "containers"), extra))
}

// rootfs is a root file system of busybox-static, made once.
var rootfs = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "npurun-rootfs-")
	if err != nil {
		return "", err
	}
	for _, d := range []string{"bin", "dev", "proc", "sys", "tmp", "etc", "m"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return "", err
		}
	}
	data, err := os.ReadFile(BusyboxBin)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), data, 0o755); err != nil {
		return "", err
	}
	for _, name := range []string{"sh", "true", "cat", "ls", "sleep", "echo", "readlink", "test", "rm", "mknod", "id", "touch", "stat", "env"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", name)); err != nil {
			return "", err
		}
	}
	return dir, nil
})

// RemoveRootfs removes the root file system, where a test made it.
func RemoveRootfs() {
	if made.Load() {
		if dir, err := rootfs(); err == nil {
			os.RemoveAll(dir)
		}
	}
}

// made says whether a test asked for the root file system.
var made atomic.Bool

func ContainerRootfs(t testing.TB) string {
	made.Store(true)
	t.Helper()
	dir, err := rootfs()
	if err != nil {
		t.Fatalf("root file system: %v", err)
	}
	return dir
}

// engineNS is a mount namespace with a tmpfs on /run, held by a sleeping
// process, for the engines' daemons to write /run in.
type engineNS struct {
	holder *Proc
}

func newEngineNS(t testing.TB) *engineNS {
	t.Helper()
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
		"mount -t tmpfs -o mode=0755 npurun-test /run && echo ready && exec sleep 100000")
	p := StartProc(t, "engine namespace", cmd)
	p.WaitLine("ready")
	return &engineNS{holder: p}
}

// enter is cmd run in the namespace.
func (ns *engineNS) enter(name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--target", strconv.Itoa(ns.holder.Cmd.Process.Pid), "--mount", "--", name}, args...)...)
}

// Dockerd is a dockerd of the test's own, with npurun-runtime as its
// runtime "npurun" (for the broker b), and the image local/mini.
type Dockerd struct {
	t    testing.TB
	Dir  string
	Sock string
	ns   *engineNS
	proc *Proc
}

// StartDockerd starts a dockerd for broker b; extra goes into its
// daemon.json ("default-runtime": "npurun", say).
func StartDockerd(t testing.TB, b *Broker, extra string) *Dockerd {
	t.Helper()
	NeedEngines(t, "docker")
	dir := SharedDir(t)
	d := &Dockerd{t: t, Dir: dir, Sock: filepath.Join(dir, "docker.sock"), ns: newEngineNS(t)}
	conf := fmt.Sprintf(`{"deprecated-key-path": %q, %s"runtimes": {"npurun": {"path": %q, "runtimeArgs": ["--npurun-config", %q, "--npurun-socket", %q]}}}`,
		filepath.Join(dir, "key.json"), extra, b.Bin.Runtime, b.Conf, b.Socket)
	if err := os.WriteFile(filepath.Join(dir, "daemon.json"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	d.Start()
	t.Cleanup(d.stop)
	// The image, from the root file system.
	tar := exec.Command("tar", "-C", ContainerRootfs(t), "-c", ".")
	imp := d.Docker("import", "-", "local/mini")
	var err error
	if imp.Stdin, err = tar.StdoutPipe(); err != nil {
		t.Fatal(err)
	}
	if err := tar.Start(); err != nil {
		t.Fatal(err)
	}
	if out, err := imp.CombinedOutput(); err != nil {
		t.Fatalf("docker import: %v\n%s", err, out)
	}
	tar.Wait()
	return d
}

// Start starts dockerd (again, after Kill: in the same namespace, on the
// same files) and returns once it answers.
func (d *Dockerd) Start() {
	d.t.Helper()
	cmd := d.ns.enter(DockerdBin, "--config-file", filepath.Join(d.Dir, "daemon.json"),
		"--data-root", filepath.Join(d.Dir, "data"), "--exec-root", filepath.Join(d.Dir, "exec"),
		"--pidfile", filepath.Join(d.Dir, "dockerd.pid"), "-H", "unix://"+d.Sock,
		"--bridge", "none", "--iptables=false", "--ip-masq=false", "--userland-proxy=false", "--log-level", "warn")
	d.proc = StartProc(d.t, "dockerd", cmd)
	// Readiness of a daemon of someone else's is polled: it says nothing
	// we can wait on.
	deadline := time.Now().Add(EventTimeout)
	for {
		if err := d.Docker("version").Run(); err == nil {
			return
		}
		if d.proc.Exited() || time.Now().After(deadline) {
			d.t.Fatalf("dockerd does not answer; its output:\n%s", d.proc.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill kills dockerd with SIGKILL and waits for it to be gone; its
// containers run on.
func (d *Dockerd) Kill() {
	d.t.Helper()
	d.proc.Cmd.Process.Signal(syscall.SIGKILL)
	d.proc.Wait()
	// Its containerd dies with it (a parent-death signal, delivered in its
	// own time), and is left a zombie of init, which this machine's init
	// reaps only in a while; a dockerd started meanwhile finds its pid
	// file, takes the zombie (or the containerd still on its way out) for
	// a live containerd and waits for its socket in vain. Where init reaps
	// at once (systemd, tini) the pid is free: so it is made here, once
	// containerd has exited (its pidfd readable), not before: removing the
	// file only where it was a zombie already failed CI once.
	pidFile := filepath.Join(d.Dir, "exec", "containerd", "containerd.pid")
	data, err := os.ReadFile(pidFile)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return
	}
	if fd, err := unix.PidfdOpen(pid, 0); err == nil {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			n, err := unix.Poll(fds, int(EventTimeout.Milliseconds()))
			if err == unix.EINTR {
				continue
			}
			if err != nil || n == 0 {
				unix.Close(fd)
				d.t.Fatalf("containerd (pid %d) still runs %s after its dockerd was killed", pid, EventTimeout)
			}
			break
		}
		unix.Close(fd)
	}
	os.Remove(pidFile)
}

// Docker is a docker command for this dockerd.
func (d *Dockerd) Docker(args ...string) *exec.Cmd {
	return exec.Command(DockerBin, append([]string{"-H", "unix://" + d.Sock}, args...)...)
}

// DockerOut runs a docker command that must succeed and returns its
// output, trimmed.
func (d *Dockerd) DockerOut(args ...string) string {
	d.t.Helper()
	out, err := d.Docker(args...).CombinedOutput()
	if err != nil {
		d.t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// stop removes every container and stops dockerd (its containerd with it).
func (d *Dockerd) stop() {
	if d.proc != nil && !d.proc.Exited() {
		if out, err := d.Docker("ps", "-aq").Output(); err == nil && len(bytes.TrimSpace(out)) > 0 {
			d.Docker(append([]string{"rm", "-f"}, strings.Fields(string(out))...)...).Run()
		}
		d.proc.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.proc.Done:
		case <-time.After(EventTimeout):
			d.proc.Cmd.Process.Kill()
			<-d.proc.Done
		}
	}
	// Whatever is left (a dockerd that could not remove a container):
	// the containers' processes, by their cgroup, then the shims and
	// containerd, by their mount namespace.
	ids := map[string]bool{}
	if entries, err := os.ReadDir(filepath.Join(d.Dir, "data", "containers")); err == nil {
		for _, e := range entries {
			ids[e.Name()] = true
		}
	}
	ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", d.ns.holder.Cmd.Process.Pid))
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == d.ns.holder.Cmd.Process.Pid {
			continue
		}
		in, _ := ContainerOf(pid)
		mnt, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		if ids[in] || (ns != "" && mnt == ns) {
			d.t.Logf("killing pid %d, left behind by dockerd (container %.12s)", pid, in)
			unix.Kill(pid, unix.SIGKILL)
		}
	}
	if d.t.Failed() {
		d.t.Logf("dockerd's output:\n%s", d.proc.Output())
	}
}

// Podman is podman on files of the test's own.
type Podman struct {
	t   testing.TB
	Dir string
	env []string
}

// NewPodman prepares podman: its configuration, storage and runc state in
// a directory of the test's. With b, its runtime is npurun-runtime for
// broker b (in front of that runc).
func NewPodman(t testing.TB, b *Broker) *Podman {
	t.Helper()
	NeedEngines(t, "podman")
	dir := SharedDir(t)
	p := &Podman{t: t, Dir: dir}
	wrap := filepath.Join(dir, "runc")
	if b != nil {
		wrap = filepath.Join(dir, "npurun-runtime")
	}
	files := map[string]string{
		"runc": fmt.Sprintf("#!/bin/sh\nexec runc --root %s \"$@\"\n", filepath.Join(dir, "runc-state")),
		"containers.conf": fmt.Sprintf(`[containers]
default_ulimits = []
netns = "host"
cgroupns = "host"
[engine]
runtime = "test"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = %q
tmp_dir = %q
[engine.runtimes]
test = [%q]
[network]
network_config_dir = %q
`, filepath.Join(dir, "events.log"), filepath.Join(dir, "tmp"), wrap, filepath.Join(dir, "cni")),
		"storage.conf": fmt.Sprintf("[storage]\ndriver = \"vfs\"\nrunroot = %q\ngraphroot = %q\n", filepath.Join(dir, "runroot"), filepath.Join(dir, "graph")),
	}
	if b != nil {
		files["npurun-runtime"] = fmt.Sprintf("#!/bin/sh\nexec %s --npurun-config %s --npurun-socket %s --npurun-runc %s \"$@\"\n",
			b.Bin.Runtime, b.Conf, b.Socket, filepath.Join(dir, "runc"))
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	p.env = []string{"CONTAINERS_CONF=" + filepath.Join(dir, "containers.conf"), "CONTAINERS_STORAGE_CONF=" + filepath.Join(dir, "storage.conf")}
	t.Cleanup(func() {
		if out, err := p.Podman("ps", "-aq").Output(); err == nil && len(bytes.TrimSpace(out)) > 0 {
			p.Podman(append([]string{"rm", "-f"}, strings.Fields(string(out))...)...).Run()
		}
	})
	return p
}

// Env is podman's environment, added to env.
func (p *Podman) Env(env []string) []string { return append(slices.Clone(env), p.env...) }

// Podman is a podman command on this podman's files.
func (p *Podman) Podman(args ...string) *exec.Cmd {
	cmd := exec.Command(PodmanBin, args...)
	cmd.Env = p.Env(os.Environ())
	return cmd
}

// ContainerClient is the environment of npurun and task-submit for
// containers on broker b's devices in dev.
func ContainerClient(b *Broker, dev string) []string {
	return append(b.Env(), "NPURUN_DEV_DIR="+dev)
}

// NpurunIn is npurun ARGS with env.
func NpurunIn(b *Broker, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(b.Bin.Npurun, args...)
	cmd.Env = env
	return cmd
}

// LockHolders are the processes that have device id's current lock file
// of broker b open, but for the broker itself (which waits on a second
// open of it), by device and inode, in /proc.
func LockHolders(t testing.TB, b *Broker, id int) []int {
	t.Helper()
	var want unix.Stat_t
	if err := unix.Stat(filepath.Join(b.RunDir, "locks", "npu"+strconv.Itoa(id)+".lock"), &want); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == b.Pid() {
			continue
		}
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			var st unix.Stat_t
			if unix.Stat(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()), &st) == nil && st.Dev == want.Dev && st.Ino == want.Ino {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// ContainerOf names the container process pid is in ("" for none) and
// its command's name.
func ContainerOf(pid int) (id, comm string) {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	c, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if ref := container.FromCgroup(data); ref != nil {
		id = ref.ID
	}
	return id, strings.TrimSpace(string(c))
}

// OnlyContainerHolds fails the test unless device id's lease is held, and
// only by processes of container cid (and those allow names, by their
// command's name: podman's conmon).
func OnlyContainerHolds(t testing.TB, b *Broker, id int, cid string, allow ...string) {
	t.Helper()
	pids := LockHolders(t, b, id)
	if len(pids) == 0 {
		t.Fatalf("npu %d: nobody holds its lease; container %.12s should", id, cid)
	}
	inside := 0
	for _, pid := range pids {
		in, comm := ContainerOf(pid)
		switch {
		case in == cid:
			inside++
		case slices.Contains(allow, comm):
		default:
			t.Errorf("npu %d: pid %d (%s, container %q) holds its lease; only container %.12s should", id, pid, comm, in, cid)
		}
	}
	if inside == 0 {
		t.Errorf("npu %d: no process of container %.12s holds its lease (holders %v)", id, cid, pids)
	}
}

// LeaseHeld tells whether device id is leased now: npurun --no-wait -d id
// is refused as busy.
func LeaseHeld(t testing.TB, b *Broker, id int) bool {
	t.Helper()
	code, out := ExitCode(t, b.Npurun("--no-wait", "-d", strconv.Itoa(id), "true"))
	switch code {
	case 75:
		return true
	case 0:
		return false
	}
	t.Fatalf("npurun --no-wait -d %d: exit %d\n%s", id, code, out)
	return false
}

// AwaitFree waits until device id is granted to a waiting npurun, and
// returns how long that took.
func AwaitFree(t testing.TB, b *Broker, id int) time.Duration {
	t.Helper()
	start := time.Now()
	p := StartProc(t, "npurun -d "+strconv.Itoa(id), b.Npurun("--timeout", "20s", "-d", strconv.Itoa(id), "true"))
	p.MustSucceed()
	return time.Since(start)
}
