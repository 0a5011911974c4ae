package bench

import (
	"strconv"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
)

// BenchmarkKillUnderBurst: every 1.5 s, 24 concurrent task-submit --json
// from 4 users (-n 2, -d N, --no-device; cpu_slots = 2), 8 npurun clients
// alongside, the broker killed every 2–4 s, 50 times.
func BenchmarkKillUnderBurst(b *testing.B) {
	for b.Loop() {
		r := harness.KillUnderBurst(b, harness.Burst{Round: 1500 * time.Millisecond, PerRound: 24, Npurun: 8,
			KillEvery: [2]time.Duration{2 * time.Second, 4 * time.Second}, Kills: 50})
		b.ReportMetric(float64(r.Kills), "kills")
		b.ReportMetric(float64(r.Acked), "acknowledged")
		b.ReportMetric(float64(r.NeverRan), "never-ran")
		b.ReportMetric(float64(r.RanTwice), "ran-twice")
		b.ReportMetric(float64(r.RefusedRan), "refused-ran")
		b.ReportMetric(float64(r.Unknown), "unknown")
		benchSummary(b, "kill -9 under bursts of submissions (targets: never ran 0, ran twice 0, over ≥ 50 kills)", [][]string{
			{"kills", "submitted", "acknowledged", "ran once", "never ran", "ran twice", "refused", "refused, ran", "unknown", "lost", "answer lost", "unstarted", "npurun runs", "double grants"},
			{strconv.Itoa(r.Kills), strconv.Itoa(r.Submitted), strconv.Itoa(r.Acked), strconv.Itoa(r.RanOnce), strconv.Itoa(r.NeverRan), strconv.Itoa(r.RanTwice),
				strconv.Itoa(r.Refused), strconv.Itoa(r.RefusedRan), strconv.Itoa(r.Unknown), strconv.Itoa(r.Lost), strconv.Itoa(r.AnswersLost), strconv.Itoa(r.Unstarted),
				strconv.Itoa(r.NpurunRuns), strconv.Itoa(r.DoubleGrants)},
		})
	}
}
