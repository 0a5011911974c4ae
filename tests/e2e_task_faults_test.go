package tests

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/broker/client"
)

// Faults found by injection (issue 15): relative paths, a clean stop's
// idle groups, kills between a task's start record and its go-ahead,
// cancels as a task starts, descriptor shortages, ambiguous submissions.

// TestBrokerRelativePaths: a broker started with relative --run-dir,
// --state-dir and --socket makes them absolute at its start, so that its
// tasks' supervisors, which run in "/", reach it to report: the task ends
// done, and the socket it says it serves is absolute.
func TestBrokerRelativePaths(t *testing.T) {
	dir := SharedDir(t)
	conf := filepath.Join(dir, "npurun.conf")
	if err := os.WriteFile(conf, []byte(taskConfig(1)), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := bins(t)
	cmd := exec.Command(bin.Broker, "serve", "--config", "npurun.conf", "--run-dir", "run", "--state-dir", "state",
		"--socket", "run/broker.sock", "--cgroup", "off")
	cmd.Dir = dir
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	serving := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "serving") {
				serving <- sc.Text()
			}
		}
	}()
	socket := filepath.Join(dir, "run", "broker.sock")
	select {
	case line := <-serving:
		if !strings.HasSuffix(line, " on "+socket) {
			t.Errorf("the broker says %q, want it to serve on %s", line, socket)
		}
	case <-time.After(eventTimeout):
		t.Fatalf("the broker did not serve within %s", eventTimeout)
	}
	b := &Broker{t: t, Bin: bin, Socket: socket}
	work := SharedDir(t)
	id := submitTask(t, b, nil, work, "--no-device", "--log", filepath.Join(work, "log"), "--", "true")
	if r := waitTask(t, b, id); r.code != 0 {
		t.Errorf("wait for task %d: %s", id, r)
	}
	if ti := showTask(t, b, id); ti.State != "done" {
		t.Errorf("task %d: %s (%s), want done", id, ti.State, ti.Reason)
	}
	if _, err := os.Stat(filepath.Join(dir, "state", "journal")); err != nil {
		t.Errorf("the journal is not in the state directory given, relative to where the broker started: %v", err)
	}
}

// TestTaskDefaultLogNewJournal: a new journal numbers its tasks from 1
// again; its task 1 writes its default log beside the older task 1's, not
// into it, and `logs` shows its own output alone (issue 14.9).
func TestTaskDefaultLogNewJournal(t *testing.T) {
	u := newUser(t)
	home := userDir(t, &u, 0o755)
	if out, err := exec.Command("usermod", "--home", home, u.Name).CombinedOutput(); err != nil {
		t.Fatalf("usermod --home: %v: %s", err, out)
	}
	run := func(word string) (client.TaskInfo, *Broker) {
		b := StartBroker(t, taskConfig(1)) // a state directory of its own: a new journal
		id := submitTask(t, b, &u, home, "--no-device", "--", "echo", word)
		if r := waitTask(t, b, id); r.code != 0 {
			t.Fatalf("wait for task %d: %s", id, r)
		}
		return showTask(t, b, id), b
	}
	first, b := run("first")
	b.Stop()
	second, b := run("second")
	if first.ID != second.ID {
		t.Fatalf("the new journal's task is %d, the older one's %d: ids should start again", second.ID, first.ID)
	}
	if first.Log == second.Log || !strings.HasPrefix(second.Log, filepath.Join(home, ".local/state/npurun/tasks")+"/") {
		t.Errorf("default logs %s and %s: want two files under %s", first.Log, second.Log, filepath.Join(home, ".local/state/npurun/tasks"))
	}
	r := runTaskCmd(t, asUser(b.TaskSubmit("logs", strconv.FormatUint(second.ID, 10)), &u, home))
	if r.code != 0 || !strings.Contains(r.stdout, "second") || strings.Contains(r.stdout, "first") {
		t.Errorf("logs %d of the new journal: %s; want its own output alone", second.ID, r)
	}
}
