package status

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// span bounds a lease's duration as a test sees it from outside: at least
// lo (from when its command ran to when it was told to stop), at most hi
// (from before it was asked for to after its device was seen free).
type span struct{ lo, hi time.Duration }

func (s *span) add(o span) { s.lo += o.lo; s.hi += o.hi }

// usageReport runs `npubroker usage ARGS --json` and parses it.
func usageReport(t testing.TB, b *harness.Broker, args ...string) *wire.UsageReport {
	t.Helper()
	cmd := exec.Command(b.Bin.Broker, append(append([]string{"usage"}, args...), "--json")...)
	cmd.Env = b.Env()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("npubroker usage %s: %v\n%s", strings.Join(args, " "), err, harness.StderrOf(err))
	}
	var rep wire.UsageReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("usage --json: %v\n%s", err, out)
	}
	return &rep
}

// waitUsageLog waits until a line of b's accounting log has each of
// parts: the broker's writer has given it to the kernel.
func waitUsageLog(t testing.TB, b *harness.Broker, parts ...string) {
	t.Helper()
	path := filepath.Join(b.StateDir, "usage.log")
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		data, _ := os.ReadFile(path)
		for _, line := range strings.Split(string(data), "\n") {
			if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
				return
			}
		}
	}
	t.Fatalf("%s has no line with %q within 10 s", path, parts)
}

// TestUsageAcrossRestart: the device time npubroker usage sums matches the
// leases the test made, each bounded from outside: one that ends while
// the broker runs, one that survives a broker kill -9 and ends after the
// restart, one that ends while the broker is down (closed when the new
// broker finds it gone), and a task's.
func TestUsageAcrossRestart(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(3))
	user := harness.Me(t)
	var want span
	leases := 0
	// probe waits in line for device id and returns once it was granted:
	// the device was free by then. Its own lease counts too.
	probe := func(id string) time.Time {
		t.Helper()
		t0 := time.Now()
		if code, out := harness.ExitCode(t, b.Npurun("-d", id, "true")); code != 0 {
			t.Fatalf("npurun -d %s true: exit %d\n%s", id, code, out)
		}
		t1 := time.Now()
		want.add(span{0, t1.Sub(t0)})
		leases++
		return t1
	}

	// npu0: held and released while the broker runs.
	t0 := time.Now()
	h0 := harness.Hold(t, b, "npu0", "-d", "0")
	t1 := time.Now()
	t2 := time.Now()
	h0.Release()
	want.add(span{t2.Sub(t1), probe("0").Sub(t0)})
	leases++

	// npu1 survives a kill -9 of the broker; npu2 ends while it is down.
	a0 := time.Now()
	h1 := harness.Hold(t, b, "npu1", "-d", "1")
	h2 := harness.Hold(t, b, "npu2", "-d", "2")
	a1 := time.Now()
	// The accounting log is written behind the grants, without fsync: a
	// kill -9 keeps what the kernel was given, so the kill waits for
	// that. (Killed sooner, npu2's lease, ended while no broker ran,
	// would be in no record at all.)
	waitUsageLog(t, b, `"ev":"start"`, `"devices":[2]`)
	b.Kill()
	h2.Release()
	restart := time.Now()
	b.Start()
	up := time.Now()
	want.add(span{restart.Sub(a1), up.Sub(a0)})
	leases++
	a2 := time.Now()
	h1.Release()
	want.add(span{a2.Sub(a1), probe("1").Sub(a0)})
	leases++

	rep := usageReport(t, b, "--since", "1h")
	if len(rep.Rows) != 1 {
		t.Fatalf("usage rows: %+v, want one (%s, inline, default)", rep.Rows, user)
	}
	r := rep.Rows[0]
	got := time.Duration(r.DeviceSeconds * float64(time.Second))
	if r.User != user || r.Kind != wire.KindInline || r.Pool != "default" || r.Leases != leases || got < want.lo || got > want.hi {
		t.Errorf("usage: %+v (%s), want %s, inline, default, %d leases, %s to %s", r, got, user, leases, want.lo, want.hi)
	}
	if r.DeviceHours != r.DeviceSeconds/3600 || rep.Dropped != 0 || rep.Incomplete != 0 {
		t.Errorf("usage report: %+v", rep)
	}
	log, err := os.ReadFile(filepath.Join(b.StateDir, "usage.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), `"how":"gone-at-start"`); n != 1 {
		t.Errorf("usage.log has %d ends found at start, want 1 (npu2):\n%s", n, log)
	}

	// A task's lease.
	s0 := time.Now()
	sub, err := b.TaskSubmit("-d", "0", "--json", "--", "sleep", "1").Output()
	if err != nil {
		t.Fatalf("task-submit: %v\n%s", err, harness.StderrOf(err))
	}
	var submitted struct{ ID uint64 }
	if err := json.Unmarshal(sub, &submitted); err != nil || submitted.ID == 0 {
		t.Fatalf("task-submit --json: %v\n%s", err, sub)
	}
	if code, out := harness.ExitCode(t, b.TaskSubmit("wait", strconv.FormatUint(submitted.ID, 10))); code != 0 {
		t.Fatalf("task-submit wait: exit %d\n%s", code, out)
	}
	s1 := time.Now()
	rep = usageReport(t, b, "--since", "10m", "--user", user)
	var task *wire.UsageRow
	for i := range rep.Rows {
		if rep.Rows[i].Kind == wire.KindTask {
			task = &rep.Rows[i]
		}
	}
	if task == nil || task.Leases != 1 || task.DeviceSeconds < 1 || task.DeviceSeconds > s1.Sub(s0).Seconds() {
		t.Errorf("task usage: %+v, want 1 lease of 1s to %s", task, s1.Sub(s0))
	}
	if rep := usageReport(t, b, "--since", "1h", "--user", "nobody-at-all"); len(rep.Rows) != 0 {
		t.Errorf("usage of another user: %+v", rep.Rows)
	}
	cmd := exec.Command(b.Bin.Broker, "usage", "--since", "1d")
	cmd.Env = b.Env()
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"USER", "DEVICE-HOURS", user, "inline", "task", "TOTAL"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("usage table lacks %q:\n%s", want, out)
		}
	}
}

// TestUsageFullDisk: an accounting log that cannot be written (ENOSPC, as
// /dev/full gives) stops no lease; the broker says so once, and usage
// reports the records lost.
func TestUsageFullDisk(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(1)+"[usage]\nlog = \"/dev/full\"\n")
	for range 3 {
		if code, out := harness.ExitCode(t, b.Npurun("-d", "0", "true")); code != 0 {
			t.Fatalf("npurun with a full accounting log: exit %d\n%s", code, out)
		}
	}
	cmd := exec.Command(b.Bin.Broker, "usage", "--since", "1h", "--json")
	cmd.Env = b.Env()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("usage: %v\n%s", err, harness.StderrOf(err))
	}
	var rep wire.UsageReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Dropped < 3 {
		t.Errorf("dropped %d records, want at least the 3 starts", rep.Dropped)
	}
	if !strings.Contains(stderr.String(), "npubroker: warning: the broker could not write") {
		t.Errorf("usage did not warn of the records lost: %q", stderr.String())
	}
	if n := strings.Count(b.Log(), "usage log /dev/full: write /dev/full: no space left on device; dropping records"); n != 1 {
		t.Errorf("the broker said %d times that it drops records, want once:\n%s", n, b.Log())
	}
}

// TestMetrics: the Prometheus endpoint serves the devices by state, the
// waiters, the grants with their wait times and the handoff latency, in
// the text format.
func TestMetrics(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(2)+"[broker]\nmetrics_listen = \"127.0.0.1:0\"\n")
	m := regexp.MustCompile(`metrics on (http://\S+/metrics)`).FindStringSubmatch(b.Log())
	if m == nil {
		t.Fatalf("no metrics address in the broker log:\n%s", b.Log())
	}
	url := m[1]
	scrape := func() map[string]*dto.MetricFamily {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s", url, resp.Status)
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(resp.Body)
		if err != nil {
			t.Fatalf("parse %s: %v", url, err)
		}
		return fams
	}
	value := func(fams map[string]*dto.MetricFamily, name, label, lv string) float64 {
		t.Helper()
		f := fams[name]
		if f == nil {
			t.Fatalf("no %s", name)
		}
		for _, mt := range f.Metric {
			for _, l := range mt.Label {
				if label != "" && (l.GetName() != label || l.GetValue() != lv) {
					continue
				}
				switch {
				case mt.Gauge != nil:
					return mt.Gauge.GetValue()
				case mt.Counter != nil:
					return mt.Counter.GetValue()
				case mt.Histogram != nil:
					return float64(mt.Histogram.GetSampleCount())
				}
			}
			if label == "" {
				switch {
				case mt.Gauge != nil:
					return mt.Gauge.GetValue()
				case mt.Histogram != nil:
					return float64(mt.Histogram.GetSampleCount())
				}
			}
		}
		t.Fatalf("no %s{%s=%q}", name, label, lv)
		return 0
	}

	h := harness.Hold(t, b, "holder", "-d", "0")
	q := harness.Queue(t, b, "waiter", "-d", "0", "true")
	fams := scrape()
	for _, c := range []struct {
		name, label, value string
		want               float64
	}{
		{"npurun_devices", "state", "leased", 1},
		{"npurun_devices", "state", "free", 1},
		{"npurun_devices", "state", "task", 0},
		{"npurun_waiters", "pool", "default", 1},
		{"npurun_grants_total", "kind", "inline", 1},
		{"npurun_grant_wait_seconds", "kind", "inline", 1},
		{"npurun_tasks", "state", "running", 0},
		{"npurun_unleased_processes", "", "", 0},
		{"npurun_handoff_seconds", "", "", 0},
	} {
		if got := value(fams, c.name, c.label, c.value); got != c.want {
			t.Errorf("%s{%s=%q} = %v, want %v", c.name, c.label, c.value, got, c.want)
		}
	}
	h.Release()
	q.MustSucceed()
	fams = scrape()
	if got := value(fams, "npurun_handoff_seconds", "", ""); got != 1 {
		t.Errorf("handoffs observed: %v, want 1", got)
	}
	if got := value(fams, "npurun_grants_total", "kind", "inline"); got != 2 {
		t.Errorf("grants: %v, want 2", got)
	}
	if hs := fams["npurun_handoff_seconds"].Metric[0].Histogram; hs.GetSampleSum() <= 0 || hs.GetSampleSum() > 5 {
		t.Errorf("handoff took %vs", hs.GetSampleSum())
	}
	if fams["process_cpu_seconds_total"] == nil {
		t.Error("no process metrics of the broker")
	}
}

// TestUsageDefaultSince: npubroker usage without --since counts the last
// 7 days (issue 27.24: it was a usage error), as task-submit list --ended
// looks back; --since still chooses.
func TestUsageDefaultSince(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(1))
	before := time.Now()
	rep := usageReport(t, b)
	after := time.Now()
	week := 7 * 24 * time.Hour
	if since := time.UnixMilli(rep.Since); since.Before(before.Add(-week).Add(-time.Second)) || since.After(after.Add(-week).Add(time.Second)) {
		t.Errorf("usage without --since counts from %s, want 7 days before %s", since, before)
	}
	rep = usageReport(t, b, "--since", "1h")
	if since := time.UnixMilli(rep.Since); since.Before(before.Add(-time.Hour).Add(-time.Second)) {
		t.Errorf("usage --since 1h counts from %s, want an hour ago", since)
	}
}
