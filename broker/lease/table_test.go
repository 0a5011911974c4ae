package lease

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/refusal"
	"github.com/npurun/npurun/internal/fileid"
	"github.com/npurun/npurun/internal/testfs"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
)

// The lease table in process: real lock files in a temporary directory,
// real flock, real releases seen by the watchers; an owner that serves the
// line under a lock of its own, as the broker does, and delivers each
// grant to a channel instead of a socket.

// eventWait bounds every wait for an event in these tests.
const eventWait = 10 * time.Second

// owner is a test owner of a table: it serves the line under its own lock
// (mu), delivering each grant to its waiter's channel (Ref).
type owner struct {
	mu      sync.Mutex
	tbl     *Table
	running map[uint32]int
	events  chan string // "released L ID last", "freed", in order
	refuse  func(h *Handover) bool
}

// grant is a delivered grant: the waiter served, its lease and its
// locked descriptors, now the holder's.
type grant struct {
	w   *Waiter
	l   *Lease
	fds []int
}

func (o *owner) Released(l *Lease, id int, at time.Time, last bool) {
	o.mu.Lock() // as the broker records the end under its lock
	defer o.mu.Unlock()
	o.event(fmt.Sprintf("released %d npu%d last=%v", l.ID, id, last))
}

func (o *owner) Freed() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.event("freed")
	o.serveLocked()
}

func (o *owner) event(e string) {
	select {
	case o.events <- e:
	default: // a test that does not read them
	}
}

// serveLocked serves the line: each grant is opened (the gate), delivered
// to its waiter's channel, and committed; or returned where refuse says
// its client has gone.
func (o *owner) serveLocked() {
	for {
		hs := o.tbl.Schedule(o.running)
		if len(hs) == 0 {
			return
		}
		failed := false
		for _, h := range hs {
			if o.refuse != nil && o.refuse(h) {
				o.tbl.Return(h)
				failed = true
				continue
			}
			if err := o.tbl.Allow(h); err != nil {
				o.tbl.Return(h)
				failed = true
				continue
			}
			l := o.tbl.Commit(h)
			h.W.Ref.(chan grant) <- grant{w: h.W, l: l, fds: h.FDs()}
		}
		if !failed {
			return
		}
	}
}

// ask queues a request of uid for n devices of pool (or exactly devices),
// with limit lim, and serves the line; the grant comes on the channel
// returned.
func (o *owner) ask(t *testing.T, uid uint32, n int, pool string, devices []int, lim policy.Limit) (*Waiter, chan grant) {
	t.Helper()
	ch := make(chan grant, 1)
	return o.askTo(t, ch, uid, n, pool, devices, lim), ch
}

// askTo is ask, the grant delivered to ch.
func (o *owner) askTo(t testing.TB, ch chan grant, uid uint32, n int, pool string, devices []int, lim policy.Limit) *Waiter {
	w, err := o.tbl.Admit(Request{Holder: Holder{Kind: Inline, UID: uid, User: fmt.Sprintf("u%d", uid)}, N: n, Pool: pool, Devices: devices, Limit: lim})
	if err != nil {
		t.Errorf("admit uid %d: %v", uid, err)
		return nil
	}
	w.Ref = ch
	o.mu.Lock()
	o.tbl.Add(w)
	o.serveLocked()
	o.mu.Unlock()
	return w
}

// newTable opens and starts a table of n devices, 0..n-1, in pools (one
// pool "default" of all when none are given), owned by a test owner.
func newTable(t *testing.T, n int, gate Gate, pools ...Pool) (*owner, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "locks")
	o := &owner{running: map[uint32]int{}, events: make(chan string, 1024)}
	if len(pools) == 0 {
		pools = []Pool{{Name: "default"}}
	}
	tbl, err := Open(Config{Dir: dir, IDs: ids(n), Pools: pools, DefaultPool: pools[0].Name, Vendor: npu.Fake, Gate: gate, Owner: o})
	if err != nil {
		t.Fatal(err)
	}
	o.tbl = tbl
	tbl.Start(nil)
	t.Cleanup(func() { o.quiet(t) }) // before the directory is removed
	return o, dir
}

// quiet waits until every device is free: its lease's end recorded and a
// fresh lock file in place, so that no watcher writes in the directory
// any more. The test has released every lease.
func (o *owner) quiet(t *testing.T) {
	t.Helper()
	deadline := time.After(eventWait)
	for {
		snap := make(chan Snapshot, 1)
		go func() { snap <- o.tbl.Snapshot() }()
		var devices []Device
		select {
		case s := <-snap:
			devices = s.Devices
		case <-deadline:
			t.Error("the table's lock is held for good: a deadlock")
			return
		}
		busy := false
		for _, d := range devices {
			busy = busy || d.State != Free
		}
		if !busy {
			return
		}
		select {
		case <-o.events: // a device freed, or about to be
		case <-deadline:
			t.Errorf("devices still busy at the end: %+v", devices)
			return
		}
	}
}

// got waits for a grant on ch.
func got(t *testing.T, ch chan grant, what string) grant {
	t.Helper()
	select {
	case g := <-ch:
		return g
	case <-time.After(eventWait):
		t.Fatalf("%s: no grant", what)
		return grant{}
	}
}

// none checks that nothing was granted on ch (after the owner served the
// line: grants are delivered under its lock, so none is on its way).
func none(t *testing.T, o *owner, ch chan grant, what string) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	select {
	case g := <-ch:
		t.Fatalf("%s: granted npu %v", what, g.l.Devices)
	default:
	}
}

// release ends a grant's lease: its holder closes its descriptors.
func (g grant) release() {
	for _, fd := range g.fds {
		unix.Close(fd)
	}
}

// awaitEvent waits for an owner event with prefix, skipping others.
func awaitEvent(t *testing.T, o *owner, prefix string) string {
	t.Helper()
	deadline := time.After(eventWait)
	for {
		select {
		case e := <-o.events:
			if strings.HasPrefix(e, prefix) {
				return e
			}
		case <-deadline:
			t.Fatalf("no %q event", prefix)
		}
	}
}

func fdFile(t *testing.T, fd int) fileid.ID {
	t.Helper()
	f, err := fileid.Of(fd)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func pathFile(t *testing.T, path string) fileid.ID {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return fileid.ID{Dev: st.Dev, Ino: st.Ino}
}

// TestHandoff: a lease's end hands its device to the request waiting for
// it: the owner hears of the release first, then of the device free, and
// the waiter's grant is on a fresh lock file, the one the device's path
// names now, locked; the lease record names that file.
func TestHandoff(t *testing.T) {
	o, dir := newTable(t, 1, nil)
	_, cha := o.ask(t, 1, 1, "", nil, policy.Limit{})
	a := got(t, cha, "a, device free")
	other, err := openLock(LockPath(dir, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := flock(other, true); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Fatalf("another open of npu0's lock file locks it during a's lease: %v", err)
	}
	unix.Close(other)
	if o.tbl.Ended(0, a.l.Files[0]) {
		t.Error("Ended says a's lease ended while a holds it")
	}
	wb, chb := o.ask(t, 2, 1, "", nil, policy.Limit{})
	none(t, o, chb, "b while a holds the device")
	if pos := o.tbl.Position(wb); pos != 1 {
		t.Errorf("b's place while it waits: %d, want 1", pos)
	}
	a.release()
	if e := awaitEvent(t, o, "released"); e != fmt.Sprintf("released %d npu0 last=true", a.l.ID) {
		t.Errorf("release event %q", e)
	}
	awaitEvent(t, o, "freed")
	b := got(t, chb, "b, once a's lease ended")
	if b.l.ID == a.l.ID {
		t.Errorf("b's lease has a's id %d", a.l.ID)
	}
	fa, fb := a.l.Files[0], fdFile(t, b.fds[0])
	if fa == fb {
		t.Fatal("b's lease is on a's lock file: an earlier lease's descriptor could take it")
	}
	if cur := pathFile(t, LockPath(dir, 0)); cur != fb || b.l.Files[0] != fb {
		t.Errorf("b's lock file %v, its record %v, the device's path names %v", fb, b.l.Files[0], cur)
	}
	if o.tbl.Ended(0, fb) {
		t.Error("Ended says b's lease ended while b holds it")
	}
	b.release()
	awaitEvent(t, o, "freed")
	if !o.tbl.Ended(0, fb) {
		t.Error("Ended does not say b's lease ended once its watcher saw it")
	}
}

// TestStaleDescriptorTakesNothing: a holder that keeps its lease's
// descriptor, unlocks it (the lease ends) and waits in flock on it gets
// no device: later leases are on fresh files, granted as usual while it
// holds the old file's lock.
func TestStaleDescriptorTakesNothing(t *testing.T) {
	o, dir := newTable(t, 1, nil)
	_, ch := o.ask(t, 1, 1, "", nil, policy.Limit{})
	thief := got(t, ch, "the thief's lease")
	if err := unix.Flock(thief.fds[0], unix.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	awaitEvent(t, o, "freed") // the lease has ended
	relocked := make(chan error, 1)
	go func() { relocked <- unix.Flock(thief.fds[0], unix.LOCK_EX) }()
	for i := range 3 {
		_, ch := o.ask(t, 2, 1, "", nil, policy.Limit{})
		g := got(t, ch, fmt.Sprintf("lease %d after the thief's", i))
		if f := fdFile(t, g.fds[0]); f == thief.l.Files[0] || f != pathFile(t, LockPath(dir, 0)) {
			t.Fatalf("lease %d on file %v; the thief's is %v, the device's %v", i, f, thief.l.Files[0], pathFile(t, LockPath(dir, 0)))
		}
		g.release()
		awaitEvent(t, o, "freed")
	}
	select {
	case err := <-relocked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(eventWait):
		t.Fatal("the thief never got its old file's lock: the table still holds it")
	}
	if f := fdFile(t, thief.fds[0]); f == pathFile(t, LockPath(dir, 0)) {
		t.Error("the thief's lock is the device's current lock file")
	}
	unix.Close(thief.fds[0])
}

// TestReservation: a multi-device request at the head of the line keeps
// the free devices it can use; a later, smaller request that could use
// them waits behind it, and a snapshot shows them reserved for it.
func TestReservation(t *testing.T) {
	o, _ := newTable(t, 4, nil)
	_, ch := o.ask(t, 1, 0, "", []int{0}, policy.Limit{})
	holder := got(t, ch, "holder of npu0")
	wbig, chbig := o.ask(t, 2, 4, "", nil, policy.Limit{})
	_, chsmall := o.ask(t, 3, 1, "", nil, policy.Limit{})
	none(t, o, chbig, "big while npu0 is held")
	none(t, o, chsmall, "small behind big")
	snap := o.tbl.Snapshot()
	for _, d := range snap.Devices[1:] {
		if d.State != Reserved || d.For != wbig {
			t.Errorf("npu%d: state %d for %v, want reserved for big", d.ID, d.State, d.For)
		}
	}
	if d := snap.Devices[0]; d.State != Leased || len(d.Leases) != 1 || d.Leases[0] != holder.l {
		t.Errorf("npu0: state %d, leases %v, want the holder's lease", d.State, d.Leases)
	}
	holder.release()
	big := got(t, chbig, "big once npu0 is free")
	if !slices.Equal(big.l.Devices, []int{0, 1, 2, 3}) {
		t.Errorf("big got %v", big.l.Devices)
	}
	none(t, o, chsmall, "small while big holds every device")
	big.release()
	got(t, chsmall, "small once big is done").release()
}

// TestBackfill: a smaller request behind a waiting head is served at once
// on a device the head cannot use, never on one the head has reserved.
func TestBackfill(t *testing.T) {
	for _, tc := range []struct {
		name     string
		pools    []Pool
		hold     func(o *owner) chan grant
		head     func(o *owner) chan grant
		small    func(o *owner) chan grant
		wantDevs []int
	}{
		{
			name: "exact devices",
			hold: func(o *owner) chan grant { _, ch := o.ask(t, 1, 0, "", []int{1}, policy.Limit{}); return ch },
			// waits for 1, reserves 0
			head: func(o *owner) chan grant { _, ch := o.ask(t, 2, 0, "", []int{0, 1}, policy.Limit{}); return ch },
			// would take 0 first; must take 2
			small:    func(o *owner) chan grant { _, ch := o.ask(t, 3, 1, "", nil, policy.Limit{}); return ch },
			wantDevs: []int{2},
		},
		{
			name:     "two pools",
			pools:    []Pool{{Name: "a", IDs: []int{0, 1}}, {Name: "b", IDs: []int{2, 3}}},
			hold:     func(o *owner) chan grant { _, ch := o.ask(t, 1, 1, "a", nil, policy.Limit{}); return ch },
			head:     func(o *owner) chan grant { _, ch := o.ask(t, 2, 2, "a", nil, policy.Limit{}); return ch },
			small:    func(o *owner) chan grant { _, ch := o.ask(t, 3, 1, "b", nil, policy.Limit{}); return ch },
			wantDevs: []int{2},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, _ := newTable(t, 4, nil, tc.pools...)
			holder := got(t, tc.hold(o), "holder")
			chHead := tc.head(o)
			small := got(t, tc.small(o), "small, at once")
			if !slices.Equal(small.l.Devices, tc.wantDevs) {
				t.Errorf("small got npu %v, want %v (not one the head reserved)", small.l.Devices, tc.wantDevs)
			}
			none(t, o, chHead, "head while its device is held")
			holder.release()
			got(t, chHead, "head once its device is free").release()
			small.release()
		})
	}
}

// TestFairness: one user's many requests do not starve another's: served
// one device at a time, releases handing it on, the users alternate, and
// each user's own requests keep their order.
func TestFairness(t *testing.T) {
	o, _ := newTable(t, 1, nil)
	_, ch := o.ask(t, 9, 1, "", nil, policy.Limit{})
	held := got(t, ch, "the first holder")
	grants := make(chan grant, 8)
	names := map[*Waiter]string{}
	for i := range 3 {
		names[o.askTo(t, grants, 1, 1, "", nil, policy.Limit{})] = fmt.Sprintf("a%d", i)
	}
	for i := range 2 {
		names[o.askTo(t, grants, 2, 1, "", nil, policy.Limit{})] = fmt.Sprintf("b%d", i)
	}
	var order []string
	for range names {
		held.release()
		held = got(t, grants, fmt.Sprintf("the next after %v", order))
		order = append(order, names[held.w])
	}
	held.release()
	if want := []string{"a0", "b0", "a1", "b1", "a2"}; !slices.Equal(order, want) {
		t.Errorf("service order %v, want %v", order, want)
	}
}

// TestCaps: a user at their max_devices waits, saying why, and reserves
// nothing: another user's request behind it is served. Once the user's
// lease ends, their request is.
func TestCaps(t *testing.T) {
	o, _ := newTable(t, 2, nil)
	lim := policy.Limit{MaxDevices: 1, Source: "user u1"}
	_, ch := o.ask(t, 1, 1, "", nil, lim)
	mine := got(t, ch, "u1's first device")
	if n := o.tbl.Held(1); n != 1 {
		t.Errorf("u1 holds %d, want 1", n)
	}
	w2, ch2 := o.ask(t, 1, 1, "", nil, lim)
	_, chOther := o.ask(t, 2, 1, "", nil, policy.Limit{})
	none(t, o, ch2, "u1 at its cap")
	other := got(t, chOther, "u2 behind a capped request")
	line := o.tbl.Line(nil)
	if len(line) != 1 || line[0].W != w2 || line[0].Why != "u1 holds 1 of 1 device allowed (user u1)" {
		t.Errorf("line %+v, want u1's request waiting for its cap", line)
	}
	mine.release()
	awaitEvent(t, o, "released")
	got(t, ch2, "u1's second, once its first is released").release()
	other.release()
	if _, err := o.tbl.Admit(Request{Holder: Holder{UID: 1, User: "u1"}, N: 2, Limit: lim}); !errors.Is(err, ErrDenied) {
		t.Errorf("2 devices past a cap of 1: %v, want denied", err)
	}
}

// TestLine: places are counted per pool, name up to MaxAhead users ahead
// (each once, in line order), and a waiter told its reason only when its
// user's cap holds it back.
func TestLine(t *testing.T) {
	o, _ := newTable(t, 2, nil, Pool{Name: "a", IDs: []int{0}}, Pool{Name: "b", IDs: []int{1}})
	var holders []grant
	for _, p := range []string{"a", "b"} {
		_, ch := o.ask(t, 99, 1, p, nil, policy.Limit{})
		holders = append(holders, got(t, ch, "holder of pool "+p))
	}
	o.ask(t, 1, 1, "a", nil, policy.Limit{})
	o.ask(t, 2, 1, "b", nil, policy.Limit{})
	o.ask(t, 1, 1, "a", nil, policy.Limit{})
	o.ask(t, 3, 1, "a", nil, policy.Limit{})
	o.ask(t, 4, 1, "a", nil, policy.Limit{})
	o.ask(t, 5, 1, "a", nil, policy.Limit{})
	o.ask(t, 99, 1, "a", nil, policy.Limit{MaxDevices: 1, Source: "the default [limits]"})
	type place struct {
		user, pool string
		pos        int
		ahead      []string
		why        string
	}
	var gotLine []place
	for _, p := range o.tbl.Line(nil) {
		gotLine = append(gotLine, place{p.W.User, p.W.Pool, p.Pos, p.Ahead, p.Why})
	}
	// Service order interleaves users: u1's second request waits a round.
	want := []place{
		{"u1", "a", 1, nil, ""},
		{"u2", "b", 1, nil, ""},
		{"u3", "a", 2, []string{"u1"}, ""},
		{"u4", "a", 3, []string{"u1", "u3"}, ""},
		{"u5", "a", 4, []string{"u1", "u3", "u4"}, ""},
		{"u99", "a", 5, []string{"u1", "u3", "u4"}, "u99 holds 2 of 1 device allowed (the default [limits])"},
		{"u1", "a", 6, []string{"u1", "u3", "u4"}, ""},
	}
	if len(gotLine) != len(want) {
		t.Fatalf("line %+v, want %+v", gotLine, want)
	}
	for i := range want {
		g, w := gotLine[i], want[i]
		if g.user != w.user || g.pool != w.pool || g.pos != w.pos || !slices.Equal(g.ahead, w.ahead) || g.why != w.why {
			t.Errorf("place %d: %+v, want %+v", i, g, w)
		}
	}
	for _, p := range o.tbl.Line(nil) {
		if !o.tbl.Remove(p.W) {
			t.Errorf("%s's request not in line to be removed", p.W.User)
		}
	}
	if n := o.tbl.Len(); n != 0 {
		t.Errorf("%d left in line", n)
	}
	for _, h := range holders {
		h.release()
	}
}

// TestFoundAtStart: a device whose lock is held when the table opens is
// found, not granted; adopted as the owner's record says, it counts
// against its holder and is released as any lease, onto a fresh file.
func TestFoundAtStart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "locks")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// A lease from before this start: its holder has the lock.
	held, err := openLock(LockPath(dir, 1))
	if err != nil {
		t.Fatal(err)
	}
	if err := flock(held, true); err != nil {
		t.Fatal(err)
	}
	o := &owner{running: map[uint32]int{}, events: make(chan string, 64)}
	tbl, err := Open(Config{Dir: dir, IDs: []int{0, 1}, Pools: []Pool{{Name: "default"}}, DefaultPool: "default", Vendor: npu.Fake, Owner: o})
	if err != nil {
		t.Fatal(err)
	}
	o.tbl = tbl
	found := tbl.Found()
	if len(found) != 1 || found[1] != fdFile(t, held) {
		t.Fatalf("found %v, want npu1 on %v", found, fdFile(t, held))
	}
	l := &Lease{ID: 42, Holder: Holder{Kind: Inline, UID: 7, User: "u7"}, Devices: []int{1}, Files: []fileid.ID{found[1]}, Since: time.Now(), Adopted: true}
	if err := tbl.Adopt(l); err != nil {
		t.Fatal(err)
	}
	if err := tbl.Adopt(&Lease{ID: 43, Devices: []int{0}}); err == nil {
		t.Error("a free device adopted")
	}
	tbl.Start(nil)
	if n := tbl.Held(7); n != 1 {
		t.Errorf("u7 holds %d, want 1 (the adopted lease counts)", n)
	}
	if id := tbl.NewID(); id <= 42 {
		t.Errorf("new id %d, not above the adopted 42", id)
	}
	snap := tbl.Snapshot()
	if d := snap.Devices[1]; d.State != Leased || d.Leases[0] != l {
		t.Errorf("npu1: state %d, leases %v, want the adopted lease", d.State, d.Leases)
	}
	if d := snap.Devices[0]; d.State != Free {
		t.Errorf("npu0: state %d, want free", d.State)
	}
	_, ch := o.ask(t, 8, 0, "", []int{1}, policy.Limit{})
	none(t, o, ch, "npu1 while its lease from before goes on")
	unix.Close(held)
	if e := awaitEvent(t, o, "released"); e != "released 42 npu1 last=true" {
		t.Errorf("release event %q", e)
	}
	g := got(t, ch, "npu1 once its lease from before ended")
	if f := fdFile(t, g.fds[0]); f == found[1] {
		t.Error("npu1 granted on the lock file of the lease from before")
	}
	if n := tbl.Held(7); n != 0 {
		t.Errorf("u7 holds %d after its lease ended", n)
	}
	g.release()
	o.quiet(t)
}

// gate records the order of what it is asked, and fails or blocks where a
// test says.
type gate struct {
	mu       sync.Mutex
	calls    []string
	revokeOK bool          // Revoke succeeds
	closing  chan struct{} // Close waits for it to be closed
	entered  chan int      // Close says here that it was called
}

func (g *gate) note(s string) {
	g.mu.Lock()
	g.calls = append(g.calls, s)
	g.mu.Unlock()
}

func (g *gate) Allow(uid uint32, ids []int) error {
	g.note(fmt.Sprintf("allow %d %v", uid, ids))
	return nil
}

func (g *gate) Revoke(id int, _ []uint32) error {
	g.note(fmt.Sprintf("revoke %d", id))
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.revokeOK {
		return errors.New("acl: too many open files")
	}
	return nil
}

func (g *gate) Close(id int, _ []uint32, failed error) {
	g.note(fmt.Sprintf("close %d %v", id, failed != nil))
	g.entered <- id
	g.mu.Lock()
	closing := g.closing
	g.mu.Unlock()
	<-closing
}

func (g *gate) log() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.calls)
}

// TestGate: a device is opened to a holder before its descriptors leave,
// and closed after its lease, before it is granted again: while it cannot
// be closed it is out of service, granted to nobody. A grant not
// delivered is closed too, and a device whose close fails waits out of
// service until its gate has closed it.
func TestGate(t *testing.T) {
	g := &gate{closing: make(chan struct{}), entered: make(chan int, 16)}
	awaitClose := func(what string) {
		t.Helper()
		select {
		case <-g.entered:
		case <-time.After(eventWait):
			t.Fatalf("no close %s: %v", what, g.log())
		}
	}
	o, _ := newTable(t, 1, g)
	_, ch := o.ask(t, 1, 1, "", nil, policy.Limit{})
	a := got(t, ch, "a")
	if calls := g.log(); !slices.Equal(calls, []string{"allow 1 [0]"}) {
		t.Errorf("gate calls before a's descriptors left: %v", calls)
	}
	_, chb := o.ask(t, 2, 1, "", nil, policy.Limit{})
	a.release()
	awaitEvent(t, o, "released")
	// Its close blocks: the device is out of service meanwhile.
	awaitClose("after a's lease")
	none(t, o, chb, "b while npu0 is not closed")
	if d := o.tbl.Snapshot().Devices[0]; d.State != Out {
		t.Errorf("npu0 while its gate cannot close it: state %d, want out", d.State)
	}
	close(g.closing)
	b := got(t, chb, "b once npu0 is closed")
	awaitEvent(t, o, "freed") // npu0's after a's lease, before b's grant
	calls := g.log()
	if i, j := slices.Index(calls, "close 0 false"), slices.Index(calls, "allow 2 [0]"); i < 0 || j < i {
		t.Errorf("b opened before npu0 was closed after a: %v", calls)
	}
	b.release()
	awaitClose("after b's lease")
	awaitEvent(t, o, "freed")

	// A grant whose client is gone is closed again, and a failed close
	// keeps the device out until Close has closed it.
	g.mu.Lock()
	g.calls, g.closing = nil, make(chan struct{})
	g.mu.Unlock()
	gone := true
	o.mu.Lock()
	o.refuse = func(h *Handover) bool {
		if gone {
			o.tbl.Allow(h) // opened, then its client is found gone
		}
		return gone
	}
	o.mu.Unlock()
	_, chc := o.ask(t, 3, 1, "", nil, policy.Limit{})
	o.mu.Lock()
	gone = false
	o.mu.Unlock()
	_, chd := o.ask(t, 4, 1, "", nil, policy.Limit{})
	awaitClose("of a grant not delivered, whose revoke failed")
	none(t, o, chc, "c, its client gone")
	none(t, o, chd, "d while npu0 is held out")
	if calls, want := g.log(), []string{"allow 3 [0]", "revoke 0", "close 0 true"}; !slices.Equal(calls, want) {
		t.Errorf("gate calls of a grant not delivered: %v, want %v", calls, want)
	}
	close(g.closing)
	got(t, chd, "d once npu0 is closed").release()
}

// TestAdmit: requests the devices, the pools or the limit refuse, with
// the reason's error.
func TestAdmit(t *testing.T) {
	o, _ := newTable(t, 4, nil, Pool{Name: "a", IDs: []int{0, 1}}, Pool{Name: "b", IDs: []int{2}})
	onlyA := policy.Limit{Pools: []string{"a"}, Source: "user u1"}
	for _, tc := range []struct {
		name string
		r    Request
		want error
		msg  string
	}{
		{"device named twice", Request{Devices: []int{1, 1}}, ErrBadRequest, "device named twice in [1 1]"},
		{"negative count", Request{N: -1}, ErrBadRequest, "bad device count -1"},
		{"no such device", Request{Devices: []int{9}}, ErrNoDevice, "no npu 9 here"},
		{"device in no pool", Request{Devices: []int{3}}, ErrDenied, "npu 3 is in no pool, so nobody may lease it"},
		{"device of a pool not open", Request{Devices: []int{2}, Limit: onlyA}, ErrDenied, `npu 2 is in pool "b", which user u1 does not open to u1`},
		{"no such pool", Request{Pool: "c"}, ErrNoPool, `no pool "c" here`},
		{"pool not open", Request{Pool: "b", Limit: onlyA}, ErrDenied, `pool "b" is not open to u1 (user u1)`},
		{"more than the pool has", Request{Pool: "a", N: 3}, ErrDenied, `3 devices asked, pool "a" has only 2`},
		{"over the cap", Request{N: 2, Limit: policy.Limit{MaxDevices: 1, Source: "user u1"}}, ErrDenied, "2 devices asked, the limit for u1 is 1 held at once (user u1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.r.Holder = Holder{UID: 1, User: "u1"}
			_, err := o.tbl.Admit(tc.r)
			var r *refusal.Refusal
			if !errors.Is(err, tc.want) || !errors.As(err, &r) || r.Msg != tc.msg {
				t.Errorf("%v, want %v: %q", err, tc.want, tc.msg)
			}
		})
	}
	w, err := o.tbl.Admit(Request{Holder: Holder{UID: 1, User: "u1"}, Devices: []int{1, 0}})
	if err != nil || !w.Exact || !slices.Equal(w.Cand, []int{0, 1}) || w.Pool != "a" || w.N != 2 {
		t.Errorf("exact request: %+v, %v", w, err)
	}
	if _, err := o.tbl.Admit(Request{Pool: "c"}); !strings.Contains(err.(*refusal.Refusal).Hint, "pools: a, b") {
		t.Errorf("no such pool: hint %q", err.(*refusal.Refusal).Hint)
	}
}

// TestLockOrder: owners serving their line under their own lock while the
// table's watchers report releases (taking the owner's lock), and status
// reading snapshots, all at once: run with -race, it shows the table's
// lock order (the owner's lock, then the table's; the table calls out
// holding none of its own) free of deadlock and races. Mutual exclusion is
// checked by the holders themselves: each marks every device it is
// granted with a file made O_EXCL, removed before it lets the lease go.
func TestLockOrder(t *testing.T) {
	const devices, holders, rounds = 3, 8, 25
	o, _ := newTable(t, devices, nil)
	marks := t.TempDir()
	stop := make(chan struct{})
	var readers sync.WaitGroup
	readers.Add(1)
	go func() { // status, meanwhile
		defer readers.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			snap := o.tbl.Snapshot()
			for _, d := range snap.Devices {
				if d.State == Leased && len(d.Leases) != 1 {
					t.Errorf("npu%d leased to %d leases at once", d.ID, len(d.Leases))
				}
			}
			o.tbl.Line(nil)
		}
	}()
	var wg sync.WaitGroup
	done := make(chan struct{})
	for h := range holders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ch := make(chan grant, 1)
			for r := range rounds {
				n := 1 + (h+r)%2
				if o.askTo(t, ch, uint32(1+h%3), n, "", nil, policy.Limit{}) == nil {
					return
				}
				var g grant
				select {
				case g = <-ch:
				case <-time.After(eventWait):
					t.Errorf("holder %d round %d: no grant", h, r)
					return
				}
				testfs.Mark(t, marks, fmt.Sprintf("holder %d", h), g.l.Devices)()
				g.release()
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(6 * eventWait):
		t.Fatal("holders still waiting: a deadlock, or a lost release")
	}
	close(stop)
	readers.Wait()
}

// TestClaim: devices an allocator outside the line picked (Slurm) are
// claimed as they are: a Slurm job's lease on free devices, counting
// against nobody's max_devices; a device still held is refused with the
// lease that holds it, and claimed once that lease has gone; a request
// of an external pool waits in line, served by nothing but a claim,
// reserving nothing meanwhile, and one naming devices of it is refused.
func TestClaim(t *testing.T) {
	o, _ := newTable(t, 3, nil, Pool{Name: "own", IDs: []int{0}}, Pool{Name: "slurm", IDs: []int{1, 2}, External: "Slurm"})
	job := &Waiter{Holder: Holder{Kind: Slurm, UID: 5, User: "u5", SlurmJob: 42}, N: 2}
	h, err := o.tbl.Claim(job, []int{2, 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.tbl.Allow(h); err != nil {
		t.Fatal(err)
	}
	l := o.tbl.Commit(h)
	jobFDs := h.FDs()
	if !slices.Equal(l.Devices, []int{2, 1}) || l.Kind != Slurm || l.SlurmJob != 42 || len(l.Files) != 2 {
		t.Errorf("job 42's lease: %+v", l)
	}
	if n := o.tbl.Held(5); n != 0 {
		t.Errorf("a Slurm job's lease counts %d devices against its user's max_devices", n)
	}
	for i, fd := range jobFDs {
		if fdFile(t, fd) != l.Files[i] || !slices.Equal(h.Files(), l.Files) {
			t.Errorf("descriptor %d is not on lease file %v", fd, l.Files[i])
		}
	}

	// Another job given npu 1 while job 42 holds it.
	_, err = o.tbl.Claim(&Waiter{Holder: Holder{Kind: Slurm, UID: 6, SlurmJob: 43}, N: 1}, []int{1})
	var busy *Busy
	if !errors.As(err, &busy) || !slices.Equal(busy.IDs, []int{1}) || len(busy.Leases) != 1 || busy.Leases[0] != l {
		t.Fatalf("claim of a held device: %v (%+v)", err, busy)
	}

	// A request of the external pool waits with npu 0 and, later, npu 1
	// free: the line serves it nothing, and keeps nothing for it.
	w, chw := o.ask(t, 7, 1, "slurm", nil, policy.Limit{})
	if w == nil || !w.External {
		t.Fatalf("a request of pool slurm is not external: %+v", w)
	}
	none(t, o, chw, "the external pool's request, with its pool's npu 1 and 2 held")
	for _, fd := range jobFDs {
		unix.Close(fd)
	}
	for free := 0; free < 2; {
		awaitEvent(t, o, "freed")
		free = 0
		for _, d := range o.tbl.Snapshot().Devices {
			if d.ID > 0 && d.State == Free {
				free++
			}
		}
	}
	none(t, o, chw, "the external pool's request, with npu 1 and 2 free")
	for _, d := range o.tbl.Snapshot().Devices {
		if d.State != Free {
			t.Errorf("npu %d is %v, not free, while only an external request waits", d.ID, d.State)
		}
	}
	w.SlurmJob = 44
	h, err = o.tbl.Claim(w, []int{2})
	if err != nil {
		t.Fatal(err)
	}
	if o.tbl.Len() != 0 {
		t.Error("the claimed request is still in line")
	}
	l2 := o.tbl.Commit(h)
	if l2.Kind != Inline || l2.SlurmJob != 44 || o.tbl.Held(7) != 1 {
		t.Errorf("the placeholder's lease: %+v, held %d", l2, o.tbl.Held(7))
	}
	for _, fd := range h.FDs() {
		unix.Close(fd)
	}

	_, err = o.tbl.Admit(Request{Holder: Holder{UID: 7, User: "u7"}, Devices: []int{1}})
	var r *refusal.Refusal
	if !errors.Is(err, ErrBadRequest) || !errors.As(err, &r) || r.Msg != `Slurm picks the devices of pool "slurm": ask for a count (-n), not for npu 1` {
		t.Errorf("a request naming an external pool's device: %v", err)
	}
	if _, err := o.tbl.Claim(job, []int{9}); !errors.Is(err, ErrNoDevice) {
		t.Errorf("claim of npu 9: %v", err)
	}
}

// TestExternal: the agent of an external pool's allocator is woken as its
// requests join and leave the line and sees them (Externals); a request
// that left the line before its devices were picked is not claimed for.
func TestExternal(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "locks")
	o := &owner{running: map[uint32]int{}, events: make(chan string, 1024)}
	wake := make(chan struct{}, 1)
	tbl, err := Open(Config{Dir: dir, IDs: ids(2), Pools: []Pool{{Name: "slurm", External: "Slurm"}}, DefaultPool: "slurm", Vendor: npu.Fake, Owner: o, External: wake})
	if err != nil {
		t.Fatal(err)
	}
	o.tbl = tbl
	tbl.Start(nil)
	t.Cleanup(func() { o.quiet(t) })
	woken := func() bool {
		select {
		case <-wake:
			return true
		default:
			return false
		}
	}
	a, _ := o.ask(t, 1, 1, "", nil, policy.Limit{})
	b, _ := o.ask(t, 2, 1, "", nil, policy.Limit{})
	if !woken() || !slices.Equal(tbl.Externals(nil), []*Waiter{a, b}) {
		t.Fatalf("two external requests in line: woken, Externals %v", tbl.Externals(nil))
	}
	if !tbl.Remove(a) || !woken() || !slices.Equal(tbl.Externals(nil), []*Waiter{b}) {
		t.Errorf("a left the line: Externals %v", tbl.Externals(nil))
	}
	if _, err := tbl.Claim(a, []int{0}); !errors.Is(err, ErrGone) {
		t.Errorf("claim for a request gone: %v", err)
	}
	h, err := tbl.Claim(b, []int{1})
	if err != nil || !woken() || len(tbl.Externals(nil)) != 0 {
		t.Fatalf("claim for b: %v, Externals %v", err, tbl.Externals(nil))
	}
	tbl.Return(h)
}
