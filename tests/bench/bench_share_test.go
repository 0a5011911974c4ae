package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
)

const (
	benchShareJobs    = 40
	benchShareDevices = 4
	benchShareCap     = 64 // GiB a device
	benchShareGrants  = 100
)

// benchShareJob is one job of the mixed workload.
type benchShareJob struct {
	mem  int // GiB
	hold time.Duration
}

// benchShareWorkload is a mixed workload, the same every run: memory
// between 2 and 60 GiB, uniform or log-uniform, run times between 0.2
// and 2 s.
func benchShareWorkload(logUniform bool) []benchShareJob {
	r := rand.New(rand.NewPCG(19, 2026))
	jobs := make([]benchShareJob, benchShareJobs)
	for i := range jobs {
		mem := 2 + r.IntN(59)
		if logUniform {
			mem = int(math.Round(2 * math.Pow(30, r.Float64())))
		}
		jobs[i] = benchShareJob{mem: mem, hold: 200*time.Millisecond + time.Duration(r.IntN(1801))*time.Millisecond}
	}
	return jobs
}

// benchShareRun runs jobs at once under npurun, as shares (shared) or
// whole devices, and returns the makespan: from the first launch to the
// last end. Shares check the declarations on their device themselves.
func benchShareRun(b *testing.B, br *harness.Broker, jobs []benchShareJob, shared bool) time.Duration {
	w := harness.NewWorkload(b)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(jobs))
	for i, j := range jobs {
		args := w.Args(br, fmt.Sprintf("j%d", i), j.hold)
		if shared {
			args = append([]string{"--mem", fmt.Sprintf("%dG", j.mem)}, args...)
			args = append(args, "-mem", fmt.Sprint(j.mem*1024), "-capacity", fmt.Sprint(benchShareCap*1024))
		}
		cmd := br.Npurun(args...)
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := cmd.Wait(); err != nil {
				errs <- fmt.Errorf("job %d (%dG, %s): %v", i, j.mem, j.hold, err)
			}
		}()
		time.Sleep(2 * time.Millisecond) // arrival in job order, mostly
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Error(err)
	}
	var last int64
	for _, r := range w.Runs(b) {
		last = max(last, r.End)
	}
	return time.Unix(0, last).Sub(start)
}

func BenchmarkShares(b *testing.B) {
	benchNoNsPerOp(b)
	br := harness.StartBroker(b, harness.FakeConfig(benchShareDevices)+fmt.Sprintf("[share]\npools = \"all\"\ncapacity = \"%dG\"\nmargin = \"0\"\n", benchShareCap))
	rows := [][]string{{"mix", "whole only", "shares", "lower bound", "shares/whole", "shares/bound"}}
	for _, mix := range []struct {
		name       string
		logUniform bool
	}{{"uniform", false}, {"log-uniform", true}} {
		jobs := benchShareWorkload(mix.logUniform)
		var memSec float64
		var longest time.Duration
		for _, j := range jobs {
			memSec += float64(j.mem) * j.hold.Seconds()
			longest = max(longest, j.hold)
		}
		bound := time.Duration(max(memSec/float64(benchShareDevices*benchShareCap), longest.Seconds()) * float64(time.Second))
		whole := benchShareRun(b, br, jobs, false)
		shares := benchShareRun(b, br, jobs, true)
		b.ReportMetric(shares.Seconds()/whole.Seconds(), mix.name+"-ratio-whole")
		b.ReportMetric(shares.Seconds()/bound.Seconds(), mix.name+"-ratio-bound")
		rows = append(rows, []string{mix.name, fmt.Sprintf("%.2f s", whole.Seconds()), fmt.Sprintf("%.2f s", shares.Seconds()), fmt.Sprintf("%.2f s", bound.Seconds()),
			fmt.Sprintf("%.2f×", shares.Seconds()/whole.Seconds()), fmt.Sprintf("%.2f×", shares.Seconds()/bound.Seconds())})
	}

	share := &benchSide{name: "npurun --mem 4G /bin/true", sample: func() time.Duration {
		return benchTimeRun(b, br.Npurun("--mem", "4G", "/bin/true"))
	}}
	wholeGrant := &benchSide{name: "npurun /bin/true", sample: func() time.Duration {
		return benchTimeRun(b, br.Npurun("/bin/true"))
	}}
	benchInterleave(10, share, wholeGrant)
	share.got, wholeGrant.got = nil, nil
	benchInterleave(benchShareGrants, share, wholeGrant)
	b.ReportMetric(float64(share.p50())/float64(wholeGrant.p50()), "ratio-grant")
	rows = append(rows, []string{"grant", "p10 ms", "p50 ms", "p90 ms"}, share.row(), wholeGrant.row(), []string{"share / whole grant, p50", ratio(share, wholeGrant)})
	benchSummary(b, fmt.Sprintf("%d jobs of 2-60 GiB, 0.2-2 s, %d devices of %d GiB (targets: shares ≤ 0.5× whole, ≤ 1.15× bound; share grant ≤ 1.1× whole)", benchShareJobs, benchShareDevices, benchShareCap), rows)
}
