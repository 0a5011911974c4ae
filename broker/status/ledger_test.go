package status

import (
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/internal/testfs"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/wire"
)

// The status room in process, over a real lease table (real lock files in
// a temporary directory, real flock, releases seen by its watchers) and a
// real accounting log: room stands for the broker, serving the line under
// a lock of its own as the broker does under Server.mu, telling the
// ledger of each grant under it, and of each release from the table's
// watcher without it. It is the task room too (Tasks), read under the
// same lock, as the broker's taskView is.

// wait bounds every wait for an event in these tests.
const wait = 10 * time.Second

type room struct {
	mu    sync.Mutex
	tbl   *lease.Table
	g     *Ledger
	cpu   *lease.Queue // tasks waiting for a CPU slot, as the board lists them
	freed chan struct{}
	// hold, if set, leaves the grants served to the test: they wait on
	// held, committed and delivered but not yet told to the ledger.
	hold bool
	held chan handed
}

// handed is a grant delivered: its handover, its lease and its
// descriptors, now the holder's.
type handed struct {
	h   *lease.Handover
	l   *lease.Lease
	fds []int
}

func (r *room) Released(l *lease.Lease, id int, at time.Time, _ bool) {
	r.g.Ended(l, id, at) // as the broker: without its lock
}

func (r *room) Freed() {
	r.mu.Lock()
	r.serveLocked()
	r.mu.Unlock()
	select {
	case r.freed <- struct{}{}:
	default:
	}
}

// serveLocked serves the line, telling the ledger of each grant (unless
// hold), and delivers each to its waiter's channel.
func (r *room) serveLocked() {
	for _, h := range r.tbl.Schedule(nil) {
		if err := r.tbl.Allow(h); err != nil {
			panic(err)
		}
		l := r.tbl.Commit(h)
		hd := handed{h: h, l: l, fds: h.FDs()}
		if r.hold {
			r.held <- hd
			continue
		}
		r.g.Started(l, h)
		r.g.Changed()
		h.W.Ref.(chan handed) <- hd
	}
	r.g.Changed()
}

func (r *room) Supervisor(uint64) (int, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return 0, 0
}

func (r *room) Counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return map[string]int{wire.StatePending: r.cpu.Len()}
}

func (r *room) CPULine(max int) ([]*lease.Waiter, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ws := r.cpu.Waiters()
	return slices.Clone(ws[:min(max, len(ws))]), len(ws)
}

// ask queues a request of kind for n devices by uid, and serves the line.
func (r *room) ask(t testing.TB, kind lease.Kind, uid uint32, n int, ch chan handed) {
	h := lease.Holder{Kind: kind, UID: uid, User: fmt.Sprintf("u%d", uid), PID: os.Getpid()}
	if kind == lease.Task {
		h.PID, h.Task = 0, uint64(uid) // its supervisor's pid comes from the task room
	}
	w, err := r.tbl.Admit(lease.Request{Holder: h, N: n})
	if err != nil {
		t.Errorf("admit uid %d: %v", uid, err)
		return
	}
	w.Ref = ch
	r.mu.Lock()
	r.tbl.Add(w)
	r.serveLocked()
	r.mu.Unlock()
}

// newRoom opens a lease table of n fake devices and the status room over
// it, as the broker's New does, with the configuration's [status] extra.
func newRoom(t *testing.T, n int, extra string) (*room, string) {
	t.Helper()
	cfg, err := policy.Parse("npurun.conf", fmt.Appendf(nil, "[devices]\nvendor = \"fake\"\nids = \"0-%d\"\n%s", n-1, extra))
	if err != nil {
		t.Fatal(err)
	}
	inv, err := npu.Discover(npu.Vendor(cfg.Vendor), cfg.IDs, cfg.DevDir, cfg.NPUSmi)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	r := &room{cpu: lease.NewQueue(), freed: make(chan struct{}, 1), held: make(chan handed, 16)}
	if r.tbl, err = lease.Open(lease.Config{Dir: filepath.Join(dir, "locks"), IDs: inv.IDs, Pools: []lease.Pool{{Name: cfg.DefaultPool}},
		DefaultPool: cfg.DefaultPool, Vendor: inv.Vendor, Owner: r}); err != nil {
		t.Fatal(err)
	}
	scanner, err := procscan.New("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	lg := log.New(io.Discard, "", 0)
	if testing.Verbose() {
		lg = log.New(os.Stderr, "ledger: ", 0)
	}
	r.g = Open(Config{Policy: cfg, Inventory: inv, StateDir: dir, Scanner: scanner, Table: r.tbl, Tasks: r,
		Account: func(uint32) (string, []string, bool) { return "", nil, false }, Log: lg}, r.tbl.Found(), r.tbl)
	r.tbl.Start(nil)
	t.Cleanup(func() { r.quiet(t) }) // before the directory is removed
	return r, filepath.Join(dir, usageName)
}

// quiet waits until every device is free again, each on a fresh lock
// file: the test has let every lease go; and then until the accounting
// log's writer has written the records of their ends, which it does on
// its own goroutine (without that, the test's directory was at times
// removed while it wrote: "directory not empty", TestSampledIdle).
func (r *room) quiet(t *testing.T) {
	t.Helper()
	deadline := time.After(wait)
	for {
		free := 0
		for _, d := range r.tbl.Snapshot().Devices {
			if d.State == lease.Free {
				free++
			}
		}
		if free == len(r.tbl.Snapshot().Devices) {
			r.g.usage.flush(wait)
			return
		}
		select {
		case <-r.freed:
		case <-deadline:
			t.Errorf("devices still busy at the end: %+v", r.tbl.Snapshot().Devices)
			return
		}
	}
}

// release lets the lease go: its holder closes its descriptors.
func (hd handed) release() {
	for _, fd := range hd.fds {
		unix.Close(fd)
	}
}

// awaitFreed waits for the table to say that a device came into service
// again: the watcher has told its owner of the release (Released) by then.
func (r *room) awaitFreed(t *testing.T) {
	t.Helper()
	select {
	case <-r.freed:
	case <-time.After(wait):
		t.Fatal("no device came free")
	}
}

// records reads the accounting log back, once what is queued is written.
func (r *room) records(t *testing.T, path string) []usageRec {
	t.Helper()
	r.g.usage.flush(wait)
	recs, err := readUsage(path)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// TestEndedBeforeStarted: a lease whose release reaches the ledger before
// its start does (the table's watcher tells the ledger without the
// broker's lock, which the grant's delivery holds until it has told the
// ledger of the start) is ended all the same: it is not left on the board
// as held, its start and its end are both in the accounting log, and a
// later lease of the same device, started before the late start arrives,
// keeps its place. Before the ledger hears of a grant, the board shows it
// from the table's record.
func TestEndedBeforeStarted(t *testing.T) {
	r, path := newRoom(t, 1, "")
	r.mu.Lock()
	r.hold = true
	r.mu.Unlock()
	ch := make(chan handed, 1)
	r.ask(t, lease.Inline, 1001, 1, ch)
	var a handed
	select {
	case a = <-r.held:
	case <-time.After(wait):
		t.Fatal("no grant")
	}
	// Granted and not yet told to the ledger: the board shows the
	// table's record of the grant.
	if board, _ := r.g.Board(0); board.Devices[0].State != wire.DeviceLeased || board.Devices[0].Lease == nil || board.Devices[0].Lease.ID != a.l.ID {
		t.Errorf("npu0 granted, the ledger not told: %s, lease %+v; want leased, lease %d", board.Devices[0].State, board.Devices[0].Lease, a.l.ID)
	}
	a.release()
	r.awaitFreed(t) // its end has reached the ledger (Ended), its start not yet

	// The device's next lease, told to the ledger at once.
	r.mu.Lock()
	r.hold = false
	r.mu.Unlock()
	r.ask(t, lease.Inline, 1002, 1, ch)
	var b handed
	select {
	case b = <-ch:
	case <-time.After(wait):
		t.Fatal("no grant for the second lease")
	}
	r.g.Started(a.l, a.h) // late

	st := r.g.States()
	board, _ := r.g.Board(0)
	if st[0] != wire.DeviceLeased || board.Devices[0].Lease == nil || board.Devices[0].Lease.ID != b.l.ID {
		t.Errorf("npu0 while the second lease holds it: %s, lease %+v; want leased, lease %d", st[0], board.Devices[0].Lease, b.l.ID)
	}
	b.release()
	r.awaitFreed(t) // its end has reached the ledger, and the device is free
	if st := r.g.States(); st[0] != wire.DeviceFree {
		t.Errorf("npu0 once both leases ended: %s, want free", st[0])
	}
	evs := map[uint64][]string{}
	for _, rec := range r.records(t, path) {
		evs[rec.Lease] = append(evs[rec.Lease], rec.Ev)
	}
	for _, l := range []*lease.Lease{a.l, b.l} {
		if !slices.Equal(evs[l.ID], []string{"start", "end"}) {
			t.Errorf("lease %d in the accounting log: %v, want a start and an end", l.ID, evs[l.ID])
		}
	}
}

// TestRoomLockOrder: the status room's lock with the others, under
// -race: holders granted and releasing as fast as they can, the grants
// told to the ledger under the serving lock (the broker's Server.mu) and
// the releases from the table's watchers without it, while boards are
// drawn (a look at the holders, which asks the task view for supervisors
// under the serving lock, then the table's snapshot), metrics scraped,
// the accounting log's sums written and full scans of /proc run. A lock
// taken in the wrong order deadlocks, and the watchdog fails the test
// with every goroutine's stack; mutual exclusion is checked by the
// holders, each marking every device it is granted with a file made
// O_EXCL, removed before it lets the lease go.
func TestRoomLockOrder(t *testing.T) {
	const devices, holders, rounds = 3, 6, 20
	watchdog := time.AfterFunc(2*time.Minute, func() {
		debug.SetTraceback("all")
		panic("TestRoomLockOrder still runs after 2 minutes: the rooms' locks deadlock")
	})
	defer watchdog.Stop()
	r, _ := newRoom(t, devices, "")
	marks := t.TempDir()
	stop := make(chan struct{})
	var readers sync.WaitGroup
	read := func(f func()) {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				f()
			}
		}()
	}
	read(func() {
		r.g.mu.Lock()
		r.g.refreshed = time.Time{} // a look at the holders each time
		r.g.unlock()
		if b, _ := r.g.Board(0); len(b.Devices) != devices {
			t.Errorf("board of %d devices", len(b.Devices))
		}
	})
	read(func() {
		if _, err := r.g.metrics.reg.Gather(); err != nil {
			t.Error(err)
		}
		r.g.writeSums(time.Now())
	})
	read(func() {
		r.g.scanOnce()
		time.Sleep(50 * time.Millisecond) // pacing, not synchronisation: a scan reads all of /proc
	})
	var wg sync.WaitGroup
	for h := range holders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ch := make(chan handed, 1)
			kind := []lease.Kind{lease.Inline, lease.Task, lease.Login}[h%3]
			for n := range rounds {
				r.ask(t, kind, uint32(1000+h), 1+(h+n)%2, ch)
				var hd handed
				select {
				case hd = <-ch:
				case <-time.After(wait):
					t.Errorf("holder %d round %d: no grant", h, n)
					return
				}
				testfs.Mark(t, marks, fmt.Sprintf("holder %d", h), hd.l.Devices)()
				hd.release()
			}
		}()
	}
	wg.Wait()
	close(stop)
	readers.Wait()
}
