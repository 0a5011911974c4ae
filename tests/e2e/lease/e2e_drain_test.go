package lease

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// drain drains device dev with reason, as root, and returns the answer.
func drain(t testing.TB, b *harness.Broker, dev, reason string) wire.DrainInfo {
	t.Helper()
	code, out, errs := harness.DrainCmd(t, b, nil, "drain", dev, "--reason", reason, "--json")
	if code != 0 {
		t.Fatalf("npubroker drain %s: exit %d: %s", dev, code, errs)
	}
	var d wire.DrainInfo
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("drain --json printed what does not parse: %v\n%s", err, out)
	}
	return d
}

// undrain undrains device dev, as root.
func undrain(t testing.TB, b *harness.Broker, dev string) wire.DrainInfo {
	t.Helper()
	code, out, errs := harness.DrainCmd(t, b, nil, "undrain", dev, "--json")
	if code != 0 {
		t.Fatalf("npubroker undrain %s: exit %d: %s", dev, code, errs)
	}
	var d wire.DrainInfo
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("undrain --json printed what does not parse: %v\n%s", err, out)
	}
	return d
}

// boardDevice is device id on the board.
func boardDevice(t testing.TB, b *wire.Board, id int) wire.DeviceState {
	t.Helper()
	for _, d := range b.Devices {
		if d.ID == id {
			return d
		}
	}
	t.Fatalf("npu %d not on the board", id)
	return wire.DeviceState{}
}

// TestDrainUnderLoad: while many clients churn leases on 4 devices, npu3,
// drained with a lease on it, is granted to none of them (each run
// records its NPURUN_DEVICES in the workload log, its O_EXCL markers
// prove exclusivity), nor to a task; its holder at the drain runs on to
// its end; status shows the drain (table and --json) with its reason,
// who and since when; after undrain it is granted again.
func TestDrainUnderLoad(t *testing.T) {
	harness.NeedRoot(t)
	b := harness.StartBroker(t, harness.FakeConfig(4))
	w := harness.NewWorkload(t)
	h := harness.Hold(t, b, "holder", "-d", "3")
	before := time.Now().Add(-time.Second).UnixMilli()
	d := drain(t, b, "npu3", "ECC errors")
	if !d.Drained || !d.Leased || d.By != "root" || d.Reason != "ECC errors" || d.Since < before || d.Device != "npu3" {
		t.Fatalf("drain answered %+v: want npu3 drained by root for ECC errors, its lease running on", d)
	}

	runs := 0
	// Two rounds of churn: while the drain's holder holds npu3, and once
	// it has ended, npu3 free but drained.
	churn := func(round string) {
		t.Helper()
		const clients, each = 8, 20
		var wg sync.WaitGroup
		errs := make(chan string, clients*each)
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range each {
					tag := fmt.Sprintf("%s-c%d-%d", round, c, i)
					n := "1"
					if i%5 == 0 {
						n = "2"
					}
					cmd := b.Npurun(append([]string{"-q", "-n", n}, w.Args(b, tag, 2*time.Millisecond)...)...)
					if out, err := cmd.CombinedOutput(); err != nil {
						errs <- fmt.Sprintf("%s: %v: %s", tag, err, out)
					}
				}
			}()
		}
		// Tasks too: the line serves them from the same table.
		const tasks = 6
		for i := range tasks {
			tag := fmt.Sprintf("%s-task%d", round, i)
			out, err := b.TaskSubmit(append([]string{"-n", "1", "--"}, w.Args(b, tag, 2*time.Millisecond)...)...).CombinedOutput()
			if err != nil {
				t.Fatalf("task-submit: %v: %s", err, out)
			}
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
		runs += clients*each + tasks
		awaitRuns(t, w, runs)
		granted := map[string]int{}
		for _, r := range w.Runs(t) {
			for _, id := range strings.Split(r.Devices, ",") {
				granted[id]++
			}
			if slices.Contains(strings.Split(r.Devices, ","), "3") {
				t.Errorf("run %s was granted drained npu3 (devices %s)", r.Tag, r.Devices)
			}
		}
		for _, id := range []string{"0", "1", "2"} {
			if granted[id] == 0 {
				t.Errorf("npu %s was never granted: the load did not reach it (%v)", id, granted)
			}
		}
	}
	churn("held")
	if h.Exited() {
		t.Fatalf("the holder of npu3 at the drain ended before it was released:\n%s", h.Output())
	}

	board := b.Board(t)
	dev := boardDevice(t, board, 3)
	if dev.Drain == nil || !dev.Drain.Drained || dev.Drain.By != "root" || dev.Drain.Reason != "ECC errors" || dev.Drain.Since != d.Since || dev.Lease == nil {
		t.Fatalf("status --json shows npu3 as %+v (drain %+v): want leased, drained by root since %d for ECC errors", dev, dev.Drain, d.Since)
	}
	h.Release()
	board = harness.WaitBoard(t, b, func(b *wire.Board) bool { return boardDevice(t, b, 3).Lease == nil })
	if dev := boardDevice(t, board, 3); dev.State != wire.DeviceDrained || dev.Drain == nil {
		t.Fatalf("released npu3 shows as %q (drain %+v), want %q", dev.State, dev.Drain, wire.DeviceDrained)
	}
	churn("free")
	table := b.Status(t)
	if !strings.Contains(table, "drained") || !strings.Contains(table, "ECC errors") || !strings.Contains(table, "DRAINED") {
		t.Errorf("status table does not show npu3 drained with its reason:\n%s", table)
	}
	// It says drained, by whom and why, not "in use" (issue 27.19).
	if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "-d", "3", "true")); code != 75 || !strings.Contains(out, "npu3 drained by root since ") || !strings.Contains(out, "ECC errors") || strings.Contains(out, "in use") {
		t.Errorf("npurun --no-wait -d 3 on drained npu3: exit %d, want 75 (busy) and npu3 drained by root for ECC errors: %s", code, out)
	}
	if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "-n", "4", "true")); code != 75 || !strings.Contains(out, `fewer than 4 devices free in pool "default": npu3 drained by root since `) || !strings.Contains(out, "ECC errors") {
		t.Errorf("npurun --no-wait -n 4 with npu3 drained: exit %d, want 75 (busy) and npu3 drained by root for ECC errors: %s", code, out)
	}

	if u := undrain(t, b, "npu3"); !u.Was || u.Drained {
		t.Fatalf("undrain answered %+v: want was drained, drained no more", u)
	}
	if code, out := harness.ExitCode(t, b.Npurun(append([]string{"-d", "3"}, w.Args(b, "after", 0)...)...)); code != 0 {
		t.Fatalf("npurun -d 3 after undrain: exit %d: %s", code, out)
	}
	if dev := boardDevice(t, b.Board(t), 3); dev.Drain != nil {
		t.Errorf("undrained npu3 still shows a drain: %+v", dev.Drain)
	}
	if u := undrain(t, b, "npu3"); u.Was {
		t.Errorf("undrain of a device not drained answered %+v: want was false", u)
	}
}

// awaitRuns waits until the workload log has n runs (tasks end after
// task-submit returns).
func awaitRuns(t testing.TB, w harness.Workload, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * harness.EventTimeout)
	for {
		if got := len(w.Runs(t)); got >= n {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("%d runs in the workload log, want %d", got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDrainAcrossRestart: a drain lasts across a broker's kill -9 and a
// clean stop, with its reason, who and since when; an undrain too; a
// malformed drain file is a clear start-up error, naming the file.
func TestDrainAcrossRestart(t *testing.T) {
	harness.NeedRoot(t)
	b := harness.StartBroker(t, harness.FakeConfig(3))
	d := drain(t, b, "1", "fan noise")
	check := func(when string, drained bool) {
		t.Helper()
		dev := boardDevice(t, b.Board(t), 1)
		if !drained {
			if dev.Drain != nil || dev.State != wire.DeviceFree {
				t.Fatalf("%s: npu1 shows as %q (drain %+v), want free", when, dev.State, dev.Drain)
			}
			return
		}
		if dev.State != wire.DeviceDrained || dev.Drain == nil || dev.Drain.By != "root" || dev.Drain.Reason != "fan noise" || dev.Drain.Since != d.Since {
			t.Fatalf("%s: npu1 shows as %q (drain %+v), want drained by root since %d for fan noise", when, dev.State, dev.Drain, d.Since)
		}
		if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "-d", "1", "true")); code != 75 {
			t.Fatalf("%s: npurun --no-wait -d 1 on drained npu1: exit %d, want 75: %s", when, code, out)
		}
	}
	check("drained", true)
	b.Kill()
	b.Start()
	check("after kill -9", true)
	b.Stop()
	b.Start()
	check("after a clean stop", true)
	undrain(t, b, "npu1")
	b.Kill()
	b.Start()
	check("undrained, after kill -9", false)

	// A malformed file: the broker says which and does not start.
	b.Stop()
	path := filepath.Join(b.StateDir, "drained.json")
	if err := os.WriteFile(path, []byte("{\"v\":1,\"drained\":[{\"id\":1,"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(b.Bin.Broker, "serve", "--config", b.Conf, "--run-dir", b.RunDir, "--socket", b.Socket, "--state-dir", b.StateDir, "--cgroup", "off")
	cmd.Env = append(os.Environ(), b.ExtraEnv...)
	done := make(chan struct{})
	var out []byte
	go func() { out, _ = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(harness.EventTimeout):
		cmd.Process.Kill()
		<-done
		t.Fatalf("a broker with a malformed drain file served:\n%s", out)
	}
	if cmd.ProcessState.ExitCode() == 0 || !strings.Contains(string(out), path) || strings.Contains(string(out), "panic") {
		t.Fatalf("a malformed drain file: exit %d, output:\n%s\nwant a failure naming %s", cmd.ProcessState.ExitCode(), out, path)
	}
}

// TestDrainRefused: only root drains (SO_PEERCRED): another user is
// refused with status 77 and a message that says so, and the device
// stays as it was; a device this broker does not manage is refused by
// name; a Slurm-managed one is refused in words.
func TestDrainRefused(t *testing.T) {
	harness.NeedRoot(t)
	b := harness.StartBroker(t, harness.FakeConfig(3))
	u := harness.NewUser(t)
	as := func(c *exec.Cmd) *exec.Cmd { return u.As(c, b.Dir) }
	code, _, errs := harness.DrainCmd(t, b, as, "drain", "npu1", "--reason", "mine")
	if code != 77 || !strings.Contains(errs, "root") {
		t.Errorf("drain as %s: exit %d, stderr %q: want 77 and a message naming root", u.Name, code, errs)
	}
	if dev := boardDevice(t, b.Board(t), 1); dev.Drain != nil {
		t.Errorf("a refused drain drained npu1: %+v", dev.Drain)
	}
	drain(t, b, "npu1", "ECC errors")
	if code, _, errs := harness.DrainCmd(t, b, as, "undrain", "npu1"); code != 77 || !strings.Contains(errs, "root") {
		t.Errorf("undrain as %s: exit %d, stderr %q: want 77 and a message naming root", u.Name, code, errs)
	}
	if dev := boardDevice(t, b.Board(t), 1); dev.Drain == nil {
		t.Errorf("a refused undrain undrained npu1")
	}
	for _, name := range []string{"npu9", "bogus", "-1x"} {
		code, _, errs := harness.DrainCmd(t, b, nil, "drain", "--", name)
		if code != 2 || !strings.Contains(errs, strings.TrimPrefix(name, "npu")) {
			t.Errorf("drain %s: exit %d, stderr %q: want 2 (usage: a device the broker does not manage, as for npurun -d) and a message naming it", name, code, errs)
		}
	}
	if code, _, errs := harness.DrainCmd(t, b, nil, "drain"); code != 2 {
		t.Errorf("drain with no device: exit %d, want 2: %s", code, errs)
	}
}

// TestDrainWaiterTold: a request that only a drained device could serve
// is told so in its progress line, whether it came before the drain or
// after, and reserves nothing while it waits (one behind it that other
// devices can serve is served); undrained, it is served.
func TestDrainWaiterTold(t *testing.T) {
	harness.NeedRoot(t)
	b := harness.StartBroker(t, harness.FakeConfig(3))
	h := harness.Hold(t, b, "holder", "-d", "2")
	early := harness.Queue(t, b, "early", "-d", "2", "true")
	drain(t, b, "npu2", "ECC errors")
	line := early.WaitLine("drained by root since")
	if !strings.Contains(line, "npu2 drained by root since") || !strings.Contains(line, "ECC errors") {
		t.Errorf("waiter's progress line %q does not say npu2 is drained, by whom and why", line)
	}
	late := harness.Queue(t, b, "late", "-d", "2", "true")
	if line := late.WaitLine("drained by root"); !strings.Contains(line, "ECC errors") {
		t.Errorf("late waiter's progress line %q does not give the drain's reason", line)
	}
	// A request of every device waits for npu2 too, and keeps nothing
	// for itself meanwhile: a request a device not drained can serve is
	// served behind it, and not told of the drain.
	big := harness.Queue(t, b, "big", "-n", "3", "true")
	if line := big.WaitLine("drained by root"); !strings.Contains(line, "npu2 drained") {
		t.Errorf("request of 3 devices: progress line %q does not name drained npu2", line)
	}
	other := harness.StartProc(t, "other", b.Npurun("-v", "-n", "1", "true"))
	other.MustSucceed()
	if strings.Contains(other.Output(), "drained") {
		t.Errorf("a request npu0 or npu1 could serve was told of the drain:\n%s", other.Output())
	}
	h.Release()
	undrain(t, b, "npu2")
	early.MustSucceed()
	late.MustSucceed()
	big.MustSucceed()
}
