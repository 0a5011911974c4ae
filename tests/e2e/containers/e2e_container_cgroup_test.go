package containers

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// containerCgroups is a parent control group of the test's own (removed,
// with what is left in it, when the test ends), or a skip (a failure
// under CI as root) where the machine has none.
func containerCgroups(t *testing.T) string {
	t.Helper()
	harness.NeedRoot(t)
	parent := harness.OwnCgroupParent(t)
	if parent == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true as root, and this machine has no cgroup v2 with cgroup.kill")
		}
		t.Skip("no cgroup v2 with cgroup.kill on this machine")
	}
	return parent
}

// mkCgroup makes the control group parent/rel (and those between).
func mkCgroup(t *testing.T, parent, rel string) string {
	t.Helper()
	dir := filepath.Join(parent, rel)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// inCgroup makes cmd start in control group dir (CLONE_INTO_CGROUP).
func inCgroup(t *testing.T, cmd *exec.Cmd, dir string) *exec.Cmd {
	t.Helper()
	cg, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cg.Close() })
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(cg.Fd())
	return cmd
}

// TestContainerBrokerInContainer (issue 27.27): a broker that runs in a
// container names the container of the holders in another one, and not its
// own on the processes that run beside it.
func TestContainerBrokerInContainer(t *testing.T) {
	parent := containerCgroups(t)
	own, other := containerID('c'), containerID('d')
	ownCg := mkCgroup(t, parent, "docker/"+own)
	app := mkCgroup(t, ownCg, "app")
	otherCg := mkCgroup(t, parent, "docker/"+other)
	b := harness.NewBroker(t, harness.FakeConfig(2))
	b.StartIn = ownCg
	b.Start()
	for id, cg := range map[string]string{"0": app, "1": otherCg} {
		p := harness.StartProc(t, "holder in "+cg, inCgroup(t, b.Npurun("-d", id, "--", "sh", "-c", "echo held; exec sleep 600"), cg))
		p.WaitLine("held")
	}
	w := harness.WatchBoards(t, b, nil)
	bd, _ := w.NextWithin(harness.ScanTimeout, "both leases' holders, npu 1's in its container", func(bd *wire.Board) bool {
		l0, l1 := deviceOf(t, bd, 0).Lease, deviceOf(t, bd, 1).Lease
		if l0 == nil || l1 == nil || len(l0.Holders) == 0 || len(l1.Holders) == 0 {
			return false
		}
		for _, h := range l1.Holders {
			if h.Container == nil || h.Container.ID != other {
				return false
			}
		}
		return true
	})
	for _, h := range deviceOf(t, bd, 0).Lease.Holders {
		if h.Container != nil {
			t.Errorf("npu 0's holder %d, in the broker's own container, is shown in container %+v", h.PID, h.Container)
		}
	}
	if table := b.Status(t); strings.Contains(table, own[:12]) {
		t.Errorf("the table names the broker's own container:\n%s", table)
	}
}

// TestContainerUserCgroupNotContainer (issue 27.2): a user who makes a
// group named docker-ID.scope in her delegated subtree (as systemd gives
// her under user@UID.service), with the id of a container that holds a
// lease, and opens the lease's device from a process she moves there, is
// not taken for one of the container's processes: her use is reported as
// hers, in no container; and a process in a group of that name elsewhere
// than the one the runtime saw the container made in is no holder of its.
func TestContainerUserCgroupNotContainer(t *testing.T) {
	parent := containerCgroups(t)
	alice := harness.NewUser(t)
	dev := harness.FakeDev(t, 1)
	open := harness.Opener(t)
	cid := containerID('e')
	engine := mkCgroup(t, parent, "system.slice/docker-"+cid+".scope")
	// Her subtree, delegated as systemd delegates it: the group and its
	// files are hers.
	delegated := mkCgroup(t, parent, fmt.Sprintf("user.slice/user-%d.slice/user@%d.service", alice.UID, alice.UID))
	if err := os.Chmod(parent, 0o755); err != nil { // made 0700; /sys/fs/cgroup's groups are 0755
		t.Fatal(err)
	}
	for _, f := range []string{"", "cgroup.procs", "cgroup.threads", "cgroup.subtree_control"} {
		if err := os.Chown(filepath.Join(delegated, f), int(alice.UID), int(alice.GID)); err != nil {
			t.Fatal(err)
		}
	}
	b := harness.StartBroker(t, harness.AscendConfig(dev, 1, "[status]\nscan_interval = \"1s\"\nunleased_grace = \"1s\"\n"))
	// The container: root's processes in the engine's group, holding npu
	// 0's lease and using its node.
	c := harness.StartProc(t, "container", inCgroup(t, b.Npurun("-d", "0", "--", "sh", "-c", open+" "+dev+"/davinci0 & echo held; read x; kill $!"), engine))
	c.WaitLine("held")
	harness.OpenedPID(t, c, dev+"/davinci0")
	// Alice, in her subtree, makes the container's name and moves there.
	fake := filepath.Join(delegated, "docker-"+cid+".scope")
	script := fmt.Sprintf("mkdir %s && echo $$ > %s/cgroup.procs && exec %s %s/davinci0", fake, fake, open, dev)
	a := harness.StartProc(t, "alice's", inCgroup(t, alice.As(exec.Command("sh", "-c", script), "/"), delegated))
	pid := harness.OpenedPID(t, a, dev+"/davinci0")
	if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid)); err != nil || !strings.Contains(string(data), "/docker-"+cid+".scope") {
		t.Fatalf("alice's process is not in her docker-%s.scope: %q, %v", cid[:12], data, err)
	}
	w := harness.WatchBoards(t, b, nil)
	bd, _ := w.NextWithin(harness.ScanTimeout, "alice's use of npu 0 reported", func(bd *wire.Board) bool {
		return slices.Contains(harness.UnleasedPIDs(bd, 0), pid)
	})
	for _, u := range bd.Unleased {
		if u.PID == pid && (u.User != alice.Name || u.Container != nil) {
			t.Errorf("alice's use: %+v, want hers, in no container", u)
		}
	}
}
