package tasks

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"testing"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/tasks/journal"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/wire"
)

// warmLine is a broker whose line holds n waiters in pools "interactive"
// and "queue" (leases and tasks of 50 users, interleaved) and cpu tasks in
// the CPU queue, with a table that has a task waiting, as warmLocked sees
// it on a scheduling pass. The tasks are in line order: the lease table's
// line's, then s.cpuq's.
func warmLine(tb testing.TB, n int) (*Room, *warmRunner, []*Task) {
	tb.Helper()
	table, err := lease.Open(lease.Config{Dir: tb.TempDir()})
	if err != nil {
		tb.Fatal(err)
	}
	run := &warmRunner{warm: map[*Task]bool{}}
	s := testRoomWith(tb, &policy.Config{}, table, nil, run)
	life := s.life
	s.mu.Lock()
	defer s.mu.Unlock()
	var tasks []*Task
	add := func(cpu bool, uid uint32, pool string, isTask bool) {
		w := &lease.Waiter{Holder: lease.Holder{Kind: lease.Inline, UID: uid}, N: 1, Cand: []int{0}, Pool: pool}
		if isTask {
			tk := &journal.Task{ID: life.NewID(), UID: uid, User: fmt.Sprint("u", uid), Slot: -1}
			if err := life.Submit(tk); err != nil {
				tb.Fatal(err)
			}
			t := &Task{Task: tk, w: w, inLine: true}
			w.Ref, w.Kind = t, lease.Task
			s.jobs[tk.ID] = t
			tasks = append(tasks, t)
		}
		if cpu {
			s.cpuq.Add(w)
		} else {
			s.table.Add(w)
		}
	}
	for i := range n {
		uid := uint32(1000 + i%50)
		switch {
		case i%10 == 9:
			add(true, uid, "cpu", true)
		case i%3 == 0:
			add(false, uid, "queue", true)
		default:
			add(false, uid, "interactive", false)
		}
	}
	// In line order: the table's line, then the CPU slots' queue.
	var inLine []*Task
	for _, p := range s.table.Line(nil) {
		if t := taskOf(p.W); t != nil {
			inLine = append(inLine, t)
		}
	}
	for _, w := range s.cpuq.Waiters() {
		inLine = append(inLine, taskOf(w))
	}
	if len(inLine) != len(tasks) {
		tb.Fatalf("%d tasks in line, %d made", len(inLine), len(tasks))
	}
	return s, run, inLine
}

// warmRunner is a runner that readies starts at once (Warm), as many as
// it is asked to (the local runner's limit is its own: package local),
// and records which tasks it readied.
type warmRunner struct {
	testRunner
	warm map[*Task]bool
}

func (r *warmRunner) Warm(t *Task, spec func() *wire.Spec) (func(), bool) {
	spec()
	r.warm[t] = true
	return func() {}, true
}

func (r *warmRunner) Warmed(t *Task) (bool, bool) { return r.warm[t], r.warm[t] }

func (r *warmRunner) Unwarm(t *Task) { delete(r.warm, t) }

// BenchmarkWarmLine is one scheduling pass's warmLocked over a line of
// 10,000 waiters whose first tasks have their supervisors already: there
// is nothing to do.
func BenchmarkWarmLine(b *testing.B) {
	s, run, all := warmLine(b, 10000)
	s.mu.Lock()
	defer s.mu.Unlock()
	// Each pool's first task is warm already.
	seen := map[string]bool{}
	for _, t := range all {
		if !seen[t.w.Pool] {
			seen[t.w.Pool] = true
			run.warm[t] = true
		}
	}
	for b.Loop() {
		s.warmLocked()
	}
}

// TestWarmFirstTaskOfEachPool: warmLocked has the runner ready the start
// of the first unheld task of each pool, in both queues, and of no other;
// a second pass readies nothing more. (That the local runner's Warm starts
// a real supervisor, ready and exiting having run nothing, is package
// local's TestWarmStartsASupervisor.)
func TestWarmFirstTaskOfEachPool(t *testing.T) {
	dir := t.TempDir()
	s, run, _ := warmLine(t, 0)

	s.mu.Lock()
	tasks := map[string]*Task{}
	add := func(name string, cpu bool, uid uint32, pool string, isTask, held bool) {
		w := &lease.Waiter{Holder: lease.Holder{Kind: lease.Inline, UID: uid}, N: 1, Cand: []int{0}, Pool: pool, Held: held}
		if isTask {
			tk := &journal.Task{ID: s.life.NewID(), UID: uid, User: name, Slot: -1,
				Argv: []string{"/bin/true"}, Log: filepath.Join(dir, name+".log"), Sub: wire.Submission{Cwd: "/"}}
			if err := s.life.Submit(tk); err != nil {
				t.Fatal(err)
			}
			tasks[name] = &Task{Task: tk, w: w, inLine: true}
			w.Ref, w.Kind = tasks[name], lease.Task
			s.jobs[tk.ID] = tasks[name]
		}
		// Each waiter a user of its own: line order is arrival order.
		if cpu {
			s.cpuq.Add(w)
		} else {
			s.table.Add(w)
		}
	}
	add("lease1", false, 1, "queue", false, false)
	add("heldQ", false, 2, "queue", true, true)
	add("lease2", false, 3, "interactive", false, false)
	add("firstQ", false, 4, "queue", true, false)
	add("firstI", false, 5, "interactive", true, false)
	add("secondQ", false, 6, "queue", true, false)
	add("secondI", false, 7, "interactive", true, false)
	add("lease3", false, 8, "other", false, false) // a pool of leases only
	add("firstC", true, 9, "cpu", true, false)
	add("secondC", true, 10, "cpu", true, false)
	s.warmLocked()
	s.warmLocked() // nothing more
	warm := len(run.warm)
	warmed := maps.Clone(run.warm)
	s.mu.Unlock()

	want := []string{"firstC", "firstI", "firstQ"}
	var got []string
	for name, tk := range tasks {
		if warmed[tk] {
			got = append(got, name)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) || warm != len(want) {
		t.Errorf("warmed %v (count %d), want %v", got, warm, want)
	}
}
