package lease

// BenchmarkBackfill replays generated traces through Plan in simulated
// time, with backfill and without, beside a reference EASY backfill
// written here from the published algorithm (Lifka 1995, "The ANL/IBM SP
// scheduling system"; Mu'alem and Feitelson 2001, "Utilization,
// predictability, workloads, and user runtime estimates in scheduling the
// IBM SP2 with backfilling"): the first job in line that does not fit gets
// a reservation at the shadow time (when enough devices come free by the
// running jobs' estimates), and a later job starts now if it fits the free
// devices and either ends, by its estimate, before the shadow time or
// takes only devices the first will not need then. Each job's run time is
// known to the simulation only; the schedulers see its estimate (its time
// limit: run time × a factor from 1 to 3, as users over-estimate).

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

const (
	bfDevices = 8
	bfJobs    = 500
	bfTau     = 10.0 // seconds: bounded slowdown's threshold
)

type bfJob struct {
	id       int
	arrive   float64 // seconds
	n        int
	run, est float64 // seconds: its run time, its limit
	mem      int64   // a share's declaration, MiB (the shares mix); 0: whole devices

	start    float64
	promised float64 // the earliest start promised to it when a backfill went ahead of it; +Inf: none
	w        *Waiter
}

// bfTrace generates a trace of bfJobs jobs: 1 to 4 devices, run times
// uniform (1 min to 1 h) or log-uniform (30 s to 4 h), estimates run ×
// 1..3; arrivals Poisson at the given offered load, or all at 0 (load 0).
func bfTrace(seed uint64, logUniform bool, load float64) []*bfJob {
	r := rand.New(rand.NewPCG(seed, 31))
	jobs := make([]*bfJob, bfJobs)
	work := 0.0
	for i := range jobs {
		run := 60 + r.Float64()*3540
		if logUniform {
			run = 30 * math.Pow(480, r.Float64())
		}
		run = math.Round(run)
		j := &bfJob{id: i, n: 1 + r.IntN(4), run: run, est: math.Ceil(run * (1 + 2*r.Float64()))}
		work += float64(j.n) * j.run
		jobs[i] = j
	}
	if load > 0 {
		gap := work / float64(bfJobs) / (bfDevices * load) // mean time between arrivals
		t := 0.0
		for _, j := range jobs {
			j.arrive = math.Round(t)
			t += r.ExpFloat64() * gap
		}
	}
	return jobs
}

// bfShares is issue 19's shares mix (simWorkload: 40 shares of 2 to 60
// GiB on 4 devices of 64 GiB, all waiting from 0), each with a --time
// hint of its run time × 1..3.
func bfShares(logUniform bool) []*bfJob {
	r := rand.New(rand.NewPCG(31, 19))
	var jobs []*bfJob
	for i, s := range simWorkload(logUniform) {
		jobs = append(jobs, &bfJob{id: i, n: 1, mem: s.mem, run: s.hold, est: s.hold * (1 + 2*r.Float64())})
	}
	return jobs
}

// bfStart is a job a scheduler starts now, on devs; before is the job it
// was backfilled ahead of, with the start promised to it (else nil).
type bfStart struct {
	j        *bfJob
	devs     []int
	before   *bfJob
	beforeAt float64
}

// bfState is what a scheduler sees: the line in order, and per device
// whether it is free (no lease, no share), its estimated free time (the
// latest estimated end of what runs there), and its room for shares.
type bfState struct {
	now     float64
	line    []*bfJob
	free    []bool
	freeAt  []float64
	room    []int64 // nil: not shared
	running int
}

type bfSched func(s *bfState) []bfStart

type bfResult struct {
	makespan, wait, slowdown, idle float64
	late, backfills                int
}

// bfSimulate runs jobs through sched on devs devices (shared, of simCap
// each, where shared), as the broker serves its line: at each arrival
// and each end.
func bfSimulate(jobs []*bfJob, devs int, shared bool, sched bfSched) bfResult {
	type run struct {
		j    *bfJob
		end  float64
		devs []int
	}
	for _, j := range jobs {
		j.start, j.promised, j.w = -1, math.Inf(1), nil
	}
	pending := slices.Clone(jobs)
	slices.SortStableFunc(pending, func(a, b *bfJob) int { return int(a.arrive - b.arrive) })
	var line []*bfJob
	var runs []run
	ends := make([][]float64, devs) // per device, the estimated ends of what runs there
	declared := make([]int64, devs)
	var res bfResult
	now, last := 0.0, 0.0
	for len(pending) > 0 || len(line) > 0 || len(runs) > 0 {
		// Device idle while a request waits, since the last event.
		if len(line) > 0 {
			idle := 0
			for id := range devs {
				if len(ends[id]) == 0 {
					idle++
				}
			}
			res.idle += float64(idle) * (now - last)
		}
		last = now
		for len(pending) > 0 && pending[0].arrive <= now {
			line = append(line, pending[0])
			pending = pending[1:]
		}
		st := &bfState{now: now, line: line, free: make([]bool, devs), freeAt: make([]float64, devs), running: len(runs)}
		if shared {
			st.room = make([]int64, devs)
		}
		for id := range devs {
			st.free[id] = len(ends[id]) == 0
			st.freeAt[id] = now
			for _, e := range ends[id] {
				st.freeAt[id] = max(st.freeAt[id], e)
			}
			if shared {
				st.room[id] = simCap - declared[id]
			}
		}
		for _, s := range sched(st) {
			s.j.start = now
			for _, id := range s.devs {
				ends[id] = append(ends[id], now+s.j.est)
				declared[id] += s.j.mem
			}
			runs = append(runs, run{s.j, now + s.j.run, s.devs})
			line = slices.DeleteFunc(line, func(o *bfJob) bool { return o == s.j })
			if s.before != nil {
				res.backfills++
				s.before.promised = min(s.before.promised, s.beforeAt)
			}
		}
		next := math.Inf(1)
		if len(pending) > 0 {
			next = pending[0].arrive
		}
		for _, r := range runs {
			next = min(next, r.end)
		}
		if math.IsInf(next, 1) {
			if len(line) > 0 {
				panic(fmt.Sprintf("bfSimulate: %d jobs wait and nothing runs", len(line)))
			}
			break
		}
		now = next
		runs = slices.DeleteFunc(runs, func(r run) bool {
			if r.end > now {
				return false
			}
			for _, id := range r.devs {
				i := slices.Index(ends[id], r.j.start+r.j.est)
				ends[id] = slices.Delete(ends[id], i, i+1)
				declared[id] -= r.j.mem
			}
			return true
		})
	}
	for _, j := range jobs {
		res.makespan = max(res.makespan, j.start+j.run)
		w := j.start - j.arrive
		res.wait += w
		res.slowdown += max(1, (w+j.run)/max(j.run, bfTau))
		if j.start > j.promised+1e-6 {
			res.late++
		}
	}
	res.wait /= float64(len(jobs))
	res.slowdown /= float64(len(jobs))
	return res
}

const bfNS = 1e9 // a simulated second in Plan's nanoseconds

// bfPlan is Plan as Table.Schedule calls it: the line, the free devices,
// each device's estimated free time, and the room for shares.
func bfPlan(backfill bool) bfSched {
	return func(s *bfState) []bfStart {
		order := make([]*Waiter, len(s.line))
		all := make([]int, len(s.free))
		for i := range all {
			all[i] = i
		}
		for i, j := range s.line {
			if j.w == nil {
				j.w = &Waiter{Holder: Holder{Limit: time.Duration(j.est * bfNS)}, N: j.n, Mem: j.mem, Cand: all, Ref: j}
			}
			order[i] = j.w
		}
		room := Room{Backfill: backfill, Now: int64(s.now * bfNS), FreeAt: make([]int64, len(s.free)), Share: s.room}
		for id, at := range s.freeAt {
			room.FreeAt[id] = int64(at * bfNS)
			if s.room != nil && !s.free[id] {
				room.FreeAt[id] = never // as freeTimesLocked: a device holding shares
			}
		}
		gs := Plan(order, s.free, room)
		if s.room != nil {
			countPassed(order, gs)
		}
		out := make([]bfStart, len(gs))
		for i, g := range gs {
			out[i] = bfStart{j: g.W.Ref.(*bfJob), devs: g.Devices}
			if g.Before != nil {
				out[i].before, out[i].beforeAt = g.Before.Ref.(*bfJob), float64(g.BeforeAt)/bfNS
			}
		}
		return out
	}
}

// bfEASY is the reference EASY backfill, on whole devices.
func bfEASY(s *bfState) []bfStart {
	var free []int
	for id, f := range s.free {
		if f {
			free = append(free, id)
		}
	}
	var out []bfStart
	freeAt := slices.Clone(s.freeAt)
	busy := slices.Clone(s.free)
	for id := range busy {
		busy[id] = !busy[id]
	}
	take := func(j *bfJob) []int {
		got := slices.Clone(free[:j.n])
		free = free[j.n:]
		for _, id := range got {
			busy[id], freeAt[id] = true, s.now+j.est
		}
		return got
	}
	line := s.line
	for len(line) > 0 && line[0].n <= len(free) {
		out = append(out, bfStart{j: line[0], devs: take(line[0])})
		line = line[1:]
	}
	if len(line) == 0 {
		return out
	}
	head := line[0]
	// The shadow time: when, by the estimates of what runs, enough
	// devices are free for the head; extra: those it will not need then.
	var at []float64
	for id, b := range busy {
		if b {
			at = append(at, freeAt[id])
		}
	}
	slices.Sort(at)
	need := head.n - len(free)
	shadow := at[need-1]
	extra := len(free) + need - head.n
	for _, a := range at[need:] {
		if a <= shadow {
			extra++
		}
	}
	for _, j := range line[1:] {
		if j.n > len(free) {
			continue
		}
		switch {
		case s.now+j.est <= shadow:
			out = append(out, bfStart{j: j, devs: take(j), before: head, beforeAt: shadow})
		case j.n <= extra:
			extra -= j.n
			out = append(out, bfStart{j: j, devs: take(j), before: head, beforeAt: shadow})
		}
	}
	return out
}

func BenchmarkBackfill(b *testing.B) {
	var rows strings.Builder
	fmt.Fprintf(&rows, "%-26s %-10s %9s %9s %9s %10s %5s %6s\n", "trace (500 jobs, 8 devices)", "scheduler", "makespan", "mean wait", "slowdown", "idle dev·h", "late", "bf")
	for _, tr := range []struct {
		name       string
		logUniform bool
		load       float64
	}{
		{"uniform, load 0.95", false, 0.95},
		{"log-uniform, load 0.95", true, 0.95},
		{"log-uniform, all at 0", true, 0},
	} {
		jobs := bfTrace(7, tr.logUniform, tr.load)
		res := map[string]bfResult{}
		for _, sc := range []struct {
			name  string
			sched bfSched
		}{{"Plan+bf", bfPlan(true)}, {"EASY", bfEASY}, {"Plan", bfPlan(false)}} {
			r := bfSimulate(jobs, bfDevices, false, sc.sched)
			res[sc.name] = r
			fmt.Fprintf(&rows, "%-26s %-10s %8.2fh %8.1fm %9.2f %10.1f %5d %6d\n", tr.name, sc.name, r.makespan/3600, r.wait/60, r.slowdown, r.idle/3600, r.late, r.backfills)
		}
		p, e, n := res["Plan+bf"], res["EASY"], res["Plan"]
		fmt.Fprintf(&rows, "%-26s Plan+bf/EASY: makespan %.3f×, wait %.3f×, slowdown %.3f×; idle %.2f× Plan's\n", "", p.makespan/e.makespan, p.wait/e.wait, p.slowdown/e.slowdown, p.idle/n.idle)
		key := strings.Fields(tr.name)[0] + map[bool]string{true: "-burst", false: ""}[tr.load == 0]
		b.ReportMetric(p.makespan/e.makespan, key+"-makespan/EASY")
		b.ReportMetric(p.wait/e.wait, key+"-wait/EASY")
		b.ReportMetric(p.slowdown/e.slowdown, key+"-slowdown/EASY")
		b.ReportMetric(p.idle/n.idle, key+"-idle/nobf")
		b.ReportMetric(float64(p.late), key+"-late")
	}
	fmt.Fprintf(&rows, "%-26s %-10s %9s %9s %9s\n", "shares mix (issue 19)", "scheduler", "makespan", "bound", "×bound")
	for _, mix := range []struct {
		name       string
		logUniform bool
	}{{"uniform", false}, {"log-uniform", true}} {
		jobs := bfShares(mix.logUniform)
		var sim []simJob
		for _, j := range jobs {
			sim = append(sim, simJob{mem: j.mem, hold: j.run})
		}
		bound := simBound(sim)
		for _, sc := range []struct {
			name string
			on   bool
		}{{"Plan+bf", true}, {"Plan", false}} {
			r := bfSimulate(jobs, simDevices, true, bfPlan(sc.on))
			fmt.Fprintf(&rows, "%-26s %-10s %8.2fs %8.2fs %8.2f×  late %d, backfills %d\n", mix.name, sc.name, r.makespan, bound, r.makespan/bound, r.late, r.backfills)
			if sc.on {
				b.ReportMetric(r.makespan/bound, "shares-"+mix.name+"/bound")
			}
		}
		// References: every share that fits, in arrival order, no
		// reservation at all (a share may wait for ever behind smaller
		// ones); and the best order this search finds, run times known
		// (BenchmarkPlanMakespan's).
		arrival := make([]int, len(sim))
		for i := range arrival {
			arrival[i] = i
		}
		greedy := simulate(sim, arrival, anyFit)
		fmt.Fprintf(&rows, "%-26s %-10s %8.2fs %8.2fs %8.2f×  (no reservation: starvation possible)\n", mix.name, "any fit", greedy, bound, greedy/bound)
		known := bestKnown(sim, 2, 2000)
		fmt.Fprintf(&rows, "%-26s %-10s %8.2fs %8.2fs %8.2f×  (the best order found knowing run times: offline)\n", mix.name, "best order", known, bound, known/bound)
	}
	b.Logf("== backfill in simulated time: Plan with backfill, the reference EASY, Plan without ==\n%s", rows.String())
}
