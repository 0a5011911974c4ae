package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
)

// Samples of the login-side benchmarks (issue 32), on a private cluster of
// two nodes on this machine (each with its npubroker in split mode).
const (
	benchClusterSamples = 15   // each side, interleaved
	benchClusterSubmits = 1000 // each side, 8 clients, as the issue asks
	benchClusterClients = 8
)

// BenchmarkClusterLogin: on a login node ([cluster] scheduler = "slurm"),
// (1) `npurun -- true` against `srun --gres=gpu:1 true`; (2) submit to
// start of `task-submit` against `sbatch` of the same job (each job
// stamps the time it starts; the node idle before each); (3) submissions
// from 8 clients at once, task-submit against sbatch, into a partition
// that is down (accepted, never started): every one accepted or refused
// with 75, none lost (the ids printed are the jobs slurmctld has), and
// the throughput. Targets: ≤ 1.05× for (1) and (2), ≥ 0.9× sbatch's
// throughput for (3).
func BenchmarkClusterLogin(b *testing.B) {
	benchNoNsPerOp(b)
	c := harness.StartSlurmCluster(b, harness.SlurmClusterOptions{More: "PartitionName=parked Nodes=n1,n2 MaxTime=INFINITE State=DOWN\n"})
	bin := harness.Bins(b)
	idle := func() {
		deadline := time.Now().Add(60 * time.Second)
		for {
			out, _ := c.Command("squeue", "-h", "-p", "npu", "-o", "%i").Output()
			st, _ := c.Command("sinfo", "-h", "-p", "npu", "-o", "%t").Output()
			if strings.TrimSpace(string(out)) == "" && strings.TrimSpace(string(st)) == "idle" {
				return
			}
			if time.Now().After(deadline) {
				b.Fatalf("the nodes are not idle after 60s: %s %s", out, st)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	login := func(program string, args ...string) *exec.Cmd { return c.Login(nil, program, args...) }

	// (1) npurun against srun.
	npurun := &benchSide{name: "npurun -- true (login side)", sample: func() time.Duration {
		idle()
		return benchTimeRun(b, login(bin.Npurun, "--", "true"))
	}}
	srun := &benchSide{name: "srun --gres=gpu:1 true", sample: func() time.Duration {
		idle()
		cmd := c.Command("srun", "--gres=gpu:1", "--partition=npu", "true")
		cmd.Dir = c.Work
		return benchTimeRun(b, cmd)
	}}
	benchInterleave(2, npurun, srun)
	npurun.got, srun.got = nil, nil
	benchInterleave(benchClusterSamples, npurun, srun)

	// (2) submit to start.
	stamps := harness.SharedDir(b)
	n := 0
	startOf := func(cmd func(stamp string) *exec.Cmd) func() time.Duration {
		return func() time.Duration {
			idle()
			n++
			stamp := filepath.Join(stamps, strconv.Itoa(n))
			t0 := time.Now()
			if out, err := cmd(stamp).CombinedOutput(); err != nil {
				b.Fatalf("submit: %v\n%s", err, out)
			}
			deadline := time.Now().Add(60 * time.Second)
			for {
				if data, err := os.ReadFile(stamp); err == nil && strings.HasSuffix(string(data), "\n") {
					ns, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
					if err != nil {
						b.Fatalf("stamp %q", data)
					}
					return time.Unix(0, ns).Sub(t0)
				}
				if time.Now().After(deadline) {
					b.Fatalf("job of stamp %s not started in 60s", stamp)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
	job := func(stamp string) string { return "date +%s%N > " + stamp + ".tmp && mv " + stamp + ".tmp " + stamp }
	ts := &benchSide{name: "task-submit -n 1 (submit → start)", sample: startOf(func(stamp string) *exec.Cmd {
		return login(bin.TaskSubmit, "-n", "1", "--run", job(stamp))
	})}
	sb := &benchSide{name: "sbatch --gres=gpu:1 (submit → start)", sample: startOf(func(stamp string) *exec.Cmd {
		cmd := c.Command("sbatch", "--parsable", "--gres=gpu:1", "--partition=npu", "--wrap="+job(stamp))
		cmd.Dir = c.Work
		return cmd
	})}
	benchInterleave(1, ts, sb)
	ts.got, sb.got = nil, nil
	benchInterleave(benchClusterSamples, ts, sb)

	// (3) many submissions at once.
	idRE := regexp.MustCompile(`^task (\d+) submitted \(Slurm job \d+, partition parked\)\n$`)
	burst := func(name string, one func() *exec.Cmd, id func(string) string) (time.Duration, []string, int) {
		var mu sync.Mutex
		var ids []string
		refused := 0
		var wg sync.WaitGroup
		t0 := time.Now()
		for range benchClusterClients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range benchClusterSubmits / benchClusterClients {
					cmd := one()
					out, err := cmd.Output()
					mu.Lock()
					switch {
					case err == nil && id(string(out)) != "":
						ids = append(ids, id(string(out)))
					case cmd.ProcessState != nil && cmd.ProcessState.ExitCode() == 75:
						refused++
					default:
						b.Errorf("%s: %v, printed %q", name, err, out)
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return time.Since(t0), ids, refused
	}
	parked := func() map[string]bool {
		out, err := c.Command("squeue", "-h", "-p", "parked", "-o", "%i").Output()
		if err != nil {
			b.Fatal(err)
		}
		have := map[string]bool{}
		for _, f := range strings.Fields(string(out)) {
			have[f] = true
		}
		return have
	}
	tsTook, tsIDs, tsRefused := burst("task-submit", func() *exec.Cmd {
		return login(bin.TaskSubmit, "-p", "parked", "--", "true")
	}, func(out string) string {
		if m := idRE.FindStringSubmatch(out); m != nil {
			return m[1]
		}
		return ""
	})
	have := parked()
	lost := 0
	for _, id := range tsIDs {
		if !have[id] {
			lost++
		}
	}
	if lost > 0 || len(have) != len(tsIDs) {
		b.Errorf("task-submit: %d ids printed, %d of them not jobs of slurmctld's, %d jobs in all", len(tsIDs), lost, len(have))
	}
	c.Command("scancel", "-p", "parked").Run()
	sbTook, sbIDs, sbRefused := burst("sbatch", func() *exec.Cmd {
		cmd := c.Command("sbatch", "--parsable", "-p", "parked", "--gres=gpu:1", "--wrap=true")
		cmd.Dir = c.Work
		return cmd
	}, func(out string) string { return strings.TrimSpace(out) })
	c.Command("scancel", "-p", "parked").Run()
	tsRate := float64(len(tsIDs)) / tsTook.Seconds()
	sbRate := float64(len(sbIDs)) / sbTook.Seconds()

	b.ReportMetric(float64(npurun.p50())/float64(srun.p50()), "ratio-npurun-srun")
	b.ReportMetric(float64(ts.p50())/float64(sb.p50()), "ratio-start-sbatch")
	b.ReportMetric(tsRate/sbRate, "ratio-throughput")
	benchSummary(b, fmt.Sprintf("login node, 2 nodes, %d runs each, interleaved; %d submissions each from %d clients", benchClusterSamples, benchClusterSubmits, benchClusterClients), [][]string{
		{"", "p10 ms", "p50 ms", "p90 ms"},
		npurun.row(), srun.row(), {"npurun / srun, p50 (target ≤ 1.05×)", ratio(npurun, srun)},
		ts.row(), sb.row(), {"task-submit / sbatch, p50 (target ≤ 1.05×)", ratio(ts, sb)},
		{fmt.Sprintf("task-submit: %d accepted, %d refused (75), %d lost, %.1f/s", len(tsIDs), tsRefused, lost, tsRate)},
		{fmt.Sprintf("sbatch: %d accepted, %d refused, %.1f/s; task-submit / sbatch %.2f× (target ≥ 0.9×)", len(sbIDs), sbRefused, sbRate, tsRate/sbRate)},
	})
}
