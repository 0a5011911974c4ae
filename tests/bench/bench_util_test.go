package bench

import (
	"fmt"
	"os"
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
