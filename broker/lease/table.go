package lease

import (
	"fmt"
	"log"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/refusal"
	"github.com/npurun/npurun/internal/fileid"
	"github.com/npurun/npurun/internal/owndir"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
)

// Gate is who may open a device's nodes (the broker's: POSIX ACLs of
// restricted accounts). The table opens a lease's devices to its holder
// before the lease's descriptors leave (Allow, through Table.Allow), and
// closes a device after its lease has ended, before it can be granted
// again (Close); a device that cannot be closed is out of service, granted
// to nobody, until it is. The table never calls its gate holding its own
// lock.
type Gate interface {
	// Allow opens devices ids to uid. One quick try: its owner may call
	// it holding its own lock.
	Allow(uid uint32, ids []int) error
	// Revoke closes device id to the accounts whose lease of it has
	// ended, or that a grant not delivered opened it to, but for keep:
	// the users of the shares it holds still. One quick try, as Allow.
	Revoke(id int, keep []uint32) error
	// Close closes device id, however long that takes: it returns once
	// Revoke has succeeded (failed is why a try made already failed, nil
	// if none was made). The table calls it holding no lock, from the
	// device's own goroutine (a share's, for a device of shares).
	Close(id int, keep []uint32, failed error)
}

// Owner is the table's owner, told of what the table does on its own. The
// table calls it holding no lock of its own.
type Owner interface {
	// Released tells that device id of lease l was released at at: its
	// lock is gone, so is the holder's process tree. last tells that l
	// holds no other device. The device is closed (Gate.Close) and put on
	// a fresh lock file after Released returns.
	Released(l *Lease, id int, at time.Time, last bool)
	// Freed tells that a device came into service (a lease's end, a
	// device back from a failed close): the owner may serve its line.
	Freed()
}

// Pool is a named set of devices requests may ask for.
type Pool struct {
	Name string
	IDs  []int // nil: every device

	// External names the allocator that picks this pool's devices
	// ("Slurm"), "" for the line's own. A request of an external pool
	// waits in line, reserving nothing, until its allocator has picked
	// its devices and the owner Claims them for it; one naming devices
	// is refused.
	External string
}

// Config configures a Table.
type Config struct {
	Dir         string     // the lock files' directory: made, DirMode, if need be
	IDs         []int      // the devices, by physical id
	Pools       []Pool     // in the configuration's order
	DefaultPool string     // the pool of a request that names none
	Vendor      npu.Vendor // names devices in messages
	Gate        Gate       // nil: devices are open to everyone
	Owner       Owner      // nil: nobody is told
	Log         *log.Logger
	// Repeat logs a line that a lasting cause repeats (out of
	// descriptors, a full /run), at a bounded rate; nil: Log.
	Repeat func(format string, args ...any)
	// DrainFile is where the drained devices are kept across restarts
	// (drain.go): read by Open, written on each drain and undrain; ""
	// keeps them in memory only.
	DrainFile string
	// Capacity names the devices that may hold shares (share.go), with
	// the memory their shares may declare together, in MiB: the
	// device's capacity less the margin kept free.
	Capacity map[int]int64
	// Unknown names the devices the configuration shares whose memory is
	// not known yet (the vendor's tool failed at start), with why: they
	// take no share, and a share request they could serve waits, until
	// SetCapacity; a whole lease they take as any device.
	Unknown map[int]string
	// Ask, if not nil, is woken (a send that never waits) when a share
	// request joins the line that a device of Unknown could serve: its
	// owner asks the vendor's tool again.
	Ask chan<- struct{}
	// External, if not nil, is woken (a send that never waits) when a
	// request of an external pool joins or leaves the line: its
	// allocator's agent looks at Externals.
	External chan<- struct{}
}

// Table is the lease table.
//
// Lock order: the owner's lock, then the table's. The owner may call any
// method holding its own lock (it serves its line from under it); the
// table never takes the owner's lock, and calls its owner and its gate
// holding none of its own (from its watchers, and from Return's retries,
// on goroutines of their own). So the two locks are only ever held in that
// order (TestLockOrder).
type Table struct {
	// Set by Open, never changed.
	vendor    npu.Vendor
	gate      Gate
	owner     Owner
	log       *log.Logger
	repeat    func(format string, args ...any)
	ids       []int
	drainFile string
	dir       string
	sharing   bool // some device may hold shares (or may once its memory is known)
	ask       chan<- struct{}

	// pc is the pools, read without a lock (Admit, PoolName, PoolOf) and
	// replaced, never changed, by Reconfigure under mu.
	pc atomic.Pointer[poolSet]

	drainMu sync.Mutex // orders the drain file's writes; before mu, never held by a caller of the table

	mu     sync.Mutex
	devs   []*device      // by physical id; nil where not managed
	nfree  int            // devices free now
	held   map[uint32]int // devices held per uid, of the leases that count (Adopt)
	q      *Queue         // the line: requests of every holder kind
	lastID uint64         // the last lease id handed out or noted
	found  map[int]int    // devices held at Open, until Start: a descriptor of their lock file
	ext    []*Waiter      // the external pools' requests in line, in arrival order
	wake   chan<- struct{}

	// Lock files whose lease Abandon ended, waited on until the last
	// descriptor of theirs is gone (abandon.go): how many, in all and
	// per user.
	stale     int
	staleUser map[uint32]int
	staleFDs  atomic.Int64 // stale, read without the lock (Stale)

	// backfill is the policy's [scheduling] backfill (SetBackfill).
	backfill atomic.Bool
}

// SetBackfill turns backfilling (Room.Backfill) on or off: the policy's
// [scheduling] backfill, at start and at each reload; from the next
// Schedule on.
func (t *Table) SetBackfill(on bool) { t.backfill.Store(on) }

// device is one accelerator: its lock file and who holds it: one whole
// lease on that file, or, on a device that may be shared, shares, each on
// a lock file of its own (share.go), while the device's own file stays
// the table's.
type device struct {
	id    int
	path  string
	fd    int       // the lock file, locked, while free; -1 otherwise (in a handover, it is the handover's)
	spare int       // a second open of the current lock file, for the watcher, until a lease begins; -1 if none
	file  fileid.ID // the current lock file

	leases   []*Lease  // the leases held on it
	counted  bool      // its lease counts against its holder's devices (held)
	granting *Handover // the handover it is in, if any
	drain    *Drain    // drained: granted to nobody until undrained (drain.go)
	freed    time.Time // when its last lease ended; zero while leased, and once granted again

	watch   chan *ending // the leases for the watcher to wait on, one at a time
	waiting *ending      // the lease it waits on now, until it has seen its lock go (Ending)
	ending  []*ending    // the leases (whole, or shares) whose lock is gone, until the device is in service again

	// abandoned is the lock file of the lease Abandon ended (its holders
	// gone, its lock held by a descriptor no process has), poke wakes the
	// watcher to look at it (abandon.go).
	abandoned fileid.ID
	poke      chan struct{}

	// ended is the lock file whose release the watcher has seen, from the
	// moment flock returns (before the table records the end); nil while
	// it waits on a lease.
	ended atomic.Pointer[fileid.ID]

	// Shares (share.go): capacity is what shares may declare on it
	// together, in MiB (0: not shared); external what processes outside
	// any lease use there; closing counts the ended shares whose gate
	// is closing the device meanwhile (no new share until it has).
	capacity int64
	unknown  string // shared by the configuration, its memory not known yet: why (capacity is 0 meanwhile)
	shares   []*share
	external int64
	closing  int
}

// free tells whether d can be granted now.
func (d *device) free() bool {
	return d.fd >= 0 && d.granting == nil && d.drain == nil && len(d.shares) == 0 && d.closing == 0
}

// Open opens the lock table: the lock directory, and each device's lock
// file, tried without blocking. A device whose lock is taken is held by a
// lease from before this start: Found names those, for the owner to Adopt
// what it knows of them. Nothing is in service until Start.
func Open(c Config) (*Table, error) {
	t := &Table{vendor: c.Vendor, gate: c.Gate, owner: c.Owner, log: c.Log, repeat: c.Repeat,
		ids: slices.Clone(c.IDs), drainFile: c.DrainFile, dir: c.Dir, held: map[uint32]int{}, q: NewQueue(), found: map[int]int{}, wake: c.External, ask: c.Ask, staleUser: map[uint32]int{}}
	if t.log == nil {
		t.log = log.New(discard{}, "", 0)
	}
	if t.repeat == nil {
		t.repeat = t.log.Printf
	}
	if t.owner == nil {
		t.owner = noOwner{}
	}
	pc, err := newPoolSet(t.ids, c.Pools, c.DefaultPool)
	if err != nil {
		return nil, err
	}
	t.pc.Store(pc)
	if err := owndir.Make(c.Dir, DirMode); err != nil {
		return nil, err
	}
	maxID := 0
	for _, id := range t.ids {
		maxID = max(maxID, id)
	}
	t.devs = make([]*device, maxID+1)
	for _, id := range t.ids {
		d := &device{id: id, path: LockPath(c.Dir, id), fd: -1, spare: -1, watch: make(chan *ending, 1), poke: make(chan struct{}, 1), capacity: c.Capacity[id], unknown: c.Unknown[id]}
		t.sharing = t.sharing || d.capacity > 0 || d.unknown != ""
		fd, isFree, err := tryLock(d.path)
		if err != nil {
			t.closeAll()
			return nil, err
		}
		t.devs[id] = d
		if isFree {
			d.fd = fd // the old file: Start puts the device on a fresh one
			continue
		}
		t.log.Printf("npu %d is held by a lease from before this start; waiting for its release", id)
		t.found[id] = fd
		if d.file, err = fileid.Of(fd); err != nil {
			t.log.Printf("npu %d: lock file: %v; its holders will not be found", id, err)
		}
	}
	if err := t.findShares(c.Dir); err != nil {
		t.closeAll()
		return nil, err
	}
	drains, err := t.readDrains(c.DrainFile)
	if err != nil {
		t.closeAll()
		return nil, err
	}
	for id, d := range drains {
		t.devs[id].drain = &d
		t.log.Printf("npu %d is drained (by %s since %s: %s): no lease is granted on it until npubroker undrain", id, d.By, d.Since.Format(time.DateTime), d.Reason)
	}
	for _, id := range t.ids {
		go t.watch(t.devs[id])
		for _, s := range t.devs[id].shares {
			go t.watchShare(t.devs[id], s)
		}
	}
	return t, nil
}

// closeAll closes what Open opened, for an Open that fails.
func (t *Table) closeAll() {
	for _, d := range t.devs {
		if d != nil {
			closeFD(d.fd)
		}
	}
	for _, fd := range t.found {
		closeFD(fd)
	}
	for _, d := range t.devs {
		if d != nil {
			for _, s := range d.shares {
				closeFD(s.spare)
			}
		}
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

type noOwner struct{}

func (noOwner) Released(*Lease, int, time.Time, bool) {}
func (noOwner) Freed()                                {}

// Found returns the devices found held at Open, with their lock files.
func (t *Table) Found() map[int]fileid.ID {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[int]fileid.ID, len(t.found))
	for id := range t.found {
		out[id] = t.devs[id].file
	}
	return out
}

// Adopt takes up a lease held since before this start, as the owner's
// records (or a look at who holds its lock files) tell it: l's devices
// must be among those Found, its files theirs. It counts against its
// holder's devices where it has a holder (Holder.User), and is released
// through the watchers as any other. A lease of a holder the broker did
// not start comes in this way; one of a holder it asks for later (a Slurm
// job) comes through the line, as any request that names its devices.
func (t *Table) Adopt(l *Lease) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range l.Devices {
		if _, ok := t.found[id]; !ok || len(t.devs[id].leases) > 0 {
			return fmt.Errorf("adopt lease %d: npu %d was not found held, or is adopted already", l.ID, id)
		}
	}
	for _, id := range l.Devices {
		d := t.devs[id]
		d.leases = []*Lease{l}
		if l.User != "" && counts(l.Kind) {
			d.counted = true
			t.held[l.UID]++
		}
	}
	t.lastID = max(t.lastID, l.ID)
	return nil
}

// NoteID notes a lease id of the owner's records: ids handed out from now
// on are above it.
func (t *Table) NoteID(id uint64) {
	t.mu.Lock()
	t.lastID = max(t.lastID, id)
	t.mu.Unlock()
}

// NewID returns an id no lease had: microseconds since the epoch, or one
// more than the last id.
func (t *Table) NewID() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.newIDLocked(time.Now())
}

func (t *Table) newIDLocked(now time.Time) uint64 {
	t.lastID = max(uint64(now.UnixMicro()), t.lastID+1)
	return t.lastID
}

// Start puts the devices in service: a free one on a fresh lock file (no
// descriptor of a lease from before this start reaches it), once its gate
// has closed it (closed: the free devices whose gate failed at start, with
// why: they wait for Gate.Close); a held one is watched until its release.
// The owner is not told of the devices Start itself puts in service.
func (t *Table) Start(closed map[int]error) {
	t.mu.Lock()
	found := t.found
	t.found = nil
	old := make(map[int]int, len(t.ids)) // the free devices' lock files from before this start
	for _, id := range t.ids {
		if d := t.devs[id]; d.fd >= 0 {
			old[id], d.fd = d.fd, -1 // not free until it is on a fresh file
		}
	}
	t.mu.Unlock()
	for _, id := range t.ids {
		d := t.devs[id]
		if fd, ok := found[id]; ok {
			e := newEnding(fd)
			t.mu.Lock()
			d.waiting = e
			t.mu.Unlock()
			d.watch <- e
			continue
		}
		old := old[id]
		if err := closed[id]; err != nil && t.gate != nil {
			go func() {
				t.gate.Close(id, nil, err)
				t.renew(d, old, nil)
			}()
			continue
		}
		if err := t.renewOnce(d, old, nil, false); err != nil {
			t.repeat("npu %d: %v; out of service until a fresh lock file can be made", id, err)
			go t.renew(d, old, nil)
		}
	}
}

// watch is device d's watcher, for the table's lifetime: given a second
// open of d's lock file while a lease holds it, it makes the fresh lock
// file for the next lease, then waits in flock until the lease's process
// tree is gone; then the lease is over, and d is free once its gate has
// closed it and the fresh file is in place.
func (t *Table) watch(d *device) {
	for e := range d.watch {
		fd := e.fd
		d.ended.Store(nil)
		// The next lease's lock file is made while this one runs, not
		// after: a lease's end, when waiters are many and descriptors
		// may be short, then needs no new descriptor.
		ahead := t.prepareAhead(d)
		file, ferr := fileid.Of(fd)
		stale, err := t.waitRelease(fd, d.poke, func() bool {
			t.mu.Lock()
			defer t.mu.Unlock()
			return ferr == nil && d.abandoned == file
		})
		releaseSeen(d.id)
		if err != nil {
			// Nothing else can be done with this device; keep it out of
			// use rather than risk a double grant.
			t.log.Printf("npu %d: wait for release: %v; device taken out of service", d.id, err)
			t.mu.Lock()
			d.waiting = nil // fd is closed now: Ending must not try it
			t.mu.Unlock()
			unix.Close(fd)
			if next := ahead(); next != nil {
				next.discard()
			}
			close(e.over) // d is out of service
			continue
		}
		if ferr == nil {
			d.ended.Store(&file)
		}
		next := ahead()
		now := time.Now()
		ended, last := t.releasedLocked(d, now)
		if stale != nil {
			var l *Lease
			if len(ended) > 0 {
				l = ended[0]
			}
			t.outlive(d, l, fd, stale)
			fd = -1
		}
		for i, l := range ended {
			t.owner.Released(l, d.id, now, last[i])
		}
		if t.gate != nil {
			t.gate.Close(d.id, nil, nil) // before the device can be granted again; fail closed: granted to nobody meanwhile
		}
		t.renew(d, fd, next)
		t.over(d, e) // d is in service again (renew told the owner: Freed)
	}
}

// releasedLocked ends d's leases at now, taking the table's lock: it
// returns them, and for each whether it holds no other device now.
func (t *Table) releasedLocked(d *device, now time.Time) ([]*Lease, []bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ended := d.leases
	d.leases, d.freed = nil, now
	t.seen(d, &d.waiting)
	if d.counted && len(ended) > 0 {
		uid := ended[0].UID
		if t.held[uid]--; t.held[uid] <= 0 {
			delete(t.held, uid)
		}
	}
	d.counted = false
	last := make([]bool, len(ended))
	for i, l := range ended {
		last[i] = true
		for _, id := range l.Devices {
			if o := t.devs[id]; o != nil && slices.Contains(o.leases, l) {
				last[i] = false
			}
		}
	}
	return ended, last
}

// prepareAhead makes device d's next lock file while its lease runs,
// trying again at growing intervals while it cannot (out of descriptors,
// a full /run). The function it returns, called once the lease has ended,
// stops the tries and gives the file made, or nil.
func (t *Table) prepareAhead(d *device) func() *freshLock {
	next, err := prepareLock(d.path)
	if err == nil {
		return func() *freshLock { return next }
	}
	t.repeat("npu %d: %v; trying again while its lease runs", d.id, err)
	stop, made := make(chan struct{}), make(chan *freshLock, 1)
	go func() {
		for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
			select {
			case <-stop:
				made <- nil
				return
			case <-time.After(wait):
			}
			if next, err := prepareLock(d.path); err == nil {
				made <- next
				return
			}
		}
	}()
	return func() *freshLock {
		select {
		case next := <-made:
			return next
		default:
		}
		close(stop)
		return <-made
	}
}

// renew makes d free on a fresh lock file, next if it was made already;
// old is the lock of the lease that ended, closed once the new file is in
// place. While no fresh file can be made (out of descriptors, a full /run)
// d stays out of service: handing out the old file again would let an
// earlier lease's descriptor take it.
func (t *Table) renew(d *device, old int, next *freshLock) {
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		err := t.renewOnce(d, old, next, true)
		if err == nil {
			return
		}
		next = nil
		t.repeat("npu %d: %v; out of service until a fresh lock file can be made", d.id, err)
		time.Sleep(wait)
	}
}

// renewOnce tries once to make d free on a fresh lock file, and tells the
// owner if tell.
func (t *Table) renewOnce(d *device, old int, next *freshLock, tell bool) error {
	if next == nil {
		var err error
		if next, err = prepareLock(d.path); err != nil {
			return err
		}
	}
	if err := next.place(d.path); err != nil {
		next.discard()
		return err
	}
	closeFD(old)
	t.mu.Lock()
	d.fd, d.spare, d.file = next.locked, next.spare, next.file
	t.nfree++
	t.mu.Unlock()
	if tell {
		t.owner.Freed()
	}
	return nil
}

// Ended tells whether device id's watcher has seen the release of the
// lease on lock file file (from the moment its flock returns, before the
// table has recorded the end).
func (t *Table) Ended(id int, file fileid.ID) bool {
	if id < 0 || id >= len(t.devs) || t.devs[id] == nil {
		return false
	}
	d := t.devs[id]
	if e := d.ended.Load(); e != nil && *e == file {
		return true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range d.shares {
		if s.file == file {
			return s.ended.Load()
		}
	}
	return false
}

// The line.

// Add puts w at the end of its user's turn in the line (Queue.Add).
func (t *Table) Add(w *Waiter) {
	t.mu.Lock()
	t.q.Add(w)
	t.joinedLocked(w)
	t.mu.Unlock()
}

// Readd puts back a waiter that left the line for its grant, in the place
// it had (Queue.Readd): a task whose start could not be made.
func (t *Table) Readd(w *Waiter) {
	t.mu.Lock()
	t.q.Readd(w)
	t.joinedLocked(w)
	t.mu.Unlock()
}

// Remove takes w out of the line (cancelled, refused, gone), and tells
// whether it was there.
func (t *Table) Remove(w *Waiter) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.removeLocked(w, false)
}

// removeLocked takes w out of the line (Queue.Remove).
func (t *Table) removeLocked(w *Waiter, served bool) bool {
	if !t.q.Remove(w, served) {
		return false
	}
	if w.External {
		if i := slices.Index(t.ext, w); i >= 0 {
			t.ext = slices.Delete(t.ext, i, i+1)
		}
		t.wakeExternal()
	}
	return true
}

// joinedLocked notes that w joined the line.
func (t *Table) joinedLocked(w *Waiter) {
	if w.External {
		t.ext = append(t.ext, w)
		t.wakeExternal()
	}
}

func (t *Table) wakeExternal() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// Externals appends to out the requests of external pools in line and
// not held (Hold), in arrival order.
func (t *Table) Externals(out []*Waiter) []*Waiter {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, w := range t.ext {
		if !w.Held {
			out = append(out, w)
		}
	}
	return out
}

// Hold holds w in its place (it is skipped, reserving nothing) or lets it
// be served again. An external request held leaves Externals: its
// allocator outside lets go of what it asked for it there.
func (t *Table) Hold(w *Waiter, held bool) {
	t.mu.Lock()
	changed := w.Held != held
	w.Held = held
	if changed && w.External && slices.Contains(t.ext, w) {
		t.wakeExternal()
	}
	t.mu.Unlock()
}

// Len is how many wait.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.q.Len()
}

// Tasks is how many tasks wait in pool.
func (t *Table) Tasks(pool string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.q.Tasks(pool)
}

// FirstTasks appends to out the first task waiting unheld in each pool, in
// line order, walking the line only until each pool with a task has given
// one.
func (t *Table) FirstTasks(out []*Waiter) []*Waiter {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.q.FirstTasks(out)
}

// Held is how many devices uid holds, of the leases that count.
func (t *Table) Held(uid uint32) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.held[uid]
}

// RoomFor is what the limits of q's users leave them, with the devices
// they hold here and running, the owner's count of their running tasks:
// for the owner's own queue (the CPU slots of tasks that need no device),
// which Plan serves with this room as the table's line is served.
func (t *Table) RoomFor(q *Queue, running map[uint32]int) Room {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.roomLocked(q, running)
}

// roomLocked is what Plan needs of the limits: per user, how many more
// devices they may hold, or (for a task) how many more tasks they may run.
func (t *Table) roomLocked(q *Queue, running map[uint32]int) Room {
	var room Room
	q.Limits(func(uid uint32, lim policy.Limit) {
		if lim.MaxDevices > 0 {
			if room.Devices == nil {
				room.Devices = map[uint32]int{}
			}
			room.Devices[uid] = lim.MaxDevices - t.held[uid]
		}
		if lim.MaxRunning > 0 {
			if room.Tasks == nil {
				room.Tasks = map[uint32]int{}
			}
			room.Tasks[uid] = lim.MaxRunning - running[uid]
		}
	})
	room.Drained = t.drainedLocked()
	return room
}

// MaxAhead is how many users ahead a Place names.
const MaxAhead = 3

// Place is a waiter's place in the line.
type Place struct {
	W     *Waiter
	Pos   int      // in its pool's line: 1 is next
	Ahead []string // the users of the waiters ahead of it in its pool, MaxAhead at most, first come first
	Why   string   // why it waits beyond its turn, if it does (its user's cap)
	// Start is when it starts at the latest, by the limits of the leases
	// it waits for and of the requests ahead of it (Estimate); zero where
	// that is unknown: one of them has no limit, or it waits beyond its
	// turn.
	Start time.Time
}

// Line appends the line, in service order, to out.
func (t *Table) Line(out []Place) []Place {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lineLocked(out)
}

func (t *Table) lineLocked(out []Place) []Place {
	type standing struct {
		pos   int
		ahead []string
	}
	type capKey struct {
		uid    uint32
		user   string
		max    int
		source string
	}
	st := map[string]*standing{}
	var why map[capKey]string // a user's reason, said once however many of their requests wait
	starts := t.estimatesLocked(time.Now(), -1)
	for i, w := range t.q.Waiters() {
		p := st[w.Pool]
		if p == nil {
			p = &standing{}
			st[w.Pool] = p
		}
		p.pos++
		pl := Place{W: w, Pos: p.pos}
		if starts[i] != never {
			pl.Start = time.Unix(0, starts[i])
		}
		if r := t.drainedReasonLocked(w); r != "" {
			pl.Why = r
		} else if r := t.unknownReasonLocked(w); r != "" {
			pl.Why = r
		} else if t.capped(w) {
			lim := t.limitLocked(w)
			k := capKey{w.UID, w.User, lim.MaxDevices, lim.Source}
			r, ok := why[k]
			if !ok {
				if why == nil {
					why = map[capKey]string{}
				}
				r = t.reasonLocked(w)
				why[k] = r
			}
			pl.Why = r
		}
		if p.pos > 1 {
			pl.Ahead = p.ahead
		}
		out = append(out, pl)
		if len(p.ahead) < MaxAhead && !slices.Contains(p.ahead, w.User) {
			p.ahead = append(p.ahead, w.User)
		}
	}
	return out
}

// Reason says why w waits beyond its turn, if it does.
func (t *Table) Reason(w *Waiter) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reasonLocked(w)
}

func (t *Table) reasonLocked(w *Waiter) string {
	if r := t.drainedReasonLocked(w); r != "" {
		return r
	}
	if r := t.unknownReasonLocked(w); r != "" {
		return r
	}
	if t.capped(w) {
		lim := t.limitLocked(w)
		return fmt.Sprintf("%s holds %d of %s allowed (%s)", w.User, t.held[w.UID], quantity.Count(lim.MaxDevices, "device", "devices"), lim.Source)
	}
	return ""
}

// capped tells whether w's user holds too many devices for w now.
func (t *Table) capped(w *Waiter) bool {
	lim := t.limitLocked(w)
	return lim.MaxDevices > 0 && t.held[w.UID]+w.N > lim.MaxDevices
}

// Position is w's place in its pool's line; 0 if it is not in line.
func (t *Table) Position(w *Waiter) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	pos := 0
	for _, o := range t.q.Waiters() {
		if o.Pool == w.Pool {
			pos++
		}
		if o == w {
			return pos
		}
	}
	return 0
}

// Positions sets, for each waiter of want, its place in its pool's line
// (0: not in line), walking the line only as far as the last of them
// (Queue.Positions).
func (t *Table) Positions(want map[*Waiter]int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.q.Positions(want)
}

// Handover is a waiter served, whose devices are being handed over: they
// are neither free nor leased until the owner, having delivered them,
// commits the handover (the lease begins), or returns it (they are free
// again). Plan is under the table's lock; the delivery (a socket, a
// journal) is not.
type Handover struct {
	W       *Waiter
	Devices []int

	// Backfill: it was backfilled (Room.Backfill), ahead of a request
	// that reserved some of its devices; nil otherwise.
	Backfill *Backfilled

	fds    []int       // the lock files' locked descriptors, in the order of Devices
	files  []fileid.ID // those files
	freed  []time.Time // when each device's last lease ended
	opened bool        // the gate was asked to open the devices
	done   bool
	shares []*share // a share's handover (W.Mem > 0): its share of each device
}

// Mem is what a share's handover declared on each device, in MiB; 0 for
// a whole lease.
func (h *Handover) Mem() int64 { return h.W.Mem }

// Files are the lock files of FDs, in the order of Devices.
func (h *Handover) Files() []fileid.ID { return h.files }

// FDs are the locked descriptors to deliver, in the order of Devices:
// the table's until Commit, the owner's after it (it closes them once
// they are delivered: a holder that has them holds the lease).
func (h *Handover) FDs() []int { return h.fds }

// Freed is when device Devices[i]'s last lease ended; zero if unknown.
func (h *Handover) Freed(i int) time.Time { return h.freed[i] }

// Schedule serves the line as far as it can now: it takes the waiters
// Plan serves out of it, their devices out of the free ones, and returns
// their handovers, for the owner to deliver, then Commit or Return each.
// running is the owner's count of each user's running tasks (their
// max_running).
func (t *Table) Schedule(running map[uint32]int) []*Handover {
	hs := t.scheduleLocked(running)
	// A share's lock file is made for it now, holding no lock.
	out := hs[:0]
	for _, h := range hs {
		if h.shares == nil {
			out = append(out, h)
			continue
		}
		if err := t.makeShareFiles(h); err != nil {
			t.repeat("%v; the request waits", err)
			t.dropShares(h)
			t.Readd(h.W)
			continue
		}
		out = append(out, h)
	}
	return out
}

func (t *Table) scheduleLocked(running map[uint32]int) []*Handover {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.nfree == 0 && !t.sharing || t.q.Len() == 0 {
		return nil
	}
	free := make([]bool, len(t.devs))
	for id, d := range t.devs {
		free[id] = d != nil && d.free()
	}
	room := t.roomLocked(t.q, running)
	if t.sharing {
		room.Share = make([]int64, len(t.devs))
		for id, d := range t.devs {
			room.Share[id] = -1
			if d != nil {
				room.Share[id] = d.shareRoom()
			}
		}
	}
	if t.backfill.Load() {
		now := time.Now()
		room.Backfill, room.Now, room.FreeAt = true, now.UnixNano(), t.freeTimesLocked(now)
	}
	order := t.q.Waiters()
	grants := Plan(order, free, room)
	if len(grants) == 0 {
		return nil
	}
	if t.sharing {
		countPassed(order, grants)
	}
	hs := make([]*Handover, len(grants))
	for i, g := range grants {
		t.removeLocked(g.W, true)
		h := &Handover{W: g.W, Devices: g.Devices, fds: make([]int, len(g.Devices)),
			files: make([]fileid.ID, len(g.Devices)), freed: make([]time.Time, len(g.Devices))}
		if g.Before != nil {
			h.Backfill = &Backfilled{EndsBy: time.Unix(0, room.Now).Add(g.W.Holder.Limit), Before: g.Before.Holder, BeforeAt: time.Unix(0, g.BeforeAt), Beside: g.Beside}
		}
		if g.W.Mem > 0 {
			h.shares = make([]*share, len(g.Devices))
			for j, id := range g.Devices {
				d := t.devs[id]
				k := d.freeSlot()
				s := &share{h: h, uid: g.W.UID, slot: k, mem: g.W.Mem, path: SharePath(t.dir, id, k), fd: -1, spare: -1, poke: make(chan struct{}, 1)}
				d.shares = append(d.shares, s)
				h.shares[j], h.fds[j], h.freed[j] = s, -1, d.freed
			}
			hs[i] = h
			continue
		}
		for j, id := range g.Devices {
			d := t.devs[id]
			h.fds[j], h.files[j], h.freed[j] = d.fd, d.file, d.freed
			d.fd, d.granting = -1, h
			t.nfree--
		}
		hs[i] = h
	}
	return hs
}

// countPassed adds to each share in order that grants pass over (one
// not served ahead of a served one) how many of them it lets pass: its
// patience (SharePatience). It walks order only as far as the last
// served.
func countPassed(order []*Waiter, grants []Grant) {
	served := make(map[*Waiter]bool, len(grants))
	for _, g := range grants {
		served[g.W] = true
	}
	behind := len(grants) // the served behind order[i]
	for _, w := range order {
		if behind == 0 {
			return
		}
		if served[w] {
			behind--
		} else if w.Mem > 0 {
			w.passed += behind
		}
	}
}

// Busy is Claim's refusal of devices that are not free now. Leases hold
// some of them (their holders may be ended, and the device then comes
// free); the others are being handed over, or out of service for a
// moment: the owner hears of each device that comes free (Owner.Freed).
type Busy struct {
	IDs    []int    // the devices not free, in the order asked
	Leases []*Lease // the leases that hold some of them, each once
}

func (b *Busy) Error() string {
	return fmt.Sprintf("npu %s not free", npu.FormatIDs(b.IDs))
}

// Claim serves w with exactly devices ids, outside the order of the
// line: an allocator outside the table (Slurm) has picked them for w,
// which waits in line (an external pool's request) or is a holder that
// never waited (a Slurm job, whose Prolog names its devices). The
// devices must be free now: else a *Busy says which are not, and who
// holds them. w leaves the line if it is there (ErrGone: a request of an
// external pool that left it meanwhile); the handover is the owner's to
// deliver, then Commit or Return, as Schedule's.
func (t *Table) Claim(w *Waiter, ids []int) (*Handover, error) {
	if len(ids) == 0 || len(ids) > MaxDevices {
		return nil, refusal.New(ErrBadRequest, "", "claim of %d devices", len(ids))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var busy *Busy
	for i, id := range ids {
		if id < 0 || id >= len(t.devs) || t.devs[id] == nil {
			return nil, refusal.New(ErrNoDevice, "this broker manages "+t.vendor.Format(t.ids), "no %s here", t.vendor.Format([]int{id}))
		}
		if slices.Contains(ids[:i], id) {
			return nil, refusal.New(ErrBadRequest, "", "device named twice in %v", ids)
		}
		d := t.devs[id]
		if d.free() {
			continue
		}
		if busy == nil {
			busy = &Busy{}
		}
		busy.IDs = append(busy.IDs, id)
		for _, l := range d.leases {
			if !slices.Contains(busy.Leases, l) {
				busy.Leases = append(busy.Leases, l)
			}
		}
	}
	if busy != nil {
		return nil, busy
	}
	if !t.removeLocked(w, true) && w.External {
		return nil, ErrGone
	}
	h := &Handover{W: w, Devices: slices.Clone(ids), fds: make([]int, len(ids)),
		files: make([]fileid.ID, len(ids)), freed: make([]time.Time, len(ids))}
	for j, id := range ids {
		d := t.devs[id]
		h.fds[j], h.files[j], h.freed[j] = d.fd, d.file, d.freed
		d.fd, d.granting = -1, h
		t.nfree--
	}
	return h, nil
}

// Allow opens h's devices to its holder (Gate.Allow), before their
// descriptors leave: call it before delivering them.
func (t *Table) Allow(h *Handover) error {
	if t.gate == nil {
		return nil
	}
	h.opened = true // a failure may have opened some: Return closes them
	return t.gate.Allow(h.W.UID, h.Devices)
}

// Commit begins the lease of a handover delivered: its devices are its
// holder's until the watchers see their locks go. It returns the lease's
// record.
func (t *Table) Commit(h *Handover) *Lease {
	if h.done {
		panic("lease: handover committed or returned twice")
	}
	h.done = true
	now := time.Now()
	l := &Lease{Holder: h.W.Holder, Pool: h.W.Pool, Devices: slices.Clone(h.Devices), Files: h.files, Since: now, Mem: h.W.Mem}
	if h.Backfill != nil {
		b := *h.Backfill
		b.EndsBy = now.Add(l.Limit)
		l.Backfill = &b
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	l.ID = t.newIDLocked(now)
	counted := counts(l.Kind)
	if h.shares != nil {
		if c := t.devs[h.Devices[0]].capacity; c > 0 {
			l.Share = min(float64(l.Mem)/float64(c), 1)
		}
		for i, id := range h.Devices {
			d, s := t.devs[id], h.shares[i]
			s.lease, s.h, s.fd = l, nil, -1 // the owner closes the locked descriptor once delivered
			s.waiting = newEnding(s.spare)
			d.leases = append(d.leases, l)
			d.freed = time.Time{}
			go t.watchShare(d, s)
		}
		if counted {
			t.held[l.UID] += len(h.Devices)
		}
		return l
	}
	for _, id := range h.Devices {
		d := t.devs[id]
		d.granting = nil
		d.leases = []*Lease{l}
		d.counted = counted
		d.freed = time.Time{}
		e := newEnding(d.spare)
		d.waiting = e
		select {
		case d.watch <- e: // its watcher is idle: the device was free
		default:
			// Its watcher waits on a lease: this device is granted twice.
			// Crash rather than wait (a broker's crash releases nothing,
			// and its restart grants nothing that is held).
			panic(fmt.Sprintf("lease: npu %d granted while its watcher waits on a lease", id))
		}
		d.spare = -1
	}
	if counted {
		t.held[l.UID] += len(h.Devices)
	}
	return l
}

// counts tells whether a lease of kind counts against its holder's
// devices (max_devices): a Slurm job's does not.
func counts(k Kind) bool { return k != Slurm }

// Return gives back a handover that could not be delivered (its client
// gone, its task not started): its devices are free again, its waiter out
// of line (the owner may Readd it). A device the gate opened is closed
// first, and one that cannot be closed now stays out of service until
// Gate.Close has closed it.
func (t *Table) Return(h *Handover) {
	if h.done {
		panic("lease: handover committed or returned twice")
	}
	h.done = true
	if h.shares != nil {
		t.returnShares(h)
		return
	}
	var failed map[int]error
	if h.opened {
		for _, id := range h.Devices {
			if err := t.gate.Revoke(id, nil); err != nil {
				if failed == nil {
					failed = map[int]error{}
				}
				failed[id] = err
			}
		}
	}
	t.mu.Lock()
	for i, id := range h.Devices {
		d := t.devs[id]
		d.granting = nil
		if failed[id] == nil {
			d.fd = h.fds[i]
			t.nfree++
		}
	}
	t.mu.Unlock()
	for i, id := range h.Devices {
		if err := failed[id]; err != nil {
			go t.holdOut(t.devs[id], h.fds[i], err)
		}
	}
}

// holdOut keeps free device d out of service while its gate closes it (a
// grant that was not delivered opened it; closing failed with err): its
// lock file, locked at fd and never handed out, serves again once it is.
func (t *Table) holdOut(d *device, fd int, err error) {
	t.gate.Close(d.id, nil, err)
	t.mu.Lock()
	d.fd = fd
	t.nfree++
	t.mu.Unlock()
	t.owner.Freed()
}

// State is a device's state as a Snapshot shows it.
type State int

// The states of a device.
const (
	Out      State = iota // out of service: neither free nor leased (its gate cannot close it, no fresh lock file, held from before with no lease known)
	Free                  // free and kept for nobody
	Reserved              // free, kept for the waiter For (see Snapshot)
	Granting              // being handed over to For
	Leased                // held by Leases
	Drained               // drained and held by no lease (see Device.Drain)
)

// Device is a device as a Snapshot shows it.
type Device struct {
	ID     int
	Pool   string
	State  State
	Leases []*Lease  // held on it: one whole lease today
	For    *Waiter   // Reserved, Granting: the waiter it is kept for, or handed to
	Freed  time.Time // when its last lease ended; zero if it has not since its grant
	File   fileid.ID // its current lock file
	Drain  *Drain    // drained: why, by whom, since when (in any State: a lease that held it when it was drained runs on)

	// Capacity is what shares may declare on it together, in MiB (its
	// memory less the margin); 0: it is not shared. Declared is what its
	// shares declared, External what processes outside any lease use.
	Capacity, Declared, External int64
	// Unknown: the configuration shares it, and its memory is not known
	// yet (Config.Unknown): why. Capacity is 0 meanwhile.
	Unknown string
}

// Snapshot is a copy of the table for status: the devices in id order and
// the line in service order. Its Leases and Waiters are shared, not
// copied: a Lease never changes, and of a Waiter only Held does, which a
// snapshot does not show.
type Snapshot struct {
	Devices []Device
	Line    []Place
}

// Snapshot copies the table. A free device is reserved for the first
// request of its pool in line that waits although some of the devices it
// may take are free (and that its user's cap does not hold back): Plan
// keeps those devices for it, and backfills smaller requests only onto
// devices it cannot use.
func (t *Table) Snapshot() Snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := Snapshot{Devices: make([]Device, 0, len(t.ids))}
	at := map[int]int{} // id -> index in s.Devices
	for _, id := range t.ids {
		d := t.devs[id]
		sd := Device{ID: id, Pool: t.pc.Load().poolOf[id], Freed: d.freed, File: d.file, Capacity: d.capacity, Declared: d.declared(), External: d.external, Unknown: d.unknown}
		if d.drain != nil {
			dr := *d.drain
			sd.Drain = &dr
		}
		switch {
		case len(d.leases) > 0:
			sd.State, sd.Leases = Leased, slices.Clone(d.leases)
		case d.granting != nil:
			sd.State, sd.For = Granting, d.granting.W
		case len(d.shares) > 0 && d.shares[0].h != nil:
			sd.State, sd.For = Granting, d.shares[0].h.W
		case d.drain != nil:
			sd.State = Drained
		case d.free():
			sd.State = Free
		}
		at[id] = len(s.Devices)
		s.Devices = append(s.Devices, sd)
	}
	done := map[string]bool{}
	drained := t.drainedLocked()
	for _, w := range t.q.Waiters() {
		if done[w.Pool] || t.capped(w) || w.Held || w.External || w.drainBlocked(drained) {
			continue
		}
		var free []int
		for _, id := range w.Cand {
			if i, ok := at[id]; ok && s.Devices[i].State == Free {
				free = append(free, i)
			}
		}
		if len(free) == 0 {
			continue
		}
		done[w.Pool] = true
		for _, i := range free {
			s.Devices[i].State, s.Devices[i].For = Reserved, w
		}
	}
	s.Line = t.lineLocked(make([]Place, 0, t.q.Len()))
	return s
}
