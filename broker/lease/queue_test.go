package lease

import (
	"fmt"
	"slices"
	"testing"

	"github.com/npurun/npurun/policy"
)

// ids is 0..n-1.
func ids(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// freeSet is a free-device vector of size n with the given ids free.
func freeSet(n int, free ...int) []bool {
	f := make([]bool, n)
	for _, id := range free {
		f[id] = true
	}
	return f
}

// name tags a waiter for messages; Pool is unused by the scheduler.
func waiter(name string, uid uint32, n int, cand ...int) *Waiter {
	return &Waiter{Pool: name, Holder: Holder{Kind: Inline, UID: uid}, N: n, Cand: cand}
}

func exact(name string, uid uint32, cand ...int) *Waiter {
	return &Waiter{Pool: name, Holder: Holder{Kind: Inline, UID: uid}, N: len(cand), Cand: cand, Exact: true}
}

// taskWaiter is a task's waiter: it counts against its user's running
// tasks.
func taskWaiter(name string, uid uint32, n int, cand ...int) *Waiter {
	return &Waiter{Pool: name, Holder: Holder{Kind: Task, UID: uid}, N: n, Cand: cand}
}

// serveOneAtATime drains q on a single device: each step plans with the
// device free and serves the one grant. It returns the service order.
func serveOneAtATime(t *testing.T, q *Queue) []string {
	t.Helper()
	var order []string
	for q.Len() > 0 {
		g := Plan(q.Waiters(), []bool{true}, Room{})
		if len(g) != 1 {
			t.Fatalf("one free device and %d waiters: %d grants", q.Len(), len(g))
		}
		if !q.Remove(g[0].W, true) {
			t.Fatalf("granted waiter %s not in the queue", g[0].W.Pool)
		}
		order = append(order, g[0].W.Pool)
	}
	return order
}

func names(ws []*Waiter) []string {
	var out []string
	for _, w := range ws {
		out = append(out, w.Pool)
	}
	return out
}

func TestQueueFIFO(t *testing.T) {
	q := NewQueue()
	var want []string
	for i := range 5 {
		name := fmt.Sprintf("w%d", i)
		want = append(want, name)
		q.Add(waiter(name, 1000, 1, 0))
	}
	if got := serveOneAtATime(t, q); !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestQueueInterleavesUsers(t *testing.T) {
	t.Run("newcomer within one turn", func(t *testing.T) {
		q := NewQueue()
		for i := range 100 {
			q.Add(waiter(fmt.Sprintf("a%d", i), 1, 1, 0))
		}
		q.Add(waiter("b0", 2, 1, 0))
		got := serveOneAtATime(t, q)
		if i := slices.Index(got, "b0"); i < 0 || i > 1 {
			t.Fatalf("b0 served at %d (0-based) behind a's 100 waiters, want within one turn: %v", i, got[:5])
		}
	})
	t.Run("newcomer after a has been served a while", func(t *testing.T) {
		q := NewQueue()
		for i := range 100 {
			q.Add(waiter(fmt.Sprintf("a%d", i), 1, 1, 0))
		}
		for range 10 {
			g := Plan(q.Waiters(), []bool{true}, Room{})
			q.Remove(g[0].W, true)
		}
		q.Add(waiter("b0", 2, 1, 0))
		if got := names(q.Waiters()); slices.Index(got, "b0") > 1 {
			t.Fatalf("b0 at %d in %v, want within one turn", slices.Index(got, "b0"), got[:5])
		}
	})
	t.Run("round robin of three users", func(t *testing.T) {
		q := NewQueue()
		for _, u := range []struct {
			name string
			uid  uint32
		}{{"a", 1}, {"b", 2}, {"c", 3}} {
			for i := range 3 {
				q.Add(waiter(fmt.Sprintf("%s%d", u.name, i), u.uid, 1, 0))
			}
		}
		want := []string{"a0", "b0", "c0", "a1", "b1", "c1", "a2", "b2", "c2"}
		if got := serveOneAtATime(t, q); !slices.Equal(got, want) {
			t.Fatalf("order %v, want %v", got, want)
		}
	})
	t.Run("a user's own requests stay in order", func(t *testing.T) {
		q := NewQueue()
		q.Add(waiter("a0", 1, 1, 0))
		q.Add(waiter("a1", 1, 1, 0))
		q.Add(waiter("b0", 2, 1, 0))
		q.Add(waiter("a2", 1, 1, 0))
		q.Add(waiter("b1", 2, 1, 0))
		want := []string{"a0", "b0", "a1", "b1", "a2"}
		if got := serveOneAtATime(t, q); !slices.Equal(got, want) {
			t.Fatalf("order %v, want %v", got, want)
		}
	})
}

func TestPlan(t *testing.T) {
	type grant struct {
		name    string
		devices []int
	}
	for _, tc := range []struct {
		name  string
		order []*Waiter
		free  []bool
		room  Room
		want  []grant
	}{
		{
			name:  "nothing free",
			order: []*Waiter{waiter("a", 1, 1, ids(4)...)},
			free:  freeSet(4),
		},
		{
			name:  "lowest free devices first",
			order: []*Waiter{waiter("a", 1, 2, ids(4)...)},
			free:  freeSet(4, 1, 2, 3),
			want:  []grant{{"a", []int{1, 2}}},
		},
		{
			name:  "several served at once in order",
			order: []*Waiter{waiter("a", 1, 1, ids(4)...), waiter("b", 2, 2, ids(4)...), waiter("c", 3, 2, ids(4)...)},
			free:  freeSet(4, 0, 1, 2, 3),
			want:  []grant{{"a", []int{0}}, {"b", []int{1, 2}}},
		},
		{
			name:  "multi-device head reserves every free device it can use",
			order: []*Waiter{waiter("big", 1, 4, ids(4)...), waiter("small", 2, 1, ids(4)...)},
			free:  freeSet(4, 1, 2, 3),
		},
		{
			name:  "backfill only onto devices the head cannot use",
			order: []*Waiter{exact("head", 1, 0, 1), waiter("small", 2, 1, ids(4)...)},
			free:  freeSet(4, 0, 2, 3),
			want:  []grant{{"small", []int{2}}},
		},
		{
			name:  "backfill into another pool",
			order: []*Waiter{waiter("head", 1, 2, 0, 1), waiter("small", 2, 1, 2, 3)},
			free:  freeSet(4, 0, 3),
			want:  []grant{{"small", []int{3}}},
		},
		{
			name:  "head reserves only what it wants",
			order: []*Waiter{waiter("head", 1, 2, ids(4)...), waiter("small", 2, 1, ids(4)...)},
			free:  freeSet(4, 0),
		},
		{
			name:  "a head wanting 2 of 3 free takes 2, the rest backfills",
			order: []*Waiter{waiter("head", 1, 2, ids(4)...), waiter("small", 2, 1, ids(4)...)},
			free:  freeSet(4, 0, 1, 3),
			want:  []grant{{"head", []int{0, 1}}, {"small", []int{3}}},
		},
		{
			name:  "exact device waits although others are free",
			order: []*Waiter{exact("d2", 1, 2)},
			free:  freeSet(4, 0, 1, 3),
		},
		{
			name:  "exact devices granted together",
			order: []*Waiter{exact("d13", 1, 1, 3)},
			free:  freeSet(4, 0, 1, 2, 3),
			want:  []grant{{"d13", []int{1, 3}}},
		},
		{
			name:  "exact head reserves its free device from later requests",
			order: []*Waiter{exact("d12", 1, 1, 2), waiter("small", 2, 1, 1, 2)},
			free:  freeSet(4, 1),
		},
		{
			name:  "candidate beyond the device table is never granted",
			order: []*Waiter{exact("d9", 1, 9)},
			free:  freeSet(4, 0, 1, 2, 3),
		},
		{
			name:  "a user without room waits and reserves nothing",
			order: []*Waiter{waiter("a", 1, 1, ids(2)...), waiter("b", 2, 1, ids(2)...)},
			free:  freeSet(2, 0),
			room:  Room{Devices: map[uint32]int{1: 0}},
			want:  []grant{{"b", []int{0}}},
		},
		{
			name:  "room counts grants made in the same plan",
			order: []*Waiter{waiter("a0", 1, 1, ids(4)...), waiter("a1", 1, 1, ids(4)...), waiter("b", 2, 1, ids(4)...)},
			free:  freeSet(4, 0, 1, 2, 3),
			room:  Room{Devices: map[uint32]int{1: 1}},
			want:  []grant{{"a0", []int{0}}, {"b", []int{1}}},
		},
		{
			name:  "request larger than the room waits",
			order: []*Waiter{waiter("a", 1, 2, ids(4)...)},
			free:  freeSet(4, 0, 1, 2, 3),
			room:  Room{Devices: map[uint32]int{1: 1}},
		},
		{
			name: "task room counts only tasks",
			order: []*Waiter{
				taskWaiter("t0", 1, 1, ids(4)...),
				taskWaiter("t1", 1, 1, ids(4)...),
				waiter("inline", 1, 1, ids(4)...),
			},
			free: freeSet(4, 0, 1, 2, 3),
			room: Room{Tasks: map[uint32]int{1: 1}},
			want: []grant{{"t0", []int{0}}, {"inline", []int{1}}},
		},
		{
			name:  "a task without room reserves nothing",
			order: []*Waiter{taskWaiter("t0", 1, 1, ids(1)...), waiter("b", 2, 1, ids(1)...)},
			free:  freeSet(1, 0),
			room:  Room{Tasks: map[uint32]int{1: 0}},
			want:  []grant{{"b", []int{0}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			free := slices.Clone(tc.free)
			order := slices.Clone(tc.order)
			got := Plan(tc.order, tc.free, tc.room)
			if !slices.Equal(free, tc.free) || !slices.Equal(order, tc.order) {
				t.Error("Plan modified its inputs")
			}
			if len(got) != len(tc.want) {
				t.Fatalf("%d grants %v, want %v", len(got), got, tc.want)
			}
			for i, g := range got {
				if g.W.Pool != tc.want[i].name || !slices.Equal(g.Devices, tc.want[i].devices) {
					t.Errorf("grant %d: %s %v, want %s %v", i, g.W.Pool, g.Devices, tc.want[i].name, tc.want[i].devices)
				}
			}
		})
	}
}

func TestQueueRemove(t *testing.T) {
	q := NewQueue()
	a0, a1, a2 := waiter("a0", 1, 1, 0), waiter("a1", 1, 1, 0), waiter("a2", 1, 1, 0)
	b0 := waiter("b0", 2, 1, 0)
	for _, w := range []*Waiter{a0, a1, a2, b0} {
		q.Add(w)
	}
	if !q.Remove(a1, false) {
		t.Fatal("Remove of a queued waiter reported false")
	}
	if q.Remove(a1, false) {
		t.Fatal("second Remove of the same waiter reported true")
	}
	if q.Remove(waiter("x", 1, 1, 0), false) {
		t.Fatal("Remove of a waiter never added reported true")
	}
	if got, want := names(q.Waiters()), []string{"a0", "b0", "a2"}; !slices.Equal(got, want) {
		t.Fatalf("queue %v, want %v", got, want)
	}
	if n := q.UserCount(1); n != 2 {
		t.Errorf("UserCount(1) = %d, want 2", n)
	}
	// A cancelled waiter reserves nothing.
	if g := Plan(q.Waiters(), []bool{true}, Room{}); len(g) != 1 || g[0].W != a0 {
		t.Fatalf("plan after removal: %v, want a0", g)
	}
	for _, w := range []*Waiter{a0, b0, a2} {
		q.Remove(w, false)
	}
	if q.Len() != 0 || q.UserCount(1) != 0 || q.UserCount(2) != 0 {
		t.Fatalf("queue not empty: len %d, counts %d %d", q.Len(), q.UserCount(1), q.UserCount(2))
	}
	// Cancelling does not advance the round: a user who comes back after
	// cancelling everything is first come, first served again.
	q.Add(waiter("c0", 3, 1, 0))
	q.Add(waiter("a3", 1, 1, 0))
	if got, want := names(q.Waiters()), []string{"c0", "a3"}; !slices.Equal(got, want) {
		t.Fatalf("queue %v, want %v", got, want)
	}
}

// TestQueueTaskPools: the count of pools with a task waiting follows Add,
// Remove and Readd, and leaves out waiters that are not tasks.
func TestQueueTaskPools(t *testing.T) {
	q := NewQueue()
	task := func(pool string, uid uint32) *Waiter {
		return taskWaiter(pool, uid, 1, 0)
	}
	t1, t2, t3 := task("a", 1), task("a", 2), task("b", 1)
	lease := waiter("c", 3, 1, 0)
	check := func(step string, want int) {
		t.Helper()
		if got := q.TaskPools(); got != want {
			t.Errorf("%s: TaskPools() = %d, want %d", step, got, want)
		}
	}
	check("empty", 0)
	q.Add(lease)
	check("a lease", 0)
	q.Add(t1)
	q.Add(t2)
	check("two tasks in a", 1)
	q.Add(t3)
	check("and one in b", 2)
	q.Remove(t1, true)
	check("one of a's served", 2)
	q.Remove(t3, true)
	check("b's served", 1)
	q.Readd(t3)
	check("b's put back", 2)
	q.Remove(t3, false)
	q.Remove(t3, false) // not there: counts nothing
	q.Remove(t2, false)
	check("only the lease", 0)
}

// limits is what q.Limits reports, by uid.
func limits(q *Queue) map[uint32]policy.Limit {
	out := map[uint32]policy.Limit{}
	q.Limits(func(uid uint32, lim policy.Limit) { out[uid] = lim })
	return out
}

// TestQueueReadd: a waiter taken out for its grant and put back (a task
// whose start could not be made) is where it was, and its user's count
// and limit are as Add left them: the limit still applies to the user.
func TestQueueReadd(t *testing.T) {
	one := policy.Limit{MaxDevices: 1, MaxRunning: 1, Source: "user a"}
	two := policy.Limit{MaxDevices: 2, MaxRunning: 2, Source: "user a, later"}
	for _, c := range []struct {
		name    string
		others  int // a's other waiters, added after a0
		wantLim policy.Limit
	}{
		{"its user's only waiter", 0, one},
		// The later request's limit is the user's newest: a0's older one
		// does not replace it.
		{"its user waits on with another", 1, two},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := NewQueue()
			a0 := waiter("a0", 1, 1, 0, 1)
			a0.Limit = one
			b0 := waiter("b0", 2, 1, 0, 1)
			q.Add(a0)
			q.Add(b0)
			for i := range c.others {
				w := waiter(fmt.Sprintf("a%d", i+1), 1, 1, 0, 1)
				w.Limit = two
				q.Add(w)
			}
			before := names(q.Waiters())
			if !q.Remove(a0, true) {
				t.Fatal("a0 not in the queue")
			}
			q.Readd(a0)
			if got := names(q.Waiters()); !slices.Equal(got, before) {
				t.Errorf("queue after readd %v, want %v", got, before)
			}
			if n := q.UserCount(1); n != 1+c.others {
				t.Errorf("UserCount(1) after readd = %d, want %d", n, 1+c.others)
			}
			lim, ok := limits(q)[1]
			if !ok || lim.Source != c.wantLim.Source || lim.MaxDevices != c.wantLim.MaxDevices {
				t.Errorf("user 1's limit after readd: %+v (reported %v), want %+v", lim, ok, c.wantLim)
			}
			// Leaving for good forgets the user as Add's bookkeeping does.
			for _, w := range slices.Clone(q.Waiters()) {
				q.Remove(w, false)
			}
			if got := limits(q); len(got) != 0 || q.UserCount(1) != 0 {
				t.Errorf("empty queue still reports limits %v, count %d", got, q.UserCount(1))
			}
		})
	}
}

// TestFirstTasksLongLine: on a long line, FirstTasks gives what a walk of
// the whole line finds: the first unheld task of each pool, in order.
func TestFirstTasksLongLine(t *testing.T) {
	q := NewQueue()
	for i := range 10000 {
		uid := uint32(1000 + i%50)
		var w *Waiter
		switch {
		case i%10 == 9:
			w = taskWaiter("cpu", uid, 1, 0)
		case i%3 == 0:
			w = taskWaiter("queue", uid, 1, 0)
		default:
			w = waiter("interactive", uid, 1, 0)
		}
		if w.isTask() && i%7 < 3 {
			w.Held = true
		}
		q.Add(w)
	}
	var want []*Waiter
	var seen []string
	for _, w := range q.Waiters() {
		if w.isTask() && !w.Held && !slices.Contains(seen, w.Pool) {
			seen = append(seen, w.Pool)
			want = append(want, w)
		}
	}
	got := q.FirstTasks(nil)
	if len(want) != 2 || !slices.Equal(got, want) {
		t.Errorf("FirstTasks gives %d tasks, want %d (of %d waiters)", len(got), len(want), q.Len())
	}
}
