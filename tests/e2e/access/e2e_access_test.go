package access

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// TestRestrictedAccess: a restricted account opens a device node only while
// it holds a lease of that device, and the control nodes only while it
// holds any; an unrestricted account's access and an administrator's ACL
// entries are left as they are.
func TestRestrictedAccess(t *testing.T) {
	dev := harness.NewDevTree(t, 3)
	student, staff := harness.NewUser(t), harness.NewUser(t)
	b := harness.StartBroker(t, dev.Config("0-2", fmt.Sprintf("[restrict]\nusers = [%q]\n", student.Name)))
	// An administrator's entry, on a node the broker will touch.
	if out, err := exec.Command("setfacl", "-m", fmt.Sprintf("u:%d:rw", staff.UID), dev.Node("davinci2")).CombinedOutput(); err != nil {
		t.Fatalf("setfacl: %v: %s", err, out)
	}

	closed := func(when string, names ...string) {
		t.Helper()
		for _, n := range names {
			if harness.CanOpen(t, student, dev.Node(n)) {
				t.Errorf("%s: %s opens %s", when, student.Name, n)
			}
		}
	}
	closed("before any lease", "davinci0", "davinci1", "davinci2", "davinci_manager", "devmm_svm", "hisi_hdc")

	// Inside npurun -d 0: davinci0 and the control nodes open, the others
	// stay closed.
	script := `exec 3<>"$1/davinci0" && exec 4<>"$1/davinci_manager" && exec 5<>"$1/devmm_svm" && exec 6<>"$1/hisi_hdc" && echo "opened $NPURUN_DEVICES"
if (exec 7<>"$1/davinci1") 2>/dev/null; then echo "davinci1 opened"; fi`
	cmd := student.As(b.Npurun("-d", "0", "sh", "-c", script, "sh", dev.Dir), b.Dir)
	code, out := harness.ExitCode(t, cmd)
	if code != 0 || !strings.Contains(out, "opened 0") || strings.Contains(out, "davinci1 opened") {
		t.Fatalf("inside npurun -d 0: exit %d, output:\n%s", code, out)
	}
	harness.WaitFree(t, b, 0)
	closed("after the lease", "davinci0", "davinci_manager", "devmm_svm", "hisi_hdc")

	// An unrestricted account's lease changes no ACL.
	before := harness.ACLText(t, dev.Node("davinci1"))
	h := harness.LeaseAs(t, b, staff, "staff", "-d", "1")
	if got := harness.ACLText(t, dev.Node("davinci1")); got != before {
		t.Errorf("an unrestricted lease changed the ACL:\n%s\nwas\n%s", got, before)
	}
	if strings.Contains(harness.ACLText(t, dev.Node("davinci_manager")), fmt.Sprint(staff.UID)) {
		t.Error("an unrestricted lease put an entry on a control node")
	}
	h.Release()

	// The administrator's entry outlives a restricted lease of its node.
	h = harness.LeaseAs(t, b, student, "student on 2", "-d", "2")
	if !harness.CanOpen(t, student, dev.Node("davinci2")) {
		t.Error("a lease of davinci2 does not open it")
	}
	h.Release()
	harness.WaitFree(t, b, 2)
	closed("after the lease of davinci2", "davinci2", "davinci_manager")
	if want := fmt.Sprintf("user:%d:rw-", staff.UID); !strings.Contains(harness.ACLText(t, dev.Node("davinci2")), want) {
		t.Errorf("the administrator's entry %s is gone:\n%s", want, harness.ACLText(t, dev.Node("davinci2")))
	}
	if !harness.CanOpen(t, staff, dev.Node("davinci2")) {
		t.Error("the administrator's entry no longer opens davinci2")
	}
}

// TestRestrictedAccessAcrossKill: the broker killed with SIGKILL during two
// leases, one of which ends while it is down: after the restart the held
// lease keeps its access, the ended one has lost it, and the held one loses
// it when it ends.
func TestRestrictedAccessAcrossKill(t *testing.T) {
	dev := harness.NewDevTree(t, 2)
	student := harness.NewUser(t)
	b := harness.StartBroker(t, dev.Config("0-1", fmt.Sprintf("[restrict]\nusers = [%q]\n", student.Name)))

	held := harness.LeaseAs(t, b, student, "held", "-d", "0")
	ended := harness.LeaseAs(t, b, student, "ended", "-d", "1")
	for _, n := range []string{"davinci0", "davinci1", "davinci_manager"} {
		if !harness.CanOpen(t, student, dev.Node(n)) {
			t.Fatalf("during the leases %s cannot open %s", student.Name, n)
		}
	}
	b.Kill()
	ended.Release() // nobody watches: its entry is still there
	if !harness.CanOpen(t, student, dev.Node("davinci1")) {
		t.Fatal("the ACL entry went with no broker to remove it: the test shows nothing")
	}
	b.Start()
	if harness.CanOpen(t, student, dev.Node("davinci1")) {
		t.Error("after the restart the ended lease's device still opens")
	}
	for _, n := range []string{"davinci0", "davinci_manager", "devmm_svm"} {
		if !harness.CanOpen(t, student, dev.Node(n)) {
			t.Errorf("after the restart the held lease lost %s", n)
		}
	}
	held.Release()
	harness.WaitFree(t, b, 0)
	for _, n := range []string{"davinci0", "davinci1", "davinci_manager", "devmm_svm", "hisi_hdc"} {
		if harness.CanOpen(t, student, dev.Node(n)) {
			t.Errorf("after every lease ended %s still opens %s", student.Name, n)
		}
	}
}

// TestRestrictedTask: a detached task of a restricted account opens its
// device: the entry is there before the task's command runs.
func TestRestrictedTask(t *testing.T) {
	dev := harness.NewDevTree(t, 1)
	student := harness.NewUser(t)
	b := harness.StartBroker(t, dev.Config("0", fmt.Sprintf("[restrict]\nusers = [%q]\n", student.Name)))
	dir := filepath.Join(harness.SharedDir(t), "task")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o777)
	log := filepath.Join(dir, "log")
	id := harness.SubmitTask(t, b, &student, dir, "--log", log, "--run", fmt.Sprintf(`exec 3<>%q && echo opened`, dev.Node("davinci0")))
	if code, out := harness.ExitCode(t, student.As(b.TaskSubmit("wait", fmt.Sprint(id)), dir)); code != 0 {
		data, _ := os.ReadFile(log)
		t.Fatalf("task: exit %d: %s\nlog:\n%s", code, out, data)
	}
	if data, _ := os.ReadFile(log); !strings.Contains(string(data), "opened") {
		t.Errorf("task log:\n%s", data)
	}
	harness.WaitFree(t, b, 0)
	if harness.CanOpen(t, student, dev.Node("davinci0")) {
		t.Error("after the task the device still opens")
	}
}

// TestCheckConfigRestrictWarnings: check-config warns, with file and line,
// when a restricted account is still in the group that owns the device
// nodes, and when a node is open to everyone; exit status 0.
func TestCheckConfigRestrictWarnings(t *testing.T) {
	dev := harness.NewDevTree(t, 2)
	student := harness.NewUser(t)
	// The nodes' group is the student's own: the ACLs would restrict
	// nothing for them.
	for _, n := range []string{"davinci0", "davinci1"} {
		if err := os.Chown(dev.Node(n), 0, int(student.GID)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dev.Node("davinci_manager"), 0o666); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(harness.SharedDir(t), "npurun.conf")
	text := dev.Config("0-1", fmt.Sprintf("[restrict]\nusers = [%q]\n", student.Name))
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out := harness.ExitCode(t, exec.Command(harness.Bins(t).Broker, "check-config", conf))
	group := student.Name // useradd's user-private group
	for _, want := range []string{
		fmt.Sprintf(`%s:8: [restrict] users: warning: restricted user %q is in group %q, which may open the device nodes without a lease`, conf, student.Name, group),
		fmt.Sprintf(`%s:7: [restrict]: warning: %s may be opened by every account`, conf, dev.Node("davinci_manager")),
		conf + ": ok",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("check-config output lacks\n%s\ngot:\n%s", want, out)
		}
	}
	if code != 0 {
		t.Errorf("check-config exit %d, want 0 (warnings only)", code)
	}
}

// TestRevokeLooksUpWithoutLock: the accounts that a device's ACL names are
// looked up (NSS, and the getent it runs) without the broker's lock, so a
// slow user database delays that device's release alone, not every
// client. Here getent hangs for the uid of an administrator's entry, which
// the broker has not looked up before, while a restricted lease of the
// node ends; another client's request is answered meanwhile.
func TestRevokeLooksUpWithoutLock(t *testing.T) {
	dev := harness.NewDevTree(t, 2)
	student, staff := harness.NewUser(t), harness.NewUser(t)
	dir := harness.SharedDir(t)
	armed, blocked, release := filepath.Join(dir, "armed"), filepath.Join(dir, "blocked"), filepath.Join(dir, "release")
	harness.MakeFIFO(t, blocked)
	harness.MakeFIFO(t, release)
	real, err := exec.LookPath("getent")
	if err != nil {
		t.Fatal(err)
	}
	getent := fmt.Sprintf(`#!/bin/sh
if [ -e %q ] && [ "$2" = %q ]; then
	echo $$ > %q
	read x < %q
fi
exec %q "$@"
`, armed, staff.Name, blocked, release, real)
	if err := os.WriteFile(filepath.Join(dir, "getent"), []byte(getent), 0o755); err != nil {
		t.Fatal(err)
	}
	b := harness.StartBrokerEnv(t, dev.Config("0-1", fmt.Sprintf("[restrict]\nusers = [%q]\n", student.Name)), "PATH="+dir+":"+os.Getenv("PATH"))

	h := harness.LeaseAs(t, b, student, "student", "-d", "0")
	if out, err := exec.Command("setfacl", "-m", fmt.Sprintf("u:%d:rw", staff.UID), dev.Node("davinci0")).CombinedOutput(); err != nil {
		t.Fatalf("setfacl: %v: %s", err, out)
	}
	if err := os.WriteFile(armed, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	h.Release()
	// The release looks up staff: getent says so, and hangs.
	var pid int
	if _, err := fmt.Fscan(harness.OpenFIFO(t, blocked, os.O_RDONLY), &pid); err != nil {
		t.Fatal(err)
	}
	c := b.Dial()
	c.Send(&wire.Request{Op: wire.OpAcquire, Devices: []int{1}, NoWait: true})
	r, fds, err := c.Recv(harness.EventTimeout)
	for _, fd := range fds {
		syscall.Close(fd)
	}
	if err != nil || r.Type != wire.TypeGrant {
		t.Fatalf("npu 1: %v %v", r, err)
	}
	if state, _ := harness.ProcState(pid); state == 0 || state == 'Z' {
		t.Errorf("npu 1 was granted only once the lookup was over (getent %d gone): the broker looked up an account under its lock", pid)
	} else {
		harness.OpenFIFO(t, release, os.O_WRONLY).Close() // the lookup goes on
	}
	harness.WaitFree(t, b, 0)
	acl := harness.ACLText(t, dev.Node("davinci0"))
	if want := fmt.Sprintf("user:%d:rw-", staff.UID); !strings.Contains(acl, want) {
		t.Errorf("the administrator's entry %s is gone:\n%s", want, acl)
	}
	if strings.Contains(acl, fmt.Sprintf("user:%d:", student.UID)) {
		t.Errorf("the ended lease's entry is still there:\n%s", acl)
	}
}

// TestControlNodesTwoBrokers: two brokers that manage two devices of one
// machine share its control nodes. A restricted account's entry on them,
// added with its lease from one broker, stays while it holds that lease,
// whatever the other broker does: its start (which clears the control
// nodes of users who hold no device) and the end of its own leases look
// at every device node of the machine, not only its own.
func TestControlNodesTwoBrokers(t *testing.T) {
	harness.NeedRoot(t)
	harness.NeedTool(t, "acl", "getfacl", "setfacl")
	student := harness.NewUser(t)
	dir := filepath.Join(harness.SharedDir(t), "dev")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Each device node a number of its own (each broker claims its device
	// by number), the control nodes /dev/null's.
	nodes := map[string]uint64{"davinci0": unix.Mkdev(1, 7), "davinci1": unix.Mkdev(1, 5)}
	for _, name := range harness.ControlNodes {
		nodes[name] = unix.Mkdev(1, 3)
	}
	for name, number := range nodes {
		p := filepath.Join(dir, name)
		if err := unix.Mknod(p, unix.S_IFCHR|0o660, int(number)); err != nil {
			t.Fatalf("mknod %s: %v", p, err)
		}
		if err := unix.Chmod(p, 0o660); err != nil {
			t.Fatal(err)
		}
	}
	dev := harness.DevTree{Dir: dir}
	restrict := "[restrict]\nusers = [\"" + student.Name + "\"]\n"
	one := harness.StartBroker(t, dev.Config("1", restrict))
	zero := harness.StartBroker(t, dev.Config("0", restrict))

	h := harness.LeaseAs(t, one, student, "student", "-d", "1")
	if !harness.CanOpen(t, student, dev.Node("davinci_manager")) {
		t.Fatalf("the student holds npu 1 and cannot open davinci_manager: %s", harness.ACLText(t, dev.Node("davinci_manager")))
	}
	// The other broker restarts (its start clears the control nodes), and
	// a lease of its own device begins and ends.
	zero.Stop()
	zero.Start()
	harness.WaitFree(t, zero, 0)
	for _, name := range harness.ControlNodes {
		if !harness.CanOpen(t, student, dev.Node(name)) {
			t.Errorf("the student holds npu 1 of the other broker, and lost %s: %s", name, harness.ACLText(t, dev.Node(name)))
		}
	}
	h.Release()
	harness.WaitFree(t, one, 1)
	if harness.CanOpen(t, student, dev.Node("davinci_manager")) {
		t.Errorf("the student's lease ended, and davinci_manager still opens: %s", harness.ACLText(t, dev.Node("davinci_manager")))
	}
}
