package lease

// BenchmarkPlanMakespan replays BenchmarkShares's workloads (tests/
// tests/bench/bench_share_test.go: the same 40 jobs, the same seed) through Plan in
// simulated time: no processes, no broker, each job's run time known to
// the simulation only. It shows what the line's rules themselves give, and
// what a schedule that knew every run time in advance could give, so that
// BenchmarkShares's figures can be read against both: the lower bound
// (memory-seconds over capacity, or the longest job) is not reached by any
// order of these jobs that this search finds.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

const (
	simJobs    = 40
	simDevices = 4
	simCap     = 64 * 1024 // MiB a device
)

type simJob struct {
	mem  int64   // MiB
	hold float64 // seconds
}

// simWorkload is BenchmarkShares's benchShareWorkload.
func simWorkload(logUniform bool) []simJob {
	r := rand.New(rand.NewPCG(19, 2026))
	jobs := make([]simJob, simJobs)
	for i := range jobs {
		mem := 2 + r.IntN(59)
		if logUniform {
			mem = int(math.Round(2 * math.Pow(30, r.Float64())))
		}
		jobs[i] = simJob{mem: int64(mem) * 1024, hold: 0.2 + float64(r.IntN(1801))/1000}
	}
	return jobs
}

// simBound is the lower bound BenchmarkShares states: memory-seconds over
// capacity, or the longest job.
func simBound(jobs []simJob) float64 {
	var memSec, longest float64
	for _, j := range jobs {
		memSec += float64(j.mem) * j.hold
		longest = max(longest, j.hold)
	}
	return max(memSec/(simDevices*simCap), longest)
}

// simulate runs jobs, all waiting from time 0 in order, through plan on
// simDevices devices of simCap shared, as Table.Schedule does at each
// end (countPassed too), and returns the makespan.
func simulate(jobs []simJob, order []int, plan func([]*Waiter, []bool, Room) []Grant) float64 {
	type running struct {
		end float64
		dev int
		mem int64
	}
	line := make([]*Waiter, len(order))
	for i, j := range order {
		line[i] = &Waiter{N: 1, Mem: jobs[j].mem, Cand: []int{0, 1, 2, 3}, Ref: j}
	}
	declared := make([]int64, simDevices)
	shares := make([]int, simDevices)
	var runs []running
	now := 0.0
	for len(line) > 0 || len(runs) > 0 {
		free := make([]bool, simDevices)
		room := Room{Share: make([]int64, simDevices)}
		for id := range free {
			free[id] = shares[id] == 0
			room.Share[id] = simCap - declared[id]
		}
		gs := plan(line, free, room)
		countPassed(line, gs)
		for _, g := range gs {
			j, id := g.W.Ref.(int), g.Devices[0]
			declared[id] += jobs[j].mem
			shares[id]++
			runs = append(runs, running{now + jobs[j].hold, id, jobs[j].mem})
			line = slices.DeleteFunc(line, func(w *Waiter) bool { return w == g.W })
		}
		if len(runs) == 0 {
			panic("simulate: nothing runs and the line is stuck")
		}
		first := slices.IndexFunc(runs, func(r running) bool {
			return !slices.ContainsFunc(runs, func(o running) bool { return o.end < r.end })
		})
		r := runs[first]
		runs = slices.Delete(runs, first, first+1)
		now = r.end
		declared[r.dev] -= r.mem
		shares[r.dev]--
	}
	return now
}

// anyFit serves every waiter that fits now, best fit, in order: with run
// times known and the order chosen for them, no reservation is needed.
func anyFit(order []*Waiter, _ []bool, room Room) []Grant {
	left := slices.Clone(room.Share)
	var gs []Grant
	for _, w := range order {
		if got := placeShares(w, left); len(got) == w.N {
			left[got[0]] -= w.Mem
			gs = append(gs, Grant{W: w, Devices: got})
		}
	}
	return gs
}

// bestKnown searches for the order of jobs, served by anyFit, with the
// shortest makespan: hill climbing over swaps from random orders, the run
// times known. It is an offline reference, not an optimum.
func bestKnown(jobs []simJob, starts, swaps int) float64 {
	best := math.Inf(1)
	for seed := range starts {
		r := rand.New(rand.NewPCG(uint64(seed), 19))
		order := r.Perm(len(jobs))
		cur := simulate(jobs, order, anyFit)
		for range swaps {
			a, b := r.IntN(len(order)), r.IntN(len(order))
			order[a], order[b] = order[b], order[a]
			if m := simulate(jobs, order, anyFit); m <= cur {
				cur = m
			} else {
				order[a], order[b] = order[b], order[a]
			}
		}
		best = min(best, cur)
	}
	return best
}

func BenchmarkPlanMakespan(b *testing.B) {
	rows := "mix          bound    Plan (arrival order)   best order knowing run times"
	for _, mix := range []struct {
		name       string
		logUniform bool
	}{{"uniform", false}, {"log-uniform", true}} {
		jobs := simWorkload(mix.logUniform)
		arrival := make([]int, len(jobs))
		for i := range arrival {
			arrival[i] = i
		}
		bound := simBound(jobs)
		plan := simulate(jobs, arrival, Plan)
		known := bestKnown(jobs, 4, 5000)
		b.ReportMetric(plan/bound, mix.name+"-plan/bound")
		b.ReportMetric(known/bound, mix.name+"-known/bound")
		rows += fmt.Sprintf("\n%-12s %.2f s   %.2f s = %.2f× bound   %.2f s = %.2f× bound (Plan %.2f× it)",
			mix.name, bound, plan, plan/bound, known, known/bound, plan/known)
	}
	b.Logf("== BenchmarkShares's workloads through Plan in simulated time (4 hill climbs of 5,000 swaps for the order knowing run times) ==\n%s", rows)
}
