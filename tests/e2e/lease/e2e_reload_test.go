package lease

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// reloadPools is the configuration of TestReload: 4 fake devices in
// pools a (0-1) and b (2-3), with extra lines.
func reloadPools(extra string) string {
	return harness.FakeConfig(4) + "\n[pools]\na = \"0-1\"\nb = \"2-3\"\n" + extra
}

// TestReload: npubroker reload takes up a new configuration without a
// restart: a request waiting in line that it refuses is told so and ends
// with exit 77 (a task fails, not started, saying why), the lease it would not grant runs on; a file that does
// not validate is refused with its line, one that changes the device
// list is refused by name, and nothing changes; SIGHUP reloads too, and
// says so in the log; a user other than root may not reload.
func TestReload(t *testing.T) {
	harness.NeedRoot(t)
	b := harness.StartBroker(t, reloadPools(""))
	h := harness.Hold(t, b, "holder", "-n", "2", "--pool", "a")
	waiter := harness.Queue(t, b, "waiter", "--pool", "a", "true")
	other := harness.Queue(t, b, "other", "-d", "1", "true") // npu 1, of pool a
	task := harness.SubmitTask(t, b, nil, "/", "-p", "a", "--", "true")

	// root may use pool b only: the waiter (1 of a) and the other (npu 1,
	// of a) are refused; the holder's 2 devices of a run on.
	harness.WriteConf(t, b, reloadPools("\n[user.root]\npools = [\"b\"]\n"))
	code, info, errs := harness.Reload(t, b)
	if code != 0 || info.Refused != 3 || info.Config != b.Conf || !strings.Contains(strings.Join(info.Changed, " "), "[user.NAME]") {
		t.Fatalf("reload: exit %d, %+v, %s; want 0, 3 waiters refused (2 npurun, a task), [user.NAME] changed", code, info, errs)
	}
	for _, p := range []*harness.Proc{waiter, other} {
		if st, _ := p.Wait(); st != 77 {
			t.Errorf("%s, refused by the reloaded configuration: exit %d, want 77:\n%s", p.Name, st, p.Output())
		}
		if out := p.Output(); !strings.Contains(out, "npurun: the broker's configuration, reloaded, refuses this request: ") {
			t.Errorf("%s did not say why it was refused:\n%s", p.Name, out)
		}
	}
	if !strings.Contains(waiter.Output(), `pool "a" is not open to root (user root)`) {
		t.Errorf("the waiter was not told which pool:\n%s", waiter.Output())
	}
	if !strings.Contains(other.Output(), `npu 1 is in pool "a", which user root does not open to root`) {
		t.Errorf("the request for npu 1 was not told which pool:\n%s", other.Output())
	}
	if r := harness.WaitTask(t, b, task); r.Code != 1 || !strings.Contains(r.Stderr, `not started: the broker's configuration, reloaded, refuses it: pool "a" is not open to root (user root)`) {
		t.Errorf("task %d waiting for pool a, refused by the reload: %s; want it failed, not started, saying why", task, r)
	}
	if h.Exited() {
		t.Fatalf("the holder's lease, which the new configuration would not grant, ended:\n%s", h.Output())
	}
	if dev := boardDevice(t, b.Board(t), 0); dev.Lease == nil {
		t.Errorf("npu0 of the holder shows no lease after the reload: %+v", dev)
	}
	if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "--pool", "a", "true")); code != 77 {
		t.Errorf("npurun --pool a after the reload: exit %d, want 77 (denied): %s", code, out)
	}
	if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "--pool", "b", "true")); code != 0 {
		t.Errorf("npurun --pool b after the reload: exit %d, want 0: %s", code, out)
	}

	// A file that does not validate: refused with its line, nothing
	// changes (pool a is still closed to root).
	harness.WriteConf(t, b, reloadPools("\n[user.root]\npools = [\"b\"]\nmax_devics = 1\n"))
	code, _, errs = harness.Reload(t, b)
	if code != 1 || !strings.Contains(errs, "npurun.conf:11: [user.root] max_devics: unknown key") || !strings.Contains(errs, "not taken") {
		t.Errorf("reload of a file that does not validate: exit %d, %q; want 1, naming line 11's unknown key", code, errs)
	}
	if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "--pool", "a", "true")); code != 77 {
		t.Errorf("npurun --pool a after a refused reload: exit %d, want 77 as before it: %s", code, out)
	}
	// The device list needs a restart: refused by name.
	harness.WriteConf(t, b, strings.Replace(reloadPools(""), `ids = "0-3"`, `ids = "0-4"`, 1))
	code, _, errs = harness.Reload(t, b)
	if code != 1 || !strings.Contains(errs, "[devices] ids cannot change without a restart") {
		t.Errorf("reload of another device list: exit %d, %q; want 1, naming [devices] ids", code, errs)
	}

	// SIGHUP: the same, said in the log.
	skip := b.LogLen()
	harness.WriteConf(t, b, reloadPools(""))
	if err := syscall.Kill(b.Pid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	b.WaitLog(skip, "SIGHUP: reloaded "+b.Conf)
	waiter = harness.Queue(t, b, "waiter after SIGHUP", "--pool", "a", "true")
	h.Release()
	waiter.MustSucceed()

	// [devices] health_interval, off at start, turned on by a reload:
	// the fake vendor's file says npu3 is unhealthy, and the health check
	// drains it.
	health := filepath.Join(harness.SharedDir(t), "health")
	if err := os.WriteFile(health, []byte("3 Critical HBM uncorrectable ECC\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	harness.WriteConf(t, b, strings.Replace(reloadPools(""), "\n[pools]", fmt.Sprintf("health_interval = \"1s\"\nfake_health = %q\n\n[pools]", health), 1))
	if code, info, errs := harness.Reload(t, b); code != 0 || !strings.Contains(strings.Join(info.Changed, " "), "[devices]") {
		t.Fatalf("reload turning the health checks on: exit %d, %+v, %s", code, info, errs)
	}
	harness.WaitBoard(t, b, func(bd *wire.Board) bool { return healthDrained(bd, 3, "HBM uncorrectable ECC") })

	// [restrict]: the session-policy file the PAM module reads follows.
	harness.WriteConf(t, b, reloadPools("\n[restrict]\nusers = [\"npurun-tnobody\"]\non_broker_down = \"deny\"\n"))
	if code, _, errs := harness.Reload(t, b); code != 0 {
		t.Fatalf("reload of a [restrict]: exit %d: %s", code, errs)
	}
	if data, err := os.ReadFile(filepath.Join(b.RunDir, wire.SessionPolicyFile)); err != nil || !strings.Contains(string(data), "on_broker_down deny") {
		t.Errorf("session-policy file after a reload to on_broker_down = \"deny\": %v\n%s", err, data)
	}

	// Not root: refused, 77.
	u := harness.NewUser(t)
	code, _, errs = harness.DrainCmd(t, b, func(c *exec.Cmd) *exec.Cmd { return u.As(c, "/") }, "reload")
	if code != 77 || !strings.Contains(errs, "reload is root's") {
		t.Errorf("reload as %s: exit %d, %q; want 77, root's", u.Name, code, errs)
	}
}

// TestReloadUnderLoad: a loop of reloads alternating two valid
// configurations and one that does not validate, while 200 clients churn
// leases and tasks run: every run ends well (no connection, lease or
// waiter dropped: each npurun exits 0 and its workload ran, with its
// O_EXCL markers proving no device granted twice), every task succeeds,
// every valid reload is taken and every invalid one refused with its line.
func TestReloadUnderLoad(t *testing.T) {
	harness.NeedRoot(t)
	confA := harness.TaskConfig(4) + "\n[limits]\nmax_devices = 4\n"
	confB := harness.TaskConfig(4) + "\n[limits]\nmax_devices = 3\n\n[status]\nscan_interval = \"7s\"\n"
	confBad := harness.TaskConfig(4) + "\n[limits]\nmax_devices = -1\n"
	b := harness.StartBroker(t, confA)
	w := harness.NewWorkload(t)
	clients, each, tasks := 200, 3, 12
	if testing.Short() {
		clients = 50
	}
	stop := make(chan struct{})
	var reloads, refusals int
	var rwg sync.WaitGroup
	rwg.Add(1)
	go func() {
		defer rwg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			conf, valid := confA, true
			switch i % 3 {
			case 1:
				conf = confB
			case 2:
				conf, valid = confBad, false
			}
			harness.WriteConf(t, b, conf)
			code, _, errs := harness.Reload(t, b)
			switch {
			case valid && code != 0:
				t.Errorf("reload %d of a valid configuration: exit %d: %s", i, code, errs)
			case !valid && (code != 1 || !strings.Contains(errs, "[limits] max_devices: must be at least 0, not -1")):
				t.Errorf("reload %d of an invalid configuration: exit %d, %q; want 1 and its line", i, code, errs)
			case valid:
				reloads++
			default:
				refusals++
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan string, clients*each+tasks)
	var ids []uint64
	for i := range tasks {
		ids = append(ids, harness.SubmitTask(t, b, nil, "/", append([]string{"-n", "1", "--"}, w.Args(b, fmt.Sprintf("task%d", i), 20*time.Millisecond)...)...))
	}
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				tag := fmt.Sprintf("c%d-%d", c, i)
				n := "1"
				if (c+i)%5 == 0 {
					n = "2"
				}
				cmd := b.Npurun(append([]string{"-q", "-n", n}, w.Args(b, tag, time.Millisecond)...)...)
				if out, err := cmd.CombinedOutput(); err != nil {
					errs <- fmt.Sprintf("%s: %v: %s", tag, err, out)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	rwg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	for _, id := range ids {
		if r := harness.WaitTask(t, b, id); r.Code != 0 {
			t.Errorf("task %d: %s, want exit 0", id, r)
		}
	}
	awaitRuns(t, w, clients*each+tasks)
	if reloads < 2 || refusals < 1 {
		t.Errorf("%d reloads taken and %d refused during the load: the loop did not overlap it", reloads, refusals)
	}
	t.Logf("%d runs, %d tasks; %d reloads taken, %d refused", clients*each, tasks, reloads, refusals)
}

// TestReloadRunningCap: a reload that raises max_running_tasks lets a
// --no-device task that waited for its user's cap start at once, as it
// does a device task's (the CPU slots' line counts its users under the
// new limits too).
func TestReloadRunningCap(t *testing.T) {
	harness.NeedRoot(t)
	b := harness.StartBroker(t, harness.TaskConfig(1)+"\n[limits]\nmax_running_tasks = 1\n")
	dir := harness.SharedDir(t)
	up := filepath.Join(dir, "up")
	harness.MakeFIFO(t, up)
	// It runs once it opens the pipe: it holds its place under the cap.
	first := harness.SubmitTask(t, b, nil, dir, "--no-device", "--", "sh", "-c", `exec 3>"$1"; exec sleep 600`, "sh", up)
	harness.OpenFIFO(t, up, os.O_RDONLY)
	second := harness.SubmitTask(t, b, nil, dir, "--no-device", "--", "true")
	if st := harness.ShowTask(t, b, second).State; st != wire.StatePending {
		t.Fatalf("second task %s, want pending behind max_running_tasks = 1", st)
	}
	harness.WriteConf(t, b, harness.TaskConfig(1)+"\n[limits]\nmax_running_tasks = 2\n")
	if code, _, errs := harness.Reload(t, b); code != 0 {
		t.Fatalf("reload: exit %d: %s", code, errs)
	}
	if r := harness.WaitTask(t, b, second); r.Code != 0 {
		t.Errorf("second task after the reload: %s, want it run (exit 0)", r)
	}
	harness.RunTaskCmd(t, b.TaskSubmit("cancel", harness.IDStr(first)))
}

// TestReloadFlagsOverFile: what the command line set (--state-dir,
// --cgroup, as the harness starts every broker) is the broker's, not the
// file's: a file whose [tasks] state_dir or cgroup differs is taken up
// (its other changes apply), not refused as a change that needs a
// restart; a change to [devices] ids still is.
func TestReloadFlagsOverFile(t *testing.T) {
	harness.NeedRoot(t)
	b := harness.StartBroker(t, reloadPools(""))
	harness.WriteConf(t, b, reloadPools("[tasks]\nstate_dir = \"/nonexistent/spool\"\ncgroup = \"auto\"\n[limits]\nmax_devices = 1\n"))
	code, info, errs := harness.Reload(t, b)
	if code != 0 {
		t.Fatalf("reload of a file whose [tasks] state_dir and cgroup the command line overrides: exit %d: %s", code, errs)
	}
	if !strings.Contains(strings.Join(info.Changed, " "), "[limits]") {
		t.Errorf("reload answered %+v, want [limits] among the changes", info)
	}
	if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "-n", "2", "true")); code != 77 {
		t.Errorf("npurun -n 2 under the reloaded max_devices = 1: exit %d, want 77: %s", code, out)
	}
	harness.WriteConf(t, b, strings.Replace(reloadPools(""), "0-3", "0-4", 1))
	if code, _, errs := harness.Reload(t, b); code == 0 || !strings.Contains(errs, "[devices] ids") {
		t.Errorf("reload of a changed device list: exit %d, stderr %q; want a refusal naming [devices] ids", code, errs)
	}
}
