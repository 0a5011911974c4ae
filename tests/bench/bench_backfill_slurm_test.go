package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// BenchmarkBackfillSlurm (make bench-slurm; not in make bench, make test
// or CI: it runs for half an hour): one trace of 20 jobs of 1 to 4
// devices and 1 to 4 minutes, each with a time limit in whole minutes
// (its run time × 1..3, rounded up), submitted in order at once, run on 4
// fake devices through the broker (task-submit --time) and through a
// private single-node Slurm (sched/backfill, bf_interval=1) side by side.
// Each job records its start and end itself; makespan is the last end
// less the first submission, wait a job's start less its submission.
func BenchmarkBackfillSlurm(b *testing.B) {
	if os.Getenv("NPURUN_BENCH_SLURM") == "" {
		b.Skip("make bench-slurm runs it (NPURUN_BENCH_SLURM=1): half an hour of a private Slurm beside the broker")
	}
	harness.NeedRoot(b)
	harness.NeedSlurm(b)
	type job struct {
		n        int
		run      int // seconds
		limitMin int
	}
	r := rand.New(rand.NewPCG(31, 20))
	jobs := make([]job, 20)
	for i := range jobs {
		run := 60 + r.IntN(181)
		jobs[i] = job{n: 1 + r.IntN(4), run: run, limitMin: int(math.Ceil(float64(run) * (1 + 2*r.Float64()) / 60))}
	}
	dir := harness.SharedDir(b)
	script := func(side string, i int) string {
		p := filepath.Join(dir, side+strconv.Itoa(i))
		return fmt.Sprintf("date +%%s%%N > %s.start; sleep %d; date +%%s%%N > %s.end", p, jobs[i].run, p)
	}
	stamp := func(side string, i int, what string) int64 {
		data, err := os.ReadFile(filepath.Join(dir, side+strconv.Itoa(i)+"."+what))
		if err != nil {
			b.Fatalf("%s job %d: %v", side, i, err)
		}
		ns, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		if err != nil {
			b.Fatalf("%s job %d: %v", side, i, err)
		}
		return ns
	}
	figures := func(side string, submitted []time.Time) (makespan, wait time.Duration) {
		var last int64
		for i := range jobs {
			last = max(last, stamp(side, i, "end"))
			wait += time.Duration(stamp(side, i, "start") - submitted[i].UnixNano())
		}
		return time.Duration(last - submitted[0].UnixNano()), wait / time.Duration(len(jobs))
	}
	const within = 45 * time.Minute
	br := harness.StartBroker(b, harness.TaskConfig(4))
	c := harness.StartSlurm(b, harness.SlurmOptions{Devices: 4, CPUs: 8, Scheduler: "sched_interval=1,bf_interval=1",
		Extra: "SchedulerType=sched/backfill\nSlurmdParameters=config_overrides\n"})
	// Both at once: the jobs sleep, and the two do not share devices.
	nSub, sSub := make([]time.Time, len(jobs)), make([]time.Time, len(jobs))
	tasks, sjobs := make([]uint64, len(jobs)), make([]uint32, len(jobs))
	for i, j := range jobs {
		nSub[i] = time.Now()
		tasks[i] = harness.SubmitTask(b, br, nil, "/", "-n", strconv.Itoa(j.n), "--time", strconv.Itoa(j.limitMin)+"m", "--run", script("npurun", i))
		sSub[i] = time.Now()
		sjobs[i] = c.Sbatch(nil, "--gres=gpu:"+strconv.Itoa(j.n), "--time="+strconv.Itoa(j.limitMin), "--wrap", script("slurm", i))
	}
	deadline := time.Now().Add(within)
	for {
		out := harness.RunTaskCmd(b, br.TaskSubmit("list", "--json", "--all")).Stdout
		var ts []wire.TaskInfo
		if err := json.Unmarshal([]byte(out), &ts); err != nil {
			b.Fatalf("list --json: %v", err)
		}
		done := 0
		for _, id := range tasks {
			if t := harness.FindTask(ts, id); t != nil && t.Ended != 0 {
				done++
			}
		}
		for _, id := range sjobs {
			if c.JobState(id) == "" {
				done++
			}
		}
		if done == 2*len(jobs) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("not done after %s", within)
		}
		time.Sleep(2 * time.Second)
	}
	npurunSpan, npurunWait := figures("npurun", nSub)
	slurmSpan, slurmWait := figures("slurm", sSub)
	b.ReportMetric(npurunSpan.Seconds()/slurmSpan.Seconds(), "makespan/slurm")
	b.ReportMetric(npurunWait.Seconds()/slurmWait.Seconds(), "wait/slurm")
	b.Logf("== 20 jobs, 1-4 devices, 1-4 min, --time in minutes, on 4 fake devices ==\n"+
		"npurun (task-submit --time)    makespan %s, mean wait %s\n"+
		"Slurm (sched/backfill, bf_interval=1)  makespan %s, mean wait %s\n"+
		"npurun / Slurm: makespan %.3f×, mean wait %.3f×",
		npurunSpan.Round(time.Second), npurunWait.Round(time.Second), slurmSpan.Round(time.Second), slurmWait.Round(time.Second),
		npurunSpan.Seconds()/slurmSpan.Seconds(), npurunWait.Seconds()/slurmWait.Seconds())
}
