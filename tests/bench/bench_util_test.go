package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
)

// benchUtilSamples is how many samples, one a second, BenchmarkUtilCPU
// measures: a minute.
const benchUtilSamples = 60

// BenchmarkUtilCPU: the broker's own CPU time (user and system, from
// /proc) while it samples 16 fake devices every second, 8 of them leased,
// as a share of one core (target ≤ 0.5%). The background /proc scan is
// set far apart so that the figure is the sampling's; the fake vendor's
// "tool" is a file read in the broker, so nothing is left out.
func BenchmarkUtilCPU(b *testing.B) {
	benchNoNsPerOp(b)
	dir := filepath.Join(harness.SharedDir(b), "util")
	if err := os.Mkdir(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	for id := range 16 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("npu%d", id)), []byte(fmt.Sprintf("%d 1000 65536\n", id*6)), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	conf := harness.FakeConfig(16) + fmt.Sprintf("fake_util = %q\n[status]\nutil_interval = \"1s\"\nscan_interval = \"1h\"\n", dir)
	br := harness.StartBroker(b, conf)
	for id := range 8 {
		h := harness.Hold(b, br, "h"+strconv.Itoa(id), "-d", strconv.Itoa(id))
		b.Cleanup(h.Release)
	}
	br.Mu.Lock()
	pid := br.Cmd.Process.Pid
	br.Mu.Unlock()
	// No watcher during the window (each sample would have the broker
	// send it a board): the first sample polled for, then a minute.
	first := br.Board(b)
	for first.Util == nil {
		time.Sleep(100 * time.Millisecond)
		first = br.Board(b)
	}
	c0, t0 := benchCPU(b, pid), time.Now()
	time.Sleep(benchUtilSamples * time.Second)
	c1, t1 := benchCPU(b, pid), time.Now()
	last := br.Board(b)
	samples := int((last.Util.Last - first.Util.Last) / 1000)
	if samples < benchUtilSamples*9/10 {
		b.Errorf("%d samples in %s, want about %d", samples, t1.Sub(t0).Round(time.Second), benchUtilSamples)
	}
	share := (c1 - c0).Seconds() / t1.Sub(t0).Seconds()
	b.ReportMetric(100*share, "cpu-%")
	benchSummary(b, "utilization sampling, 16 fake devices, every second", [][]string{
		{"samples", strconv.Itoa(samples)},
		{"broker CPU over " + t1.Sub(t0).Round(time.Second).String(), strconv.FormatFloat(100*share, 'f', 3, 64) + "% of one core (target ≤ 0.5%)"},
	})
}

// BenchmarkStatusUtil: `npubroker status` (exec, ask, print) of a broker
// that samples utilization beside one that does not, interleaved, each
// with 4 fake devices leased, 5,000 extra processes on the machine
// (target: ≤ 1.05× at p50).
func BenchmarkStatusUtil(b *testing.B) {
	benchNoNsPerOp(b)
	dir := filepath.Join(harness.SharedDir(b), "util")
	if err := os.Mkdir(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	for id := range 4 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("npu%d", id)), []byte("50 1000 65536\n"), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	with := harness.StartBroker(b, harness.FakeConfig(4)+fmt.Sprintf("fake_util = %q\n[status]\nutil_interval = \"1s\"\n", dir))
	without := harness.StartBroker(b, harness.FakeConfig(4))
	for _, br := range []*harness.Broker{with, without} {
		for id := range 4 {
			h := harness.Hold(b, br, "h"+strconv.Itoa(id), "-d", strconv.Itoa(id))
			b.Cleanup(h.Release)
		}
	}
	benchSleepers(b, benchExtraProcs)
	for with.Board(b).Util == nil {
		time.Sleep(100 * time.Millisecond)
	}
	status := func(br *harness.Broker) *exec.Cmd {
		cmd := exec.Command(br.Bin.Broker, "status")
		cmd.Env = br.Env()
		return cmd
	}
	for range 3 {
		benchTimeRun(b, status(with))
		benchTimeRun(b, status(without))
	}
	var tw, to []time.Duration
	for i := range benchStatusSamples {
		if i%2 == 0 {
			tw = append(tw, benchTimeRun(b, status(with)))
			to = append(to, benchTimeRun(b, status(without)))
		} else {
			to = append(to, benchTimeRun(b, status(without)))
			tw = append(tw, benchTimeRun(b, status(with)))
		}
	}
	w50, o50 := benchQuantile(tw, 0.5), benchQuantile(to, 0.5)
	b.ReportMetric(float64(w50)/float64(o50), "with/without")
	benchSummary(b, "npubroker status with utilization beside without, "+strconv.Itoa(benchExtraProcs)+" extra processes", [][]string{
		{"", "p50", "p90", "target"},
		{"with UTIL", fmtMs(w50), fmtMs(benchQuantile(tw, 0.9)), ""},
		{"without", fmtMs(o50), fmtMs(benchQuantile(to, 0.9)), ""},
		{"ratio p50", strconv.FormatFloat(float64(w50)/float64(o50), 'f', 3, 64), "", "≤ 1.05"},
	})
}
