package containers

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// containerID is a container id of 64 hex digits, as Docker's.
func containerID(c byte) string { return strings.Repeat(string(c), 64) }

// TestContainerOp: the runtime's word (op container, with the lease's
// descriptors) makes an inline lease a container's (kind container, named,
// its user unchanged), and the accounting log counts it under kind
// container; a descriptor that is no lease's, a name that is not one, a
// caller naming another's lease or a container without a lease are
// refused, and leave the leases as they were; under show_commands = "own"
// other users see the container's id and not its name.
func TestContainerOp(t *testing.T) {
	harness.NeedRoot(t)
	alice := harness.NewUser(t)
	b := harness.StartBroker(t, harness.FakeConfig(3)+"[status]\nshow_commands = \"own\"\n")

	// root's lease, named: re-kinded.
	id := containerID('a')
	p := harness.StartProc(t, "contain", b.Npurun("-d", "0", b.Bin.Workload, "-contain", "docker/"+id+"/train"))
	p.WaitLine("ok")
	bd := b.Board(t)
	d0 := deviceOf(t, bd, 0)
	want := wire.ContainerRef{Engine: "docker", ID: id, Name: "train"}
	if d0.State != wire.DeviceContainer || d0.Lease == nil || d0.Lease.Kind != wire.KindContainer || d0.Lease.User != "root" {
		t.Fatalf("npu 0 after op container: %+v, want state and kind container, user root", d0)
	}
	if c := d0.Lease.Container; c == nil || *c != want {
		t.Errorf("lease.container = %+v, want %+v", c, want)
	}
	if table := b.Status(t); !strings.Contains(table, "container train (aaaaaaaaaaaa)") {
		t.Errorf("the table does not name the container:\n%s", table)
	}
	// show_commands = "own": another user sees the container's id, not
	// its name (a name can say what it runs, as a command does).
	st := alice.As(exec.Command(b.Bin.Broker, "status", "--json"), "/")
	st.Env = b.Env()
	out, err := st.Output()
	var seen wire.Board
	if err != nil || json.Unmarshal(out, &seen) != nil {
		t.Fatalf("status --json as %s: %v\n%s", alice.Name, err, out)
	}
	if c := deviceOf(t, &seen, 0).Lease.Container; c == nil || c.ID != id || c.Name != "" {
		t.Errorf("%s sees root's lease's container as %+v, want its id and no name", alice.Name, c)
	}

	// A descriptor of another file: refused, the lease stays inline.
	q := harness.StartProc(t, "contain a file", b.Npurun("-d", "1", b.Bin.Workload, "-contain", "docker/"+containerID('b')+"/x", "-contain-file", "/dev/null"))
	q.WaitLine("bad-request: descriptor 0 is not npu 1's current lease")
	if l := deviceOf(t, b.Board(t), 1).Lease; l == nil || l.Kind != wire.KindInline || l.Container != nil {
		t.Errorf("npu 1 after a descriptor that is no lease's: %+v, want an inline lease naming no container", l)
	}
	q.Stdin.Close()
	// A name that is not one.
	r := harness.StartProc(t, "contain a bad name", b.Npurun("-d", "2", b.Bin.Workload, "-contain", "Docker!/"+containerID('c')+"/x"))
	r.WaitLine("bad-request: container engine")
	// Another user, with root's lease's descriptors (inherited through
	// setpriv): it may name only its own leases.
	s := harness.StartProc(t, "contain another's", b.Npurun("-d", "1", "--", "setpriv", fmt.Sprintf("--reuid=%d", alice.UID), fmt.Sprintf("--regid=%d", alice.GID), "--clear-groups",
		b.Bin.Workload, "-contain", "docker/"+containerID('d')+"/x"))
	s.WaitLine("denied: uid " + fmt.Sprint(alice.UID) + " may name only its own leases' containers")
	// Without descriptors, as another user: denied too.
	none := alice.As(exec.Command(b.Bin.Workload, "-contain", "docker/"+containerID('e')+"/x", "-contain-none"), "/")
	none.Env = b.Env()
	u := harness.StartProc(t, "contain none", none)
	u.WaitLine("denied:")
	bd = b.Board(t)
	for _, id := range []int{1, 2} { // s's and r's
		if l := deviceOf(t, bd, id).Lease; l == nil || l.Kind != wire.KindInline || l.Container != nil {
			t.Errorf("npu %d after refused ops: %+v, want an inline lease naming no container", id, l)
		}
	}

	// Alice names her own lease.
	v := harness.StartProc(t, "alice's", alice.As(b.Npurun("-d", "2", "--", b.Bin.Workload, "-contain", "podman/"+containerID('f')+"/mine"), "/"))
	r.Stdin.Close()
	v.WaitLine("ok")
	if l := deviceOf(t, b.Board(t), 2).Lease; l == nil || l.Kind != wire.KindContainer || l.User != alice.Name || l.Container == nil || l.Container.Name != "mine" {
		t.Errorf("npu 2 named by its own user: %+v, want kind container, user %s, container mine", l, alice.Name)
	}

	// Usage counts root's lease under kind container.
	p.Stdin.Close()
	harness.AwaitFree(t, b, 0)
	c, err := wire.Dial(b.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rep, err := c.Usage(wire.UsageQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(rep.Rows, func(r wire.UsageRow) bool {
		return r.Kind == wire.KindContainer && r.User == "root" && r.Leases == 1
	}) {
		t.Errorf("usage has no row of kind container for root: %+v", rep.Rows)
	}
}

// TestContainerNameOwner (issue 27.6): a container named by root (the
// runtime) is not renamed by another user naming a lease of her own with
// its id, and a name with a bidirectional override or a control character
// is refused, as a task's name with one is (one check for both).
func TestContainerNameOwner(t *testing.T) {
	harness.NeedRoot(t)
	alice := harness.NewUser(t)
	b := harness.StartBroker(t, harness.FakeConfig(2))
	id := containerID('a')
	p := harness.StartProc(t, "root's", b.Npurun("-d", "0", b.Bin.Workload, "-contain", "docker/"+id+"/train"))
	p.WaitLine("ok")
	// Alice, with a lease of her own, names root's container.
	q := harness.StartProc(t, "alice renames", alice.As(b.Npurun("-d", "1", "--", b.Bin.Workload, "-contain", "docker/"+id+"/evil"), "/"))
	q.WaitLine("denied: uid " + fmt.Sprint(alice.UID) + " may not name container " + id[:12] + ": it is another user's")
	bd := b.Board(t)
	if c := deviceOf(t, bd, 0).Lease.Container; c == nil || c.Name != "train" {
		t.Errorf("root's lease's container after alice's try: %+v, want the name train", c)
	}
	if l := deviceOf(t, bd, 1).Lease; l == nil || l.Container != nil {
		t.Errorf("alice's lease after a refused name: %+v, want no container", l)
	}
	if table := b.Status(t); strings.Contains(table, "container evil") {
		t.Errorf("the table shows the name alice tried:\n%s", table)
	}
	q.Stdin.Close()
	harness.AwaitFree(t, b, 1)
	// Names that would reorder or break a table's row.
	for _, name := range []string{"tra\u202eniart", "a\u2066b", "x\u0007y", "l\u2028m"} {
		r := harness.StartProc(t, "bad name", b.Npurun("-d", "1", b.Bin.Workload, "-contain", "docker/"+containerID('b')+"/"+name))
		r.WaitLine("bad-request: container name")
		r.Stdin.Close()
		harness.AwaitFree(t, b, 1)
		dir := t.TempDir()
		code, out := harness.ExitCode(t, b.TaskSubmit("--name", name, "--log", dir+"/log", "--no-device", "--run", "true"))
		if code == 0 || !strings.Contains(out, "task name") {
			t.Errorf("task-submit --name %q: exit %d, want a refusal naming the task name\n%s", name, code, out)
		}
	}
	p.Stdin.Close()
}

// TestContainerOpOwner (issue 27.5): root's runtime names the user it took
// a hand-over from, and the broker refuses a lease of another user's: a
// squatter's lease is not the container's.
func TestContainerOpOwner(t *testing.T) {
	harness.NeedRoot(t)
	alice := harness.NewUser(t)
	b := harness.StartBroker(t, harness.FakeConfig(1))
	p := harness.StartProc(t, "not alice's", b.Npurun("-d", "0", b.Bin.Workload, "-contain", "docker/"+containerID('a')+"/x", "-contain-owner", alice.Name))
	p.WaitLine("denied: the lease of npu 0 is root's, not " + alice.Name + "'s")
	if l := deviceOf(t, b.Board(t), 0).Lease; l == nil || l.Container != nil {
		t.Errorf("npu 0 after a refused owner: %+v, want a lease in no container", l)
	}
	p.Stdin.Close()
	harness.AwaitFree(t, b, 0)
	q := harness.StartProc(t, "root's", b.Npurun("-d", "0", b.Bin.Workload, "-contain", "docker/"+containerID('a')+"/x", "-contain-owner", "root"))
	q.WaitLine("ok")
	q.Stdin.Close()
	// Only root names the owner.
	r := harness.StartProc(t, "alice names an owner", alice.As(b.Npurun("-d", "0", "--", b.Bin.Workload, "-contain", "docker/"+containerID('b')+"/x", "-contain-owner", alice.Name), "/"))
	r.WaitLine("denied: only root names the user")
	r.Stdin.Close()
}
