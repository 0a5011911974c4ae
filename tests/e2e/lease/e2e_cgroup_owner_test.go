package lease

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// refusedServe runs `npubroker serve ARGS`, which must refuse to start: it
// returns its exit status and output. A broker that serves instead fails
// the test, and is stopped.
func refusedServe(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), "serving") {
			cmd.Process.Signal(syscall.SIGTERM)
			t.Errorf("the broker served where it must refuse to start:\n%s", out.String())
		}
	}
	cmd.Wait()
	return cmd.ProcessState.ExitCode(), out.String()
}

// TestCgroupParentOneBroker: the parent of the tasks' control groups is
// one state directory's. A second broker (another spool) named the same
// parent refuses to start, while the first runs and while the first's task
// runs on after it was killed, instead of killing that task as a group its
// journal does not know; the first broker takes its task up again; once
// nothing of the first one's runs there, the parent may serve another.
func TestCgroupParentOneBroker(t *testing.T) {
	u := harness.ContainUser(t)
	a := harness.StartBroker(t, harness.TaskConfig(1))
	if !harness.ContainedBy(t, a) {
		t.Skip("no control groups for tasks on this machine")
	}
	id, pid := harness.SleepingTask(t, a, u)
	other := harness.NewBroker(t, harness.TaskConfig(1))
	args := []string{"--config", other.Conf, "--run-dir", other.RunDir, "--socket", other.Socket, "--state-dir", other.StateDir, "--cgroup", a.Cgroup}

	code, out := refusedServe(t, other.Bin.Broker, args...)
	if code != 1 || !strings.Contains(out, "another broker's, which is running (state directory "+a.StateDir+")") {
		t.Errorf("a second broker on %s while the first runs: exit %d:\n%s", a.Cgroup, code, out)
	}
	if harness.Gone(pid) {
		t.Fatalf("the first broker's task (pid %d) was killed by a second broker on its control groups", pid)
	}

	a.Kill()
	code, out = refusedServe(t, other.Bin.Broker, args...)
	if code != 1 || !strings.Contains(out, "the tasks of state directory "+a.StateDir+" still run in task-"+harness.IDStr(id)) {
		t.Errorf("a second broker on %s while the first one's task runs: exit %d:\n%s", a.Cgroup, code, out)
	}
	if harness.Gone(pid) {
		t.Fatalf("the first broker's task (pid %d) was killed by a second broker on its control groups", pid)
	}

	mark := a.LogLen()
	a.Start()
	a.WaitLog(mark, "task "+harness.IDStr(id)+" is still running")
	if r := harness.RunTaskCmd(t, a.TaskSubmit("cancel", harness.IDStr(id))); r.Code != 0 {
		t.Fatalf("cancel: %s", r)
	}
	harness.WaitTask(t, a, id)
	harness.AwaitRemoved(t, filepath.Join(a.Cgroup, "task-"+harness.IDStr(id)))
	a.Stop()

	other.Cgroup = a.Cgroup
	other.Start()
	other.WaitLog(0, "each task runs in a control group of its own under "+a.Cgroup)
}

// TestCgroupAutoStartedInParent: a broker in "auto" mode started in a group
// of its own (as systemd older than 254 starts the service, ignoring
// DelegateSubgroup=) moves into a leaf of it and hands no controller down
// from it, so that a process can still be started in that group, as
// systemd starts the next broker there while tasks run. A second broker
// started in the same group (another spool: a test or demo broker beside
// the real one) serves without control groups, saying why, and leaves the
// first one's running task alone.
func TestCgroupAutoStartedInParent(t *testing.T) {
	u := harness.ContainUser(t)
	parent := harness.OwnCgroupParent(t)
	if parent == "" {
		if os.Getenv("CI") == "true" && os.Geteuid() == 0 {
			t.Fatal("CI=true as root, and this machine has no cgroup v2 with cgroup.kill")
		}
		t.Skip("no control groups for tasks on this machine")
	}
	a := harness.NewBroker(t, harness.TaskConfig(1))
	a.StartIn = parent
	a.Start() // its control groups' line comes before its "serving" line
	if want := "each task runs in a control group of its own under " + parent + " (memory accounting off: the broker was started in " + parent + " itself"; !strings.Contains(a.Log(), want) {
		t.Errorf("the broker's log lacks %q:\n%s", want, a.Log())
	}
	if procs := harness.CgroupProcs(filepath.Join(parent, "broker")); !slices.Contains(procs, strconv.Itoa(a.Pid())) {
		t.Errorf("the broker (pid %d) is not in %s/broker: %v", a.Pid(), parent, procs)
	}
	id, pid := harness.SleepingTask(t, a, u)
	if data, err := os.ReadFile(filepath.Join(parent, "cgroup.subtree_control")); err != nil || strings.TrimSpace(string(data)) != "" {
		t.Errorf("%s hands controllers down (%q, %v): a process could not be started in it", parent, data, err)
	}
	cg, err := os.Open(parent)
	if err != nil {
		t.Fatal(err)
	}
	next := exec.Command("sleep", "1000")
	next.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	err = next.Start()
	cg.Close()
	if err != nil {
		t.Errorf("start a process in %s while a task runs (systemd's restart of the broker): %v", parent, err)
	} else {
		next.Process.Kill()
		next.Wait()
	}

	b := harness.NewBroker(t, harness.TaskConfig(1))
	b.StartIn = parent
	b.Start()
	if want := "tasks have no control group of their own (" + parent + " is another broker's, which is running (state directory " + a.StateDir + ")"; !strings.Contains(b.Log(), want) {
		t.Errorf("the second broker's log lacks %q:\n%s", want, b.Log())
	}
	if harness.Gone(pid) {
		t.Fatalf("the first broker's task (pid %d) was killed by a second broker started in the same group", pid)
	}
	if info := harness.ShowTask(t, a, id); info.State != "running" {
		t.Errorf("the first broker's task is %s after a second broker started beside it", info.State)
	}
}
