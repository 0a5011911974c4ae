package journal

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/npurun/npurun/wire"
)

// table is a Life for a test, with the lock held by the test as the
// broker holds it, and the tasks the Ended hook saw.
type table struct {
	*Life
	t     *testing.T
	dir   string
	mu    *sync.Mutex
	ended []uint64
	logs  *bytes.Buffer

	killed func() // closes the table without Stop, as a broker killed (openBoot)
}

func openTable(t *testing.T, dir string, keep, keepUser int) *table {
	t.Helper()
	tb := &table{t: t, dir: dir, mu: &sync.Mutex{}, logs: &bytes.Buffer{}}
	l, err := Open(dir, Options{Lock: tb.mu, Keep: keep, KeepPerUser: keepUser,
		Ended: func(x *Task) { tb.ended = append(tb.ended, x.ID) },
		Log:   log.New(io.MultiWriter(tb.logs, testWriter{t}), "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	tb.Life = l
	tb.mu.Lock()
	t.Cleanup(func() {
		tb.Close()
		tb.mu.Unlock()
	})
	return tb
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// submit records a new task of uid, with its --after list and an
// environment, and settles it.
func (tb *table) submit(uid uint32, after ...uint64) *Task {
	tb.t.Helper()
	t := &Task{UID: uid, User: fmt.Sprint("u", uid), Slot: -1, Submitted: time.Now().UnixMilli(),
		Sub: wire.Submission{Argv: []string{"true"}, Cwd: "/", Env: []string{"SECRET=s3cr3t"}, After: after}}
	t.ID = tb.NewID()
	if err := tb.Submit(t); err != nil {
		tb.t.Fatal(err)
	}
	tb.Settle(t)
	return t
}

// run takes a pending task through grant and start.
func (tb *table) run(t *Task) {
	tb.t.Helper()
	if err := tb.Grant(t, []int{0}, -1, time.Now()); err != nil {
		tb.t.Fatal(err)
	}
	if err := tb.Start(t, 4242, 99, "boot", 1000); err != nil {
		tb.t.Fatal(err)
	}
}

func (tb *table) end(t *Task, state string, exit int) {
	tb.t.Helper()
	if err := tb.End(t, state, &wire.Status{Exit: &exit}, ""); err != nil {
		tb.t.Fatal(err)
	}
}

// dump is the table as text: every task's journal form, the counts, the
// ended tasks in order, and the highest id.
func (tb *table) dump() string {
	var b strings.Builder
	data, err := encode(tb.snapshot()...)
	if err != nil {
		tb.t.Fatal(err)
	}
	b.Write(data)
	fmt.Fprintf(&b, "waiting %v running %v live %d ended %v next %d\n", tb.waiting, tb.running, tb.live, tb.endedBy, tb.nextID)
	return b.String()
}

// TestTransitions: from each state, each transition either moves the task
// where the table says or is refused and changes nothing.
func TestTransitions(t *testing.T) {
	to := func(states ...string) []string { return states }
	reach := map[string]func(tb *table) *Task{
		Pending: func(tb *table) *Task { return tb.submit(1) },
		Blocked: func(tb *table) *Task { dep := tb.submit(1); return tb.submit(1, dep.ID) },
		Starting: func(tb *table) *Task {
			x := tb.submit(1)
			tb.Grant(x, []int{0}, -1, time.Now())
			return x
		},
		Running: func(tb *table) *Task { x := tb.submit(1); tb.run(x); return x },
		Lost:    func(tb *table) *Task { x := tb.submit(1); tb.run(x); tb.EndNow(x, Lost, "gone"); return x },
		Done:    func(tb *table) *Task { x := tb.submit(1); tb.run(x); tb.end(x, Done, 0); return x },
	}
	ops := map[string]func(tb *table, x *Task) error{
		"grant":     func(tb *table, x *Task) error { return tb.Grant(x, []int{0}, -1, time.Now()) },
		"ungrant":   func(tb *table, x *Task) error { tb.Ungrant(x); return nil },
		"start":     func(tb *table, x *Task) error { return tb.Start(x, 1, 1, "b", 1) },
		"done":      func(tb *table, x *Task) error { return tb.End(x, Done, nil, "") },
		"failed":    func(tb *table, x *Task) error { return tb.End(x, Failed, nil, "") },
		"cancelled": func(tb *table, x *Task) error { return tb.End(x, Cancelled, nil, "") },
		"lose":      func(tb *table, x *Task) error { tb.EndNow(x, Lost, "gone"); return nil },
	}
	for _, c := range []struct {
		from string
		op   string
		want []string // the state after; one state: the op succeeds or is a no-op
		fail bool
	}{
		{Pending, "grant", to(Starting), false},
		{Pending, "ungrant", to(Pending), false},
		{Pending, "start", to(Pending), true},
		{Pending, "done", to(Pending), true},
		{Pending, "failed", to(Failed), false},
		{Pending, "cancelled", to(Cancelled), false},
		{Pending, "lose", to(Pending), false},
		{Blocked, "grant", to(Blocked), true},
		{Blocked, "cancelled", to(Cancelled), false},
		{Blocked, "done", to(Blocked), true},
		{Starting, "start", to(Running), false},
		{Starting, "ungrant", to(Pending), false},
		{Starting, "failed", to(Failed), false},
		{Starting, "cancelled", to(Starting), true},
		{Starting, "done", to(Starting), true},
		{Running, "grant", to(Running), true},
		{Running, "start", to(Running), true},
		{Running, "done", to(Done), false},
		{Running, "failed", to(Failed), false},
		{Running, "cancelled", to(Cancelled), false},
		{Running, "lose", to(Lost), false},
		{Lost, "done", to(Done), false},
		{Lost, "failed", to(Failed), false},
		{Lost, "lose", to(Lost), false},
		{Lost, "grant", to(Lost), true},
		{Done, "failed", to(Done), true},
		{Done, "lose", to(Done), false},
		{Done, "cancelled", to(Done), true},
	} {
		t.Run(c.from+" "+c.op, func(t *testing.T) {
			tb := openTable(t, t.TempDir(), 100, 100)
			x := reach[c.from](tb)
			if x.State != c.from {
				t.Fatalf("set-up reached %s, not %s", x.State, c.from)
			}
			err := ops[c.op](tb, x)
			if (err != nil) != c.fail {
				t.Errorf("%s from %s: error %v, want failure %v", c.op, c.from, err, c.fail)
			}
			if x.State != c.want[0] {
				t.Errorf("%s from %s: now %s, want %s", c.op, c.from, x.State, c.want[0])
			}
			if x.State != c.from && !allowed(c.from, x.State) {
				t.Errorf("%s → %s is not in the table", c.from, x.State)
			}
		})
	}
}

// TestReplayRebuildsTheTable: a history of every kind of transition, then
// a replay of the journal it left (through a rewrite, and without one)
// gives the same table: same tasks in the same states, same counts, same
// ended tasks in the same order, same highest id.
func TestReplayRebuildsTheTable(t *testing.T) {
	dir := t.TempDir()
	tb := openTable(t, dir, 6, 4)
	a := tb.submit(1)
	b := tb.submit(1, a.ID)
	c := tb.submit(1, a.ID)
	d := tb.submit(2)
	e := tb.submit(2)
	f := tb.submit(1)
	for _, x := range []*Task{b, c} {
		if x.State != Blocked {
			t.Fatalf("task %d after a pending one: %s, want blocked", x.ID, x.State)
		}
	}
	tb.run(a)
	if err := tb.Grant(d, []int{1}, -1, time.Now()); err != nil { // starting, never recorded
		t.Fatal(err)
	}
	tb.end(e, Cancelled, 0)
	tb.end(a, Done, 0)
	for _, x := range []*Task{b, c} {
		tb.Settle(x)
		if x.State != Pending {
			t.Errorf("task %d after its dependency succeeded: %s, want pending", x.ID, x.State)
		}
	}
	tb.run(b)
	tb.end(b, Failed, 3)
	g := tb.submit(1, b.ID) // fails: its dependency did not succeed
	if g.State != Failed || !strings.Contains(g.Reason, "failed with exit status 3") {
		t.Errorf("task after a failed one: %s %q", g.State, g.Reason)
	}
	tb.run(c)
	tb.EndNow(c, Lost, "its supervisor vanished")
	tb.end(c, Done, 0) // the report after all
	if err := tb.End(f, Cancelled, nil, "cancelled by u1"); err != nil {
		t.Fatal(err)
	}
	for range 10 { // churn of user 2
		x := tb.submit(2)
		if err := tb.End(x, Cancelled, nil, "cancelled by u2"); err != nil {
			t.Fatal(err)
		}
	}
	h := tb.submit(3)
	tb.run(h)
	tb.Ungrant(d) // as a restart finds it
	live := tb.dump()
	for _, x := range tb.tasks {
		if x.IsEnded() && x.Sub.Env != nil {
			t.Errorf("ended task %d keeps its environment", x.ID)
		}
	}
	tb.Close()

	checkCounts(t, tb)
	raw, err := os.ReadFile(filepath.Join(dir, journalName))
	if err != nil {
		t.Fatal(err)
	}
	for _, rewritten := range []bool{false, true} {
		t.Run(fmt.Sprint("rewritten=", rewritten), func(t *testing.T) {
			sub := t.TempDir()
			if err := os.WriteFile(filepath.Join(sub, journalName), raw, 0o600); err != nil {
				t.Fatal(err)
			}
			if rewritten {
				openTable(t, sub, 6, 4).Close() // replays, rewrites
			}
			re := openTable(t, sub, 6, 4)
			if got := re.dump(); got != live {
				t.Errorf("replayed table differs:\n%s\nlive:\n%s", got, live)
			}
			checkCounts(t, re)
			if x := re.Get(d.ID); x == nil || x.State != Pending || x.PID != 0 || len(x.Devices) != 0 {
				t.Errorf("the task starting when the journal ended replays as %+v, want pending without a start", x)
			}
			if x := re.Get(h.ID); x == nil || x.State != Running || x.PID != 4242 || x.Boot != "boot" || x.StartMono != 1000 {
				t.Errorf("the running task replays as %+v", x)
			}
			if len(re.ended) != 0 {
				t.Errorf("replay called Ended for %v", re.ended)
			}
		})
	}
}

// checkCounts recomputes the counts from the tasks: a replay rebuilds them
// as the live path kept them.
func checkCounts(t *testing.T, tb *table) {
	t.Helper()
	waiting, running, ended := map[uint32]int{}, map[uint32]int{}, 0
	live := 0
	for _, x := range tb.tasks {
		switch {
		case x.IsWaiting():
			waiting[x.UID]++
		case x.State == Starting || x.State == Running:
			running[x.UID]++
		default:
			ended++
		}
		if !x.IsEnded() {
			live++
		}
	}
	if fmt.Sprint(waiting) != fmt.Sprint(tb.waiting) || fmt.Sprint(running) != fmt.Sprint(tb.running) || ended != tb.nEnded || live != tb.live {
		t.Errorf("counts: waiting %v running %v ended %d live %d; the tasks say %v %v %d %d", tb.waiting, tb.running, tb.nEnded, tb.live, waiting, running, ended, live)
	}
}

// TestStartingIsPendingOnDisk: a task granted but whose start is not
// recorded is written pending by a rewrite taken then, never running; a
// replay queues it again.
func TestStartingIsPendingOnDisk(t *testing.T) {
	dir := t.TempDir()
	tb := openTable(t, dir, 10, 10)
	x := tb.submit(1)
	if err := tb.Grant(x, []int{3}, -1, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := tb.compact(); err != nil {
		t.Fatal(err)
	}
	tb.Close()
	data, err := os.ReadFile(filepath.Join(dir, journalName))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte(`"state":"running"`)) || bytes.Contains(data, []byte(`"state":"starting"`)) {
		t.Errorf("the rewrite holds a task started without its record:\n%s", data)
	}
	re := openTable(t, dir, 10, 10)
	if y := re.Get(x.ID); y == nil || y.State != Pending || len(y.Devices) != 0 {
		t.Errorf("replayed as %+v, want pending", y)
	}
}

// TestUnstart: a running task whose supervisor (the pid of its start
// record, and no other) says it never got its go-ahead is pending again,
// counted as waiting, live and after a replay of the journal, and may be
// granted and started anew.
func TestUnstart(t *testing.T) {
	dir := t.TempDir()
	tb := openTable(t, dir, 10, 10)
	x := tb.submit(1)
	tb.run(x) // supervisor 4242
	if err := tb.Unstart(x, 4243); err == nil {
		t.Fatal("unstarted on the word of another supervisor than its own")
	}
	if err := tb.Unstart(x, 4242); err != nil {
		t.Fatal(err)
	}
	check := func(tb *table, when string) {
		t.Helper()
		y := tb.Get(x.ID)
		if y == nil || y.State != Pending || y.PID != 0 || len(y.Devices) != 0 || y.Started != 0 || tb.Waiting(1) != 1 || tb.RunningByUser()[1] != 0 {
			t.Fatalf("%s: %+v, waiting %d, running %d; want pending, as before its grant", when, y, tb.Waiting(1), tb.RunningByUser()[1])
		}
	}
	check(tb, "unstarted")
	tb.Close()
	re := openTable(t, dir, 10, 10)
	check(re, "replayed")
	y := re.Get(x.ID)
	re.run(y)
	re.end(y, Done, 0)
	if y.State != Done {
		t.Errorf("started again and ended: %s", y.State)
	}
}

// TestRunningWithoutPID: a journal written by an older broker, which
// compacted a task as running before its supervisor's pid was known,
// replays it as pending: it never got its go-ahead.
func TestRunningWithoutPID(t *testing.T) {
	dir := t.TempDir()
	line := `{"op":"task","task":{"id":7,"uid":5,"user":"u","sub":{"argv":["true"],"cwd":"/","env":null},"argv":["true"],"log":"/l","time_sec":0,"state":"running","submitted":1,"started":2,"devices":[0],"slot":-1}}` + "\n"
	if err := os.WriteFile(filepath.Join(dir, journalName), []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	tb := openTable(t, dir, 10, 10)
	if x := tb.Get(7); x == nil || x.State != Pending || len(x.Devices) != 0 || x.Started != 0 {
		t.Errorf("task 7 replays as %+v, want pending", x)
	}
}

// TestEndedDropsEnvironment: an ended task's environment is gone from the
// table at its end and after a replay, and from the journal's file once
// it is rewritten, which happens by itself soon after the end.
func TestEndedDropsEnvironment(t *testing.T) {
	dir := t.TempDir()
	tb := openTable(t, dir, 10, 10)
	tb.secretWait = 200 * time.Millisecond
	x := tb.submit(1)
	keep := tb.submit(1) // still waiting: its environment stays
	tb.run(x)
	tb.end(x, Done, 0)
	if x.Sub.Env != nil {
		t.Errorf("ended task keeps its environment %q", x.Sub.Env)
	}
	// The rewrite that takes it off the disk comes by itself, secretDelay
	// after the last one.
	rewritten := make(chan struct{}, 1)
	tb.afterCompact = func() { rewritten <- struct{}{} }
	tb.mu.Unlock()
	select {
	case <-rewritten:
	case <-time.After(secretDelay + 10*time.Second):
		t.Error("no rewrite of the journal after the end of a task with an environment")
	}
	tb.mu.Lock()
	data, err := os.ReadFile(filepath.Join(dir, journalName))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(data, []byte("s3cr3t")); n != 1 { // the waiting task's
		t.Errorf("the journal holds the environment %d times after the rewrite, want once (the waiting task's):\n%s", n, data)
	}
	tb.Close()
	// And a replay of a journal that still has it (no rewrite yet) drops it.
	raw := string(mustEncode(t, &Record{Op: opTask, Task: &Task{ID: 1, UID: 1, Sub: wire.Submission{Env: []string{"SECRET=s3cr3t"}}, State: Pending, Slot: -1}},
		&Record{Op: opEnd, ID: 1, State: Cancelled, Time: 5}))
	d2 := t.TempDir()
	os.WriteFile(filepath.Join(d2, journalName), []byte(raw), 0o600)
	re := openTable(t, d2, 10, 10)
	if y := re.Get(1); y == nil || y.Sub.Env != nil {
		t.Errorf("replayed ended task: %+v, want no environment", y)
	}
	if data, _ := os.ReadFile(filepath.Join(d2, journalName)); bytes.Contains(data, []byte("s3cr3t")) {
		t.Errorf("the rewrite at open writes the environment back:\n%s", data)
	}
	_ = keep
}

func mustEncode(t *testing.T, recs ...*Record) []byte {
	t.Helper()
	b, err := encode(recs...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTrim: ended tasks are forgotten oldest end first, per user beyond
// KeepPerUser and in all beyond Keep, from the user with the most; a task
// that a waiting task names is kept; with nothing kept, a chain of --after
// still runs.
func TestTrim(t *testing.T) {
	t.Run("per user and global", func(t *testing.T) {
		tb := openTable(t, t.TempDir(), 5, 3)
		victim := tb.submit(1)
		tb.run(victim)
		tb.end(victim, Done, 0)
		var churn []*Task
		for range 20 {
			x := tb.submit(2)
			tb.End(x, Cancelled, nil, "")
			churn = append(churn, x)
		}
		if tb.Get(victim.ID) == nil {
			t.Errorf("another user's churn made the victim's task %d forgotten", victim.ID)
		}
		var kept []uint64
		for _, x := range churn {
			if tb.Get(x.ID) != nil {
				kept = append(kept, x.ID)
			}
		}
		if want := []uint64{churn[17].ID, churn[18].ID, churn[19].ID}; !slices.Equal(kept, want) {
			t.Errorf("user 2 keeps %v, want its last 3 %v", kept, want)
		}
		// Beyond the global cap, the user with most loses first.
		for u := uint32(3); u <= 4; u++ {
			x := tb.submit(u)
			tb.End(x, Cancelled, nil, "")
		}
		if tb.nEnded != 5 || tb.Get(victim.ID) == nil || len(tb.endedBy[2]) != 2 {
			t.Errorf("after two more users: %d ended kept, %v; want 5 with the victim's", tb.nEnded, tb.endedBy)
		}
	})
	t.Run("named by a waiting task", func(t *testing.T) {
		tb := openTable(t, t.TempDir(), 0, 0)
		a, b := tb.submit(1), tb.submit(1)
		c := tb.submit(1, a.ID, b.ID)
		tb.run(a)
		tb.end(a, Done, 0)
		if tb.Get(a.ID) == nil {
			t.Fatalf("task %d, named by waiting task %d, was forgotten with keep 0", a.ID, c.ID)
		}
		tb.run(b)
		tb.end(b, Done, 0)
		tb.Settle(c)
		if c.State != Pending {
			t.Fatalf("task after two that succeeded, nothing kept: %s %q", c.State, c.Reason)
		}
		tb.run(c)
		if tb.Get(a.ID) != nil || tb.Get(b.ID) != nil {
			t.Errorf("tasks %d and %d kept after their dependent started, with keep 0", a.ID, b.ID)
		}
	})
}

// TestIDsNeverRepeat: with nothing kept, ids go on from the highest ever
// given across reopenings.
func TestIDsNeverRepeat(t *testing.T) {
	dir := t.TempDir()
	var last uint64
	for range 3 {
		tb := openTable(t, dir, 0, 0)
		x := tb.submit(1)
		if x.ID <= last {
			t.Fatalf("id %d after %d", x.ID, last)
		}
		last = x.ID
		tb.run(x)
		tb.end(x, Done, 0)
		tb.Close()
		openTable(t, dir, 0, 0).Close() // a rewrite that keeps no task
	}
}

// TestJournalTag: a journal keeps its tag across reopenings and
// rewrites; a new journal, whose ids start again, gets another.
func TestJournalTag(t *testing.T) {
	dir := t.TempDir()
	tb := openTable(t, dir, 10, 10)
	tag := tb.Tag()
	if len(tag) != TagLen || strings.Trim(tag, "0123456789abcdef") != "" {
		t.Fatalf("tag %q, want %d hexadecimal digits", tag, TagLen)
	}
	tb.submit(1)
	if err := tb.compact(); err != nil {
		t.Fatal(err)
	}
	tb.Close()
	for range 2 {
		tb := openTable(t, dir, 10, 10)
		if tb.Tag() != tag {
			t.Errorf("reopened, the journal's tag is %q, was %q", tb.Tag(), tag)
		}
		tb.Close()
	}
	if other := openTable(t, t.TempDir(), 10, 10); other.Tag() == tag || other.NewID() != 1 {
		t.Errorf("a new journal has tag %q (the older one's: %q)", other.Tag(), tag)
	}
}

// TestTokens: a submission's token finds its task, per user, while the
// task is kept, live and after a replay; while it is being recorded it is
// known as such; a second submission with it is refused; the token goes
// with its task when the task is forgotten.
func TestTokens(t *testing.T) {
	dir := t.TempDir()
	tb := openTable(t, dir, 0, 0)
	submit := func(tb *table, uid uint32, token string) (*Task, error) {
		x := &Task{UID: uid, User: fmt.Sprint("u", uid), Slot: -1, Sub: wire.Submission{Argv: []string{"true"}, Cwd: "/", Token: token}}
		x.ID = tb.NewID()
		return x, tb.Submit(x)
	}
	var during struct {
		found     *Task
		recording bool
	}
	tb.j.beforeWrite = func() {
		tb.mu.Lock() // as another connection would, while the lock is let go for the disk
		during.found, during.recording = tb.ByToken(1, "a")
		tb.mu.Unlock()
	}
	x, err := submit(tb, 1, "a")
	if err != nil {
		t.Fatal(err)
	}
	tb.j.beforeWrite = nil
	if during.found != nil || !during.recording {
		t.Errorf("while its submission was recorded, token a gave %v, recording %v; want recording", during.found, during.recording)
	}
	if y, rec := tb.ByToken(1, "a"); y != x || rec {
		t.Errorf("token a of uid 1: %v, recording %v; want task %d", y, rec, x.ID)
	}
	if y, _ := tb.ByToken(2, "a"); y != nil {
		t.Errorf("uid 2 found uid 1's token: task %d", y.ID)
	}
	if _, err := submit(tb, 1, "a"); err == nil {
		t.Error("a second submission with token a was recorded")
	}
	tb.Close()
	re := openTable(t, dir, 0, 0)
	y, _ := re.ByToken(1, "a")
	if y == nil || y.ID != x.ID {
		t.Fatalf("replayed, token a gives %v; want task %d", y, x.ID)
	}
	re.run(y)
	re.end(y, Done, 0) // nothing kept: forgotten
	if z, _ := re.ByToken(1, "a"); z != nil {
		t.Errorf("task %d forgotten, its token still gives task %d", x.ID, z.ID)
	}
}

// TestCancelNotRecorded: a cancel that cannot be recorded changes nothing.
func TestCancelNotRecorded(t *testing.T) {
	tb := openTable(t, t.TempDir(), 10, 10)
	x := tb.submit(1)
	tb.j.mu.Lock()
	tb.j.broken = fmt.Errorf("write journal: %w", os.ErrPermission)
	tb.j.mu.Unlock()
	if err := tb.End(x, Cancelled, nil, "cancelled"); err == nil {
		t.Fatal("cancel recorded on a broken journal")
	}
	if x.State != Pending || x.Busy() || tb.Waiting(1) != 1 {
		t.Errorf("after a cancel that failed: %s busy %v waiting %d, want pending", x.State, x.Busy(), tb.Waiting(1))
	}
}

// TestEndRetried: a task's out-of-memory retry is in its end's own record
// (one line: no end is durable without it); a replay of the journal as a
// killed broker left it yields the end and the retry, and a copy of the
// record applied again (carried after a rewrite that has it) makes no
// second retry.
func TestEndRetried(t *testing.T) {
	dir := t.TempDir()
	tb := openTable(t, dir, 10, 10)
	a := tb.submit(1)
	tb.run(a)
	r := &Task{UID: 1, User: "u1", Slot: -1, Submitted: time.Now().UnixMilli(),
		Sub: wire.Submission{Argv: []string{"true"}, Cwd: "/", Env: []string{"K=v"}, Mem: 1280, RetryOf: a.ID}}
	r.ID = tb.NewID()
	if err := tb.EndRetried(a, Failed, nil, "out of device memory: retried", r); err != nil {
		t.Fatal(err)
	}
	if a.State != Failed || tb.Get(r.ID) != r || r.State != Pending || tb.Waiting(1) != 1 || tb.Live() != 1 {
		t.Fatalf("after the end: task %d %s, retry %d %s, waiting %d, live %d; want failed, pending, 1, 1", a.ID, a.State, r.ID, r.State, tb.Waiting(1), tb.Live())
	}
	data, err := os.ReadFile(filepath.Join(dir, journalName))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(strings.TrimSuffix(string(data), "\n"), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, `{"op":"end"`) || !strings.Contains(last, fmt.Sprintf(`"task":{"id":%d,`, r.ID)) {
		t.Fatalf("the end's record does not carry its retry: %s", last)
	}
	for _, c := range []struct {
		name    string
		journal string
	}{
		{"as left", string(data)},
		{"end applied twice", string(data) + last + "\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := t.TempDir()
			if err := os.WriteFile(filepath.Join(d, journalName), []byte(c.journal), 0o600); err != nil {
				t.Fatal(err)
			}
			tb2 := openTable(t, d, 10, 10)
			n := 0
			tb2.Each(func(x *Task) bool {
				if x.Sub.RetryOf == a.ID {
					n++
				}
				return true
			})
			x, y := tb2.Get(a.ID), tb2.Get(r.ID)
			if x == nil || x.State != Failed || y == nil || y.State != Pending || n != 1 || y.Sub.Mem != 1280 || len(y.Sub.Env) != 1 {
				t.Fatalf("replayed: task %d %+v, retry %+v, %d retries; want failed, one retry pending with its environment", a.ID, x, y, n)
			}
			checkCounts(t, tb2)
		})
	}
	// A retry is a new task: one whose id is taken is refused, and nothing
	// changes.
	b := tb.submit(1)
	tb.run(b)
	if err := tb.EndRetried(b, Failed, nil, "", &Task{ID: r.ID, UID: 1}); err == nil || b.State != Running {
		t.Errorf("a retry with a taken id: %v, task %d %s; want refused, still running", err, b.ID, b.State)
	}
}
