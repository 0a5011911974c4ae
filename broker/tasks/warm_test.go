package tasks

import (
	"fmt"
	"os"
	"os/exec"
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
func warmLine(tb testing.TB, n int) (*Room, []*Task) {
	tb.Helper()
	table, err := lease.Open(lease.Config{Dir: tb.TempDir()})
	if err != nil {
		tb.Fatal(err)
	}
	s := testRoom(tb, &policy.Config{}, table, nil)
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
	return s, inLine
}

// BenchmarkWarmLine is one scheduling pass's warmLocked over a line of
// 10,000 waiters whose first tasks have their supervisors already: there
// is nothing to do.
func BenchmarkWarmLine(b *testing.B) {
	s, all := warmLine(b, 10000)
	s.mu.Lock()
	defer s.mu.Unlock()
	// Each pool's first task is warm already.
	l := s.run.(*local)
	seen := map[string]bool{}
	for _, t := range all {
		if !seen[t.w.Pool] {
			seen[t.w.Pool] = true
			l.warm[t] = &supervisor{ready: make(chan struct{})}
		}
	}
	for b.Loop() {
		s.warmLocked()
	}
}

// TestWarmFirstTaskOfEachPool: warmLocked starts a real supervisor for the
// first unheld task of each pool, in both queues, and for no other; a
// second pass starts nothing more.
func TestWarmFirstTaskOfEachPool(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, wire.SupervisorName)
	build := exec.Command("go", "build", "-o", bin, "../../cmd/npurun-supervise")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the supervisor: %v\n%s", err, out)
	}
	sb, err := findSupervisor(filepath.Join(dir, "npubroker"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.f.Close() })
	s, _ := warmLine(t, 0)
	l := s.run.(*local)
	l.supBin, l.unpriv = sb, true

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
	warm := len(l.warm)
	sups := map[*Task]*supervisor{}
	for tk, sup := range l.warm {
		sups[tk] = sup
	}
	s.mu.Unlock()

	want := []string{"firstC", "firstI", "firstQ"}
	var got []string
	for name, tk := range tasks {
		sup := sups[tk]
		if sup == nil {
			continue
		}
		got = append(got, name)
		<-sup.ready
		if sup.err != nil || sup.pid <= 0 {
			t.Errorf("%s: supervisor pid %d: %v", name, sup.pid, sup.err)
		}
		if sup.sock != nil {
			sup.sock.Close() // it exits having run nothing
		}
		<-sup.exited
	}
	slices.Sort(got)
	if !slices.Equal(got, want) || warm != len(want) {
		t.Errorf("warmed %v (count %d), want %v", got, warm, want)
	}
}
