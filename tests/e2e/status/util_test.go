package status

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// utilFiles are the fake vendor's utilization files of a test: the
// broker reads DIR/npuN for device N each [status] util_interval.
type utilFiles struct {
	t   testing.TB
	dir string
}

func newUtilFiles(t testing.TB) utilFiles {
	dir := filepath.Join(harness.SharedDir(t), "util")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return utilFiles{t, dir}
}

// conf is the [devices] line that names the files, and a sample a second.
func (u utilFiles) conf() string {
	return fmt.Sprintf("fake_util = %q\n\n[status]\nutil_interval = \"1s\"\n", u.dir)
}

// set writes device id's file whole (a rename), or removes it for "".
func (u utilFiles) set(id int, s string) {
	u.t.Helper()
	path := filepath.Join(u.dir, fmt.Sprintf("npu%d", id))
	if s == "" {
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			u.t.Fatal(err)
		}
		return
	}
	if err := os.WriteFile(path+".tmp", []byte(s+"\n"), 0o644); err != nil {
		u.t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		u.t.Fatal(err)
	}
}

// leaseOn is the lease of device id on board bd, nil if none.
func leaseOn(bd *wire.Board, id int) *wire.LeaseInfo {
	for _, d := range bd.Devices {
		if d.ID == id {
			return d.Lease
		}
	}
	return nil
}

func is(p *float64, want float64) bool { return p != nil && *p == want }

// nextSamples waits for n samples taken after board bd's, and returns
// the board after them.
func nextSamples(t testing.TB, b *harness.Broker, bd *wire.Board, n int) *wire.Board {
	t.Helper()
	last := bd.Util.Last
	for range n {
		bd = harness.WaitBoard(t, b, func(x *wire.Board) bool { return x.Util != nil && x.Util.Last > last })
		last = bd.Util.Last
	}
	return bd
}

// TestUtilStatus: with the fake vendor's utilization files, status shows
// each device's utilization and each lease's now and held mean; a lease
// with one busy and one idle device is not idle; an idle lease is marked,
// its idle clock kept while every sample is below [idle] below, started
// again after a busy one; a device the tool does not answer for is "-",
// logged once, and ends its lease's idle run; Prometheus has the figures.
func TestUtilStatus(t *testing.T) {
	u := newUtilFiles(t)
	u.set(0, "90 1000 16384")
	u.set(1, "2")
	u.set(2, "1")
	// npu3: no file, so unknown
	b := harness.StartBroker(t, harness.FakeConfig(4)+u.conf()+"\n[broker]\nmetrics_listen = \"127.0.0.1:0\"\n")
	busy := harness.Hold(t, b, "busy", "-d", "0,1")
	idle := harness.Hold(t, b, "idle", "-d", "2")
	defer busy.Release()
	defer idle.Release()

	bd := harness.WaitBoard(t, b, func(x *wire.Board) bool {
		l := leaseOn(x, 0)
		return l != nil && l.Util != nil && leaseOn(x, 2) != nil && leaseOn(x, 2).IdleSince > 0
	})
	if bd.Util == nil || bd.Util.IntervalMS != 1000 || bd.Util.Below != 5 {
		t.Errorf("board's sampling = %+v, want every 1s, below 5%%", bd.Util)
	}
	d0, d3 := harness.Device(t, bd, 0), harness.Device(t, bd, 3)
	if !is(d0.Util, 90) || d0.MemUsed != 1000 || d0.MemTotal != 16384 {
		t.Errorf("npu0 = %v%% %d/%d MiB, want 90%% 1000/16384", d0.Util, d0.MemUsed, d0.MemTotal)
	}
	if d3.Util != nil || !strings.Contains(d3.UtilUnknown, "npu3") {
		t.Errorf("npu3, with no file, = %v (unknown: %q), want unknown", d3.Util, d3.UtilUnknown)
	}
	if l := leaseOn(bd, 0); !is(l.Util, 46) || l.IdleSince != 0 {
		t.Errorf("lease of npu0 (90%%) and npu1 (2%%): now %v, idle since %d; want 46%%, not idle", l.Util, l.IdleSince)
	}
	b.WaitLog(0, "utilization of npu3 unknown: ")

	out := b.Status(t)
	for _, re := range []string{
		`(?m)^DEVICE +POOL +STATE +USER +PID +COMMAND +UTIL \(now / held\) +SINCE$`,
		`(?m)^npu0 +default +leased +\S+ +[0-9]+ +sh -c .* +90% / 46% +[0-9]+s$`,
		`(?m)^npu1 +default +leased +\S+ +[0-9]+ +sh -c .* +2% / 46% +[0-9]+s$`,
		`(?m)^npu2 +default +leased +\S+ +[0-9]+ +sh -c .* +1% / 1% +[0-9]+s +idle [0-9]+s$`,
		`(?m)^npu3 +default +free +-$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("status lacks %s:\n%s", re, out)
		}
	}
	js := b.Status(t, "--json")
	for _, want := range []string{`"util": 90,`, `"mem_used": 1000,`, `"util_held": 46`, `"idle_since": `, `"util_unknown": "`, `"below": 5`} {
		if !strings.Contains(js, want) {
			t.Errorf("status --json lacks %s:\n%s", want, js)
		}
	}

	// The idle clock keeps its start while every sample is below.
	since := leaseOn(bd, 2).IdleSince
	bd = nextSamples(t, b, bd, 2)
	if got := leaseOn(bd, 2).IdleSince; got != since {
		t.Errorf("idle npu2's idle since moved from %d to %d while it stayed idle", since, got)
	}
	// A busy sample ends the run; the next idle one starts another.
	u.set(2, "50")
	bd = harness.WaitBoard(t, b, func(x *wire.Board) bool { return is(leaseOn(x, 2).Util, 50) })
	if l := leaseOn(bd, 2); l.IdleSince != 0 {
		t.Errorf("busy npu2's lease is idle since %d", l.IdleSince)
	}
	u.set(2, "0")
	bd = harness.WaitBoard(t, b, func(x *wire.Board) bool { return leaseOn(x, 2).IdleSince > 0 })
	if l := leaseOn(bd, 2); l.IdleSince <= since {
		t.Errorf("npu2 idle again since %d, not after its first idle run (%d)", l.IdleSince, since)
	}

	// Both devices of the two-device lease idle: it is idle.
	u.set(0, "0 10 16384")
	bd = harness.WaitBoard(t, b, func(x *wire.Board) bool { return leaseOn(x, 0).IdleSince > 0 })
	// Metrics: each device's figures, each lease's idle seconds.
	m := regexp.MustCompile(`metrics on (http://\S+/metrics)`).FindStringSubmatch(b.Log())
	if m == nil {
		t.Fatalf("no metrics address in the broker log:\n%s", b.Log())
	}
	resp, err := http.Get(m[1])
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, re := range []string{
		`(?m)^npurun_device_utilization_percent\{device="npu0"\} 0$`,
		`(?m)^npurun_device_utilization_percent\{device="npu1"\} 2$`,
		`(?m)^npurun_device_memory_used_bytes\{device="npu0"\} 1\.048576e\+07$`,
		`(?m)^npurun_device_memory_total_bytes\{device="npu0"\} 1\.7179869184e\+10$`,
		`(?m)^npurun_lease_idle_seconds\{device="npu0",kind="inline",user="\S+"\} [0-9.e+]+$`,
		`(?m)^npurun_lease_idle_seconds\{device="npu2",kind="inline",user="\S+"\} [0-9.e+]+$`,
	} {
		if !regexp.MustCompile(re).Match(body) {
			t.Errorf("metrics lack %s:\n%s", re, body)
		}
	}
	if regexp.MustCompile(`npurun_device_utilization_percent\{device="npu3"\}`).Match(body) {
		t.Errorf("metrics have a utilization for npu3, which is unknown")
	}

	// A tool that answers what does not parse: npu1 unknown, "-", said
	// once; unknown is never idle, so the lease of npu0 and npu1 is not.
	mark := b.LogLen()
	u.set(1, "lots")
	bd = harness.WaitBoard(t, b, func(x *wire.Board) bool { return harness.Device(t, x, 1).Util == nil })
	if l := leaseOn(bd, 0); l.IdleSince != 0 || l.Util != nil {
		t.Errorf("lease of idle npu0 and unknown npu1: now %v, idle since %d; want unknown, not idle", l.Util, l.IdleSince)
	}
	if !regexp.MustCompile(`(?m)^npu1 +default +leased .* - / [0-9]+% +[0-9]+s$`).MatchString(b.Status(t)) {
		t.Errorf("status does not show npu1 unknown:\n%s", b.Status(t))
	}
	nextSamples(t, b, bd, 2)
	if n := strings.Count(b.Log()[mark:], "utilization of npu1 unknown: "); n != 1 {
		t.Errorf("npu1's unknown utilization logged %d times, want once:\n%s", n, b.Log()[mark:])
	}
	u.set(1, "0")
	b.WaitLog(mark, "utilization of npu1 known again")
	harness.WaitBoard(t, b, func(x *wire.Board) bool { return leaseOn(x, 0).IdleSince > 0 })
}

// TestUtilShare: a share sees its device's figures: two shares of a busy
// device are busy, neither idle; of an idle one, both idle.
func TestUtilShare(t *testing.T) {
	u := newUtilFiles(t)
	u.set(0, "80")
	b := harness.StartBroker(t, strings.Replace(harness.ShareConfig(1, "16G"), "[share]", u.conf()+"\n[share]", 1))
	a := harness.Hold(t, b, "a", "--mem", "4G")
	c := harness.Hold(t, b, "c", "--mem", "4G")
	defer a.Release()
	defer c.Release()
	shares := func(x *wire.Board) []wire.LeaseInfo { return harness.Device(t, x, 0).Shares }
	bd := harness.WaitBoard(t, b, func(x *wire.Board) bool {
		s := shares(x)
		return len(s) == 2 && s[0].Util != nil && s[1].Util != nil
	})
	for _, s := range shares(bd) {
		if !is(s.Util, 80) || s.IdleSince != 0 {
			t.Errorf("share of %s on busy npu0: now %v, idle since %d; want 80%%, not idle", s.User, s.Util, s.IdleSince)
		}
	}
	u.set(0, "0")
	harness.WaitBoard(t, b, func(x *wire.Board) bool {
		s := shares(x)
		return len(s) == 2 && s[0].IdleSince > 0 && s[1].IdleSince > 0
	})
}

// TestUtilAscendTool: on Ascend the broker asks npu-smi info -t usages
// -i CARD -c CHIP for each device, through the runner the health checks
// use: a card that answers with a 910B's layout is read; one whose
// npu-smi hangs is unknown ("-") once the round's time (the interval) is
// up, and the other devices are still sampled the next round; with no
// npu-smi at all nothing is sampled, said once, and status has no UTIL.
func TestUtilAscendTool(t *testing.T) {
	dev := harness.FakeDev(t, 2)
	dir := harness.SharedDir(t)
	busy := filepath.Join(harness.Root(), "npu", "testdata", "usages", "910b-busy.txt")
	smi := filepath.Join(dir, "npu-smi")
	script := `#!/bin/sh
[ "$1 $2 $3 $4 $6 $7" = "info -t usages -i -c 0" ] || exit 2
case $5 in
0) exec cat ` + busy + ` ;;
*) exec sleep 60 ;;
esac
`
	if err := os.WriteFile(smi, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	conf := strings.Replace(harness.AscendConfig(dev, 2, "[status]\nutil_interval = \"1s\"\n"), "/nonexistent/npu-smi", smi, 1)
	b := harness.StartBroker(t, conf)
	h := harness.Hold(t, b, "h", "-d", "0")
	defer h.Release()
	bd := harness.WaitBoard(t, b, func(x *wire.Board) bool {
		return is(harness.Device(t, x, 0).Util, 97) && harness.Device(t, x, 1).UtilUnknown != "" && leaseOn(x, 0) != nil && leaseOn(x, 0).Util != nil
	})
	if d := harness.Device(t, bd, 0); d.MemTotal != 65536 || d.MemUsed != 30147 {
		t.Errorf("npu0's memory: %d of %d MiB, want 30147 of 65536", d.MemUsed, d.MemTotal)
	}
	if d := harness.Device(t, bd, 1); !strings.Contains(d.UtilUnknown, "no answer in time") {
		t.Errorf("npu1, whose npu-smi hangs: unknown for %q, want no answer in time", d.UtilUnknown)
	}
	bd = nextSamples(t, b, bd, 1)
	if !is(harness.Device(t, bd, 0).Util, 97) {
		t.Errorf("npu0 not sampled after a round that hung on npu1: %v", harness.Device(t, bd, 0).Util)
	}
	out := b.Status(t)
	if !regexp.MustCompile(`(?m)^npu0 +default +leased .* 97% / 97% +[0-9]+s$`).MatchString(out) || !regexp.MustCompile(`(?m)^npu1 +default +free +-$`).MatchString(out) {
		t.Errorf("status:\n%s", out)
	}

	none := harness.StartBroker(t, harness.AscendConfig(harness.FakeDev(t, 2), 2, "[status]\nutil_interval = \"1s\"\n"))
	none.WaitLog(0, "utilization not sampled: no such tool: run /nonexistent/npu-smi info -t usages -i 0 -c 0: ")
	if bd := none.Board(t); bd.Util != nil || harness.Device(t, bd, 0).UtilUnknown != "" {
		t.Errorf("with no npu-smi, the board says it samples: %+v", bd.Util)
	}
	if out := none.Status(t); strings.Contains(out, "UTIL") {
		t.Errorf("with no npu-smi, status has UTIL:\n%s", out)
	}
	if n := strings.Count(none.Log(), "utilization not sampled"); n != 1 {
		t.Errorf("no npu-smi said %d times, want once:\n%s", n, none.Log())
	}
}

// TestUtilReload: a reload takes up [status] util_interval (from "0",
// never, to a sample a second: the sampling starts) and [idle] below
// (a lease at 30% becomes idle under 50%), for leases already held.
func TestUtilReload(t *testing.T) {
	u := newUtilFiles(t)
	u.set(0, "30")
	conf := func(every, below string) string {
		return harness.FakeConfig(2) + fmt.Sprintf("fake_util = %q\n[status]\nutil_interval = %q\n[idle]\nbelow = %s\n", u.dir, every, below)
	}
	b := harness.StartBroker(t, conf("0", "5"))
	h := harness.Hold(t, b, "h", "-d", "0")
	defer h.Release()
	if bd := b.Board(t); bd.Util != nil || leaseOn(bd, 0).Util != nil {
		t.Fatalf("util_interval \"0\" samples: %+v", bd.Util)
	}
	harness.WriteConf(t, b, conf("1s", "5"))
	if code, info, errs := harness.Reload(t, b); code != 0 || !strings.Contains(strings.Join(info.Changed, " "), "[status]") {
		t.Fatalf("reload: exit %d, %+v, %s", code, info, errs)
	}
	bd := harness.WaitBoard(t, b, func(x *wire.Board) bool { return x.Util != nil && is(leaseOn(x, 0).Util, 30) })
	if l := leaseOn(bd, 0); l.IdleSince != 0 {
		t.Errorf("a lease at 30%% is idle under 5%%: since %d", l.IdleSince)
	}
	harness.WriteConf(t, b, conf("1s", "50"))
	if code, info, errs := harness.Reload(t, b); code != 0 || !strings.Contains(strings.Join(info.Changed, " "), "[idle]") {
		t.Fatalf("reload: exit %d, %+v, %s", code, info, errs)
	}
	harness.WaitBoard(t, b, func(x *wire.Board) bool { return x.Util != nil && x.Util.Below == 50 && leaseOn(x, 0).IdleSince > 0 })

	// Off again: no figures on the board, the lease's included.
	harness.WriteConf(t, b, conf("0", "50"))
	if code, _, errs := harness.Reload(t, b); code != 0 {
		t.Fatalf("reload: exit %d, %s", code, errs)
	}
	harness.WaitBoard(t, b, func(x *wire.Board) bool {
		l := leaseOn(x, 0)
		return x.Util == nil && harness.Device(t, x, 0).Util == nil && l.Util == nil && l.UtilHeld == nil && l.IdleSince == 0
	})
}

// TestUtilRestart: a lease's figures are kept across a broker restart,
// SIGTERM or kill -9 alike, as the docs say: after the restart the lease
// taken up again keeps its held mean (the new samples added to the old),
// and its idle clock and the warning given where the first new sample
// finds it idle still (idle since the same time, not warned again); a
// first sample that finds it busy ends the idle run, the mean going on.
func TestUtilRestart(t *testing.T) {
	// Warned at once, never acted on: the warned mark is kept too.
	const warnNow = "\n[idle]\nafter = \"1h\"\naction = \"warn\"\nwarn_before = \"1h\"\n"
	for _, tc := range []struct {
		name  string
		stop  func(*harness.Broker)
		after float64 // the utilization from the restart on
	}{
		{"SIGTERM", (*harness.Broker).Stop, 3},
		{"kill-9", (*harness.Broker).Kill, 3},
		{"kill-9-busy", (*harness.Broker).Kill, 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUtilFiles(t)
			u.set(0, "1")
			b := harness.StartBroker(t, harness.FakeConfig(1)+u.conf()+warnNow)
			h := harness.Hold(t, b, "h", "-d", "0")
			defer h.Release()
			bd := harness.WaitBoard(t, b, func(x *wire.Board) bool { l := leaseOn(x, 0); return l != nil && l.IdleSince > 0 && l.Warned })
			before := *leaseOn(bd, 0)
			bd = nextSamples(t, b, bd, 2)
			if l := leaseOn(bd, 0); !is(l.UtilHeld, 1) || l.IdleSince != before.IdleSince {
				t.Fatalf("before the restart: %+v; want held 1%%, idle since %d", l, before.IdleSince)
			}
			if st, err := os.Stat(filepath.Join(b.StateDir, "util.json")); err != nil || st.Mode().Perm() != 0o600 {
				t.Errorf("the state directory's util.json: %v, %v; want it, mode 0600", st, err)
			}
			tc.stop(b)
			u.set(0, fmt.Sprint(tc.after))
			b.Start()
			bd = harness.WaitBoard(t, b, func(x *wire.Board) bool { return x.Util != nil && leaseOn(x, 0) != nil })
			l := leaseOn(bd, 0)
			if l.ID != before.ID || !is(l.Util, tc.after) {
				t.Fatalf("after the restart: %+v; want lease %d taken up, now %v%%", l, before.ID, tc.after)
			}
			if l.UtilHeld == nil || *l.UtilHeld <= 1 || *l.UtilHeld >= tc.after {
				held := "none"
				if l.UtilHeld != nil {
					held = fmt.Sprint(*l.UtilHeld)
				}
				t.Errorf("after the restart the held mean is %s; want the samples before it (1%%) and after (%v%%) both counted", held, tc.after)
			}
			switch {
			case tc.after < 5 && (l.IdleSince != before.IdleSince || !l.Warned):
				t.Errorf("still idle after the restart: idle since %d, warned %v; want %d kept, and the warning", l.IdleSince, l.Warned, before.IdleSince)
			case tc.after >= 5 && (l.IdleSince != 0 || l.Warned):
				t.Errorf("busy after the restart: idle since %d, warned %v; want the idle run ended", l.IdleSince, l.Warned)
			}
			if !strings.Contains(b.Log(), "utilization: the figures of 1 lease(s) from before this start go on") {
				t.Errorf("the restart does not say the figures go on")
			}
			if n := strings.Count(b.Log(), "its holders are warned"); n != 1 {
				t.Errorf("warned %d times; want once, before the restart", n)
			}
		})
	}
}
