package lease

import (
	"slices"
	"time"

	"github.com/npurun/npurun/internal/testhook"
)

// A lease's end is its watcher's to record (watch, watchShare): the
// watcher is blocked in flock on a second open of the lease's lock file,
// and ends the lease once that returns, the last descriptor of the file
// closed. The holder's process tree is gone from that moment: the kernel
// lets the lock go as the last holder exits, before its parent hears of
// the exit. The watcher records the end a moment later, on a goroutine of
// its own; so a request made right after the previous holder's command
// exited (a loop of npurun --no-wait runs) may find the device held
// still. A request that waits is served when the watcher frees the
// device (Owner.Freed); one that is not to wait asks Ending first, and
// waits for those ends before it is refused.
//
// Ending's test is the watcher's own flock, made non-blocking, on the
// watcher's own descriptor: it succeeds exactly when the watcher's
// flock returns (or is about to: a lock of one open file, taken twice,
// is taken once), so it never takes a lease whose lock is held still,
// by its holders or by a descriptor passed on. It ends nothing itself:
// the watcher does, on its one path (the owner told, the gate closed, a
// fresh lock file, the line served).

// ending is a lease's lock file as its watcher waits on it.
type ending struct {
	fd   int           // the watcher's open of the lock file: tried by Ending while it is the device's (or share's) waiting
	over chan struct{} // closed once the watcher has ended the lease (the device in service again, or kept out of it)
}

func newEnding(fd int) *ending { return &ending{fd: fd, over: make(chan struct{})} }

// letGo tells whether the lock that e's watcher waits for is let go: the
// last descriptor of the lease's lock file closed. It takes the lock for
// the watcher's open file, as the watcher's own flock does. The caller
// holds t.mu, under which the watcher closes e.fd only once it no longer
// names e as waiting.
func (e *ending) letGo() bool {
	return e != nil && flock(e.fd, true) == nil
}

// seen tells that the watcher of *w has seen its lock go (or Abandon
// ended it): from now on the watcher may close its descriptor, and
// Ending waits for its end without trying it. The caller holds the
// table's lock.
func (t *Table) seen(d *device, w **ending) {
	if *w != nil {
		d.ending = append(d.ending, *w)
		*w = nil
	}
}

// over tells that the watcher has ended e, a lease of d: d (or the
// share's room) is in service again, or kept out of it. It takes the
// table's lock.
func (t *Table) over(d *device, e *ending) {
	t.mu.Lock()
	d.ending = slices.DeleteFunc(d.ending, func(o *ending) bool { return o == e })
	t.mu.Unlock()
	close(e.over)
}

// Ending returns, for each lease on a device w may take whose lock is let
// go already (its holders gone) while its watcher has not ended it yet, a
// channel closed once the watcher has: the device (or the share's room)
// is in service again, or kept out of it (its gate cannot close it). The
// owner of a request that is not to wait (npurun --no-wait) waits for
// them, holding no lock, before it refuses: a device whose holders are
// gone is not in use. None: nil.
func (t *Table) Ending(w *Waiter) []<-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []<-chan struct{}
	for _, id := range w.Cand {
		if id < 0 || id >= len(t.devs) || t.devs[id] == nil {
			continue
		}
		d := t.devs[id]
		for _, e := range d.ending {
			out = append(out, e.over)
		}
		if d.waiting.letGo() {
			out = append(out, d.waiting.over)
		}
		for _, s := range d.shares {
			if s.lease != nil && s.waiting.letGo() {
				out = append(out, s.waiting.over)
			}
		}
	}
	return out
}

// hookLateRelease (NPUBROKER_TEST_HOOK) holds a watcher for lateRelease
// once its flock has returned, before it records the end: the window in
// which a loaded machine leaves a lease whose holders are gone, opened
// every time.
const (
	hookLateRelease = "late-release"
	lateRelease     = 300 * time.Millisecond
)

// releaseSeen is where the watcher of device id is once its flock has
// returned, before it records the end: the test hook's pause; the
// package's tests hold it there for as long as they need.
var releaseSeen = func(id int) { testhook.Pause(hookLateRelease, lateRelease) }
