package lease

import (
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"
)

// A lease ends when its holders end, whatever became of its descriptors.
// Its watcher sees the end as its lock goes: the last descriptor of the
// lock file closed. But a descriptor can outlive every process: one sent
// over a Unix socket (SCM_RIGHTS) and not yet received is held by the
// socket's queue, which keeps the open file, and its flock, for as long
// as the socket lives, and a peer that never reads keeps it for ever. So
// the owner, having seen the lease's holders gone (its process tree, its
// task, its job) and no process holding its lock file (a sweep of /proc),
// ends the lease itself: Abandon. The device's watcher then ends it as
// it ends any, on the same path: the owner told (Released), the gate
// closed, a fresh lock file in place, the next waiter served. The old
// file stays locked by the descriptor in flight, which holds nothing from
// then on: no later lease is on that file (a lock file is good for one
// lease), and a nested npurun that presents it finds it is not its
// device's lock file. Whoever receives it later holds a dead descriptor.
//
// The watcher's thread, blocked in flock on the old file, cannot be
// called back: it goes on waiting, on its own goroutine, until that last
// descriptor is gone, and then closes the file (outlive). Those waits are
// threads, so they are bounded: MaxStale in all, MaxStaleUser for the
// leases of one user; past those Abandon refuses (ErrStaleFull) and the
// lease stays held until one of them ends.

// MaxStale bounds the lock files whose lease Abandon ended that are
// waited on at once (a thread each), MaxStaleUser those of one user's
// leases.
const (
	MaxStale     = 1024
	MaxStaleUser = 64
)

// ErrStaleFull is Abandon's refusal past MaxStale or MaxStaleUser.
var ErrStaleFull = errors.New("too many lock files of ended leases are held by descriptors no process has")

// Abandon ends lease l on device id although its lock is held still:
// the owner has seen its holders gone and no process hold its lock file,
// or has taken the device from a login whose lease the [idle] policy
// reclaimed (leaseend.Ender.Detach), whose descriptors hold nothing from
// then on.
// The device's watcher ends it as it ends any (the owner is told through
// Released, from the watcher's goroutine). It is a no-op where l holds id
// no more.
func (t *Table) Abandon(l *Lease, id int) error {
	if id < 0 || id >= len(t.devs) || t.devs[id] == nil {
		return nil
	}
	f, ok := l.FileOf(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.devs[id]
	if !ok || !slices.Contains(d.leases, l) {
		return nil
	}
	if t.stale >= MaxStale || t.staleUser[l.UID] >= MaxStaleUser {
		return fmt.Errorf("end the lease of %s on npu %d: %w (%d, %d of %s's)", l.User, id, ErrStaleFull, t.stale, t.staleUser[l.UID], l.User)
	}
	for _, s := range d.shares {
		if s.lease == l {
			poke(s.poke)
			return nil
		}
	}
	if d.file != f {
		return nil
	}
	d.abandoned = f
	poke(d.poke)
	return nil
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// LockHeld tells whether lease l's lock file of device id is locked still
// (by a holder, or by a descriptor no process has): false once it is
// free, or replaced (the lease has ended), or l holds id no more.
func (t *Table) LockHeld(l *Lease, id int) bool {
	f, ok := l.FileOf(id)
	if !ok || !t.Holds(l, id) {
		return false
	}
	path := LockPath(t.dir, id)
	t.mu.Lock()
	for _, s := range t.devs[id].shares {
		if s.lease == l {
			path = s.path
		}
	}
	t.mu.Unlock()
	fd, err := reopen(path, f)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	for {
		err = unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB)
		if err != unix.EINTR {
			break
		}
	}
	if err == nil {
		unix.Flock(fd, unix.LOCK_UN)
		return false
	}
	return true
}

// Stale is how many lock files of leases Abandon ended are waited on
// now: a descriptor each, beyond those of the devices (the broker's
// reserve of descriptors counts them). It takes no lock.
func (t *Table) Stale() int { return int(t.staleFDs.Load()) }

// waitRelease waits in flock on fd, a second open of a lease's lock file,
// until the lease's last descriptor is gone, or until poke comes and
// abandoned tells that Abandon ended the lease: then it returns the
// channel on which the flock, still waiting, will say that it returned.
func (t *Table) waitRelease(fd int, pokes chan struct{}, abandoned func() bool) (<-chan error, error) {
	released := make(chan error, 1)
	go func() { released <- flock(fd, false) }()
	for {
		select {
		case err := <-released:
			return nil, err
		case <-pokes:
			if abandoned() {
				return released, nil
			}
		}
	}
}

// outlive waits, on a goroutine of its own, for the flock on fd that
// stale reports (waitRelease's, of lease l on device d, which Abandon
// ended) to return, the last descriptor of the old file gone; then it
// closes fd.
func (t *Table) outlive(d *device, l *Lease, fd int, stale <-chan error) {
	var uid uint32
	what := fmt.Sprintf("npu %d", d.id)
	if l != nil {
		uid = l.UID
		what = fmt.Sprintf("npu %d: the lease of %s (lease %d)", d.id, l.User, l.ID)
	}
	t.mu.Lock()
	t.stale++
	t.staleUser[uid]++
	t.staleFDs.Add(1)
	t.mu.Unlock()
	t.log.Printf("%s has ended; its old lock file, which holds nothing now, is kept locked by a descriptor still open (one sent over a socket and not received, or a login's whose lease the [idle] policy reclaimed)", what)
	go func() {
		<-stale
		closeFD(fd)
		t.mu.Lock()
		t.staleFDs.Add(-1)
		t.stale--
		if t.staleUser[uid]--; t.staleUser[uid] <= 0 {
			delete(t.staleUser, uid)
		}
		t.mu.Unlock()
	}()
}
