package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// benchIdleSamples is how many leases BenchmarkIdleReclaim lets the
// [idle] policy reclaim, half of them ending at SIGTERM, half only at
// SIGKILL.
const benchIdleSamples = 8

// BenchmarkIdleReclaim: the reclaim latency of the [idle] policy, from the
// moment a lease's idle clock crosses [idle] after (idle_since + after, as
// status --json reports them: idle_ends) to the lease's end (its holder
// process reaped and the device free on the board), with util_interval =
// 1s and kill_grace = 1s. The sample that crosses after comes up to one
// interval past that moment, so the target, 2 × util_interval +
// kill_grace, holds the "from the sample that crosses after" with
// a sample's slack to spare. Half the holders end at SIGTERM; the other
// half ignore it, so their end waits for the SIGKILL after kill_grace.
// The end is seen through a status watch after the holder was reaped:
// each figure is an upper bound by the watch's delay.
func BenchmarkIdleReclaim(b *testing.B) {
	benchNoNsPerOp(b)
	const (
		interval = time.Second
		after    = 2 * time.Second
		grace    = time.Second
	)
	dir := filepath.Join(harness.SharedDir(b), "util")
	if err := os.Mkdir(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "npu0"), []byte("0\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	conf := harness.FakeConfig(1) + fmt.Sprintf("fake_util = %q\n\n[status]\nutil_interval = %q\n\n[idle]\nafter = %q\naction = \"reclaim\"\nwarn_before = \"1s\"\n\n[tasks]\nkill_grace = %q\n",
		dir, interval.String(), after.String(), grace.String())
	br := harness.StartBroker(b, conf)
	w := harness.WatchBoards(b, br, nil)
	held := func(x *wire.Board) *wire.LeaseInfo {
		for _, d := range x.Devices {
			if d.ID == 0 {
				return d.Lease
			}
		}
		return nil
	}
	scripts := []string{
		`echo held; exec sleep 1000`,                           // ends at SIGTERM
		`trap "" TERM; echo held; while :; do sleep 0.2; done`, // ends at SIGKILL
	}
	var all, term, kill []time.Duration
	for i := range benchIdleSamples {
		p := harness.StartProc(b, "idle holder", br.Npurun("-d", "0", "sh", "-c", scripts[i%2]))
		p.WaitLine("held")
		bd, _ := w.Next("the lease idle, its end set", func(x *wire.Board) bool {
			l := held(x)
			return l != nil && l.IdleSince > 0 && l.IdleEnds > 0
		})
		l := held(bd)
		if got := time.UnixMilli(l.IdleEnds).Sub(time.UnixMilli(l.IdleSince)); got != after {
			b.Fatalf("idle_ends - idle_since = %v, want %v", got, after)
		}
		crossed := time.UnixMilli(l.IdleEnds)
		select {
		case <-p.Done:
		case <-time.After(harness.EventTimeout):
			b.Fatalf("the idle lease's holder was not ended; broker log:\n%s", br.Log())
		}
		w.Next("npu0 free", func(x *wire.Board) bool { return held(x) == nil })
		d := time.Since(crossed)
		all = append(all, d)
		if i%2 == 0 {
			term = append(term, d)
		} else {
			kill = append(kill, d)
		}
	}
	target := 2*interval + grace
	row := func(what string, ds []time.Duration) []string {
		return []string{what, fmtMs(benchQuantile(ds, 0.5)), fmtMs(benchQuantile(ds, 1))}
	}
	b.ReportMetric(benchMs(benchQuantile(all, 0.5)), "p50-ms")
	b.ReportMetric(benchMs(benchQuantile(all, 1)), "max-ms")
	b.ReportMetric(benchMs(benchQuantile(kill, 1)), "sigkill-max-ms")
	if m := benchQuantile(all, 1); m > target {
		b.Errorf("reclaim latency max %v over the target %v", m, target)
	}
	benchSummary(b, "idle reclaim: after crossed → lease ended, util_interval 1s, kill_grace 1s, "+strconv.Itoa(len(all))+" leases", [][]string{
		{"", "p50", "max"},
		row("ends at SIGTERM", term),
		row("ignores SIGTERM", kill),
		row("all", all),
		{"target (max)", "", "≤ " + fmtMs(target)},
	})
}
