package tasks

import (
	"encoding/json"
	"errors"
	"io"
	"log"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/tasks/journal"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/wire"
)

// TestEncodedSizeBounds: the sizes a submission is checked by are never
// below what the show reply and the supervisor's Spec encode to, and not
// far above, whatever the strings hold.
func TestEncodedSizeBounds(t *testing.T) {
	room := &Room{socket: "/run/npurun/broker.sock"}
	room.cfg.Store(&policy.Config{Tasks: policy.Tasks{CPUThreads: 4, IdlePriority: true}})
	pieces := []string{"a", "<", ">", "&", "\"", "\\", "\n", "\t", "\x01", "\x7f", "é", "\u2028", "\xff", "'", " ", "𝄞"}
	rnd := rand.New(rand.NewPCG(1, 2))
	text := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteString(pieces[rnd.IntN(len(pieces))])
		}
		return b.String()
	}
	for i := range 200 {
		sub := wire.Submission{Cwd: "/" + text(20), Name: text(10), NoDevice: i%2 == 0}
		if i%5 == 0 {
			sub.After = []uint64{1 << 63, 12, 99999999}
			sub.Devices = []int{0, 100, 1 << 20}
		}
		for range rnd.IntN(20) {
			sub.Env = append(sub.Env, "V"+text(3)+"="+text(rnd.IntN(300)))
		}
		if i%3 == 0 {
			sub.Shell = text(rnd.IntN(2000))
		} else {
			for range 1 + rnd.IntN(10) {
				sub.Argv = append(sub.Argv, text(rnd.IntN(200)))
			}
		}
		tk := &journal.Task{ID: 1 << 40, UID: 1000, User: "u" + text(5), Sub: sub, Log: "/" + text(50), Slot: -1,
			Argv: sub.Argv}
		if sub.Shell != "" {
			tk.Argv = []string{"/bin/sh", "-c", sub.Shell}
		}
		reply, err := json.Marshal(&wire.Reply{V: wire.Version, Type: wire.TypeTasks, Tasks: []wire.TaskInfo{Info(tk, true, 1<<20)}})
		if err != nil {
			t.Fatal(err)
		}
		spec, err := json.Marshal(room.specLocked(tk))
		if err != nil {
			t.Fatal(err)
		}
		if got := replyLen(tk); got < len(reply) || got > len(reply)+replyFrame {
			t.Errorf("case %d: replyLen %d for a reply of %d bytes", i, got, len(reply))
		}
		if got := room.specLen(tk); got < len(spec) || got > len(spec)+specFrame+1024 {
			t.Errorf("case %d: specLen %d for a Spec of %d bytes", i, got, len(spec))
		}
	}
}

// testAccounts is a user database that answers what a test says.
type testAccounts struct {
	mu sync.Mutex
	m  map[uint32]*Account
}

func (a *testAccounts) Lookup(uid uint32) *Account {
	a.mu.Lock()
	defer a.mu.Unlock()
	if acct := a.m[uid]; acct != nil {
		return acct
	}
	return &Account{Name: "uid " + strconv.Itoa(int(uid)), Home: "/", Shell: "/bin/sh"}
}

func (a *testAccounts) store(uid uint32, acct *Account) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = map[uint32]*Account{}
	}
	a.m[uid] = acct
}

// serveCount is an owner that counts the times it is asked to serve the
// line.
type serveCount struct{ n atomic.Int64 }

func (o *serveCount) Serve() { o.n.Add(1) }

// testRoom is a room over table, with its journal in a temporary
// directory open (as Open does, without the runner), no task in it.
func testRoom(tb testing.TB, cfg *policy.Config, table *lease.Table, accts Accounts) *Room {
	tb.Helper()
	return testRoomWith(tb, cfg, table, accts, &testRunner{})
}

// testRoomWith is testRoom whose runner is run.
func testRoomWith(tb testing.TB, cfg *policy.Config, table *lease.Table, accts Accounts, run Runner) *Room {
	tb.Helper()
	if accts == nil {
		accts = &testAccounts{}
	}
	room := New(Config{Policy: cfg, Table: table, Owner: &serveCount{}, Accounts: accts, Log: log.New(io.Discard, "", 0),
		Runner: func(Host) Runner { return run }})
	life, err := journal.Open(tb.TempDir(), journal.Options{Lock: &room.mu, Log: room.log, Keep: 10, KeepPerUser: 10, Ended: room.endedLocked})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { life.Close() })
	room.life, room.running = life, life.RunningByUser()
	return room
}

// TestReplayedTaskWaitsForItsAccount: a task taken up from the journal
// whose account cannot be looked up for a reason that passes (a name
// service not up yet at boot, no descriptors left) is not judged on a
// stand-in's account, which no group opens its pool to: it waits out of
// line, saying why, and is queued once its account can be read (issue
// 15.3).
func TestReplayedTaskWaitsForItsAccount(t *testing.T) {
	cfg, err := policy.Parse("npurun.conf", []byte(`
[devices]
vendor = "fake"
ids = "0-1"
[pools]
interactive = "0"
queue = "1"
[limits]
pools = ["interactive"]
[group.lab]
pools = ["interactive", "queue"]
`))
	if err != nil {
		t.Fatal(err)
	}
	table, err := lease.Open(lease.Config{Dir: t.TempDir(), IDs: []int{0, 1}, DefaultPool: cfg.DefaultPool,
		Pools: []lease.Pool{{Name: "interactive", IDs: []int{0}}, {Name: "queue", IDs: []int{1}}}})
	if err != nil {
		t.Fatal(err)
	}
	accts := &testAccounts{}
	room := testRoom(t, cfg, table, accts)
	life := room.life
	const uid = 4242
	room.mu.Lock()
	defer room.mu.Unlock()
	tk := &journal.Task{ID: life.NewID(), UID: uid, User: "alice", Slot: -1, Sub: wire.Submission{Pool: "queue", Cwd: "/", Argv: []string{"true"}}}
	if err := life.Submit(tk); err != nil {
		t.Fatal(err)
	}
	j := &Task{Task: tk} // as takeUp makes it: no account yet
	room.jobs[tk.ID] = j
	// The user database does not answer now.
	accts.store(uid, &Account{Name: "uid 4242", Home: "/", Err: errors.New("too many open files")})
	room.settleLocked(j)
	if tk.State != journal.Pending || j.inLine {
		t.Fatalf("task of an account that cannot be looked up now: %s (%s), in line %v; want pending, out of line", tk.State, tk.Reason, j.inLine)
	}
	if why := room.waitReasonLocked(j); !strings.Contains(why, "user database") {
		t.Errorf("it waits, saying %q; want it to name the user database", why)
	}
	// Now it answers: alice is in group lab, which opens pool "queue".
	accts.store(uid, &Account{Name: "alice", Groups: []string{"lab"}, Home: "/home/alice", Known: true, Shell: "/bin/sh"})
	room.mu.Unlock()
	room.lookupAgain()
	room.mu.Lock()
	if tk.State != journal.Pending || !j.inLine || j.w.Pool != "queue" || j.w.User != "alice" {
		t.Errorf("once its account can be read: %s (%s), in line %v; want pending in line for pool queue as alice", tk.State, tk.Reason, j.inLine)
	}
}
