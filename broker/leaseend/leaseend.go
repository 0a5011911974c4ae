// Package leaseend ends a lease when its holders end, whatever became of
// its descriptors. It reaches the lease table only through Table, and lets
// a lease's lock go (Abandon) only once a full sweep of /proc found no
// process holding it; it must never touch a socket or a task.
package leaseend

import (
	"errors"
	"fmt"
	"log"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/internal/fileid"
	"github.com/npurun/npurun/npu"
)

// A lease's holders are the process it was granted to (and, for a task,
// its supervisor's tree, its control group; for a Slurm job, the job) and
// every process that has its lock file open: a descriptor inherited, or
// passed on, or a mapping. Its watcher (package lease) sees it end as the
// last descriptor of its lock file closes. That is not enough on its own:
// a descriptor sent over a Unix socket (SCM_RIGHTS) and never received is
// held by the socket's queue, by no process, for as long as the socket
// lives; and a process outside the lease may hold one on purpose. So:
//
//   - End: a lease whose holder has ended (a task, a Slurm job whose
//     Epilog came, a placeholder allocation Slurm ended) ends now. The
//     restricted entries of its devices go at once; the processes that
//     hold its lock files still are sent SIGTERM, then SIGKILL after the
//     grace to those that hold them still; and once no process does, a
//     lock held still (a descriptor in flight) is let go of (Abandon).
//   - Follow: a lease held by a process tree (npurun's, a login's, a
//     container's) ends when the tree is gone: the process it was granted
//     to is followed (a pidfd), then, once it has gone, whoever holds the
//     lease's lock files then, and when nobody does while the lock is held
//     still, the lease is let go of (Abandon). A process that holds it is
//     not signalled: a descriptor passed on is the lease passed on.
//
// Both look through /proc with one sweep (procscan.Sweep): every process,
// its descriptors and its maps, whatever the background scan's budgets,
// so that a user's many descriptors elsewhere may slow it but never hide
// a holder. A lease is let go of only once its lock is seen held
// (Table.LockHeld) after a sweep that found no process holding it. The
// same goes at a restart for the leases taken up (the broker follows them
// as it follows the leases it grants): one code path.

// Table is what the ender asks of the lease table.
type Table interface {
	HeldBy(l *lease.Lease) []lease.Holding
	Holds(l *lease.Lease, id int) bool
	LockHeld(l *lease.Lease, id int) bool
	Keep(id int, l *lease.Lease) []uint32
	Abandon(l *lease.Lease, id int) error
}

// Access is device access of restricted accounts: a lease's end closes
// its devices at once (End).
type Access interface {
	Revoke(id int, keep []uint32) error
}

// Holders finds who holds lock files, and signals them: the broker's
// /proc scanner (procscan.Scanner).
type Holders interface {
	Sweep(t procscan.Targets) (*procscan.Result, error)
	Signal(pid int, start uint64, sig unix.Signal) error
	Start(pid int) uint64
}

// Config configures an Ender.
type Config struct {
	Table   Table
	Access  Access  // nil: no device access to close
	Holders Holders // nil: nobody is looked for; a lease ends with its lock alone
	Vendor  npu.Vendor
	// Describe writes a process holding a lease for the log: its user
	// and command line, as status shows them.
	Describe func(p *procscan.Proc) string
	// Grace is how long holders have between SIGTERM and SIGKILL
	// ([tasks] kill_grace), read at each end.
	Grace func() time.Duration
	Log   *log.Logger
}

// Ender ends leases whose holders have ended. It is safe for concurrent
// use and takes no lock of another room: its work runs on goroutines of
// its own.
type Ender struct {
	c       Config
	fds     atomic.Int64 // pidfds open now (Descriptors)
	sweepMu sync.Mutex   // one sweep of /proc at a time

	mu      sync.Mutex
	follows map[*lease.Lease]chan struct{} // the leases followed: closed by Released
}

// Descriptors is how many descriptors the ender holds now: a pidfd for
// each process it waits on (at most maxFollow a lease it follows, and 64
// a lease it ends). It takes no lock.
func (e *Ender) Descriptors() int {
	if e == nil {
		return 0
	}
	return int(e.fds.Load())
}

// New returns an ender.
func New(c Config) *Ender {
	if c.Describe == nil {
		c.Describe = func(p *procscan.Proc) string { return p.Comm }
	}
	if c.Grace == nil {
		c.Grace = func() time.Duration { return 10 * time.Second }
	}
	return &Ender{c: c, follows: map[*lease.Lease]chan struct{}{}}
}

// killWait bounds the wait for processes sent SIGKILL to be gone before
// the next sweep, and maxRounds the SIGKILL rounds of one end.
const (
	killWait  = 5 * time.Second
	maxRounds = 5
)

// followPace is the least time from one sweep of a lease that Follow
// follows to the next.
const followPace = time.Second

// maxFollow bounds the processes one lease's follow waits on at once: the
// oldest of its holders (those that outlive the others, as a rule); when
// one of them goes, a sweep looks again.
const maxFollow = 8

// End ends the holdings held, whose holder has ended (why says how, for
// the log): the restricted entries of their devices go at once, and the
// holders of their lock files still there are chased, in a goroutine of
// its own.
func (e *Ender) End(held []lease.Holding, why string) {
	if len(held) == 0 {
		return
	}
	for _, h := range held {
		if e.c.Access == nil {
			continue
		}
		if err := e.c.Access.Revoke(h.Device, e.c.Table.Keep(h.Device, h.Lease)); err != nil {
			e.c.Log.Printf("%s: %v; they go when the lease's last holder is gone", why, err)
		}
	}
	if e.c.Holders != nil {
		go e.chase(held, why, e.c.Grace())
	}
}

// Detach ends the holdings held without a signal to anyone: the
// restricted entries of their devices go at once, as End's do, and the
// lease is let go of (Abandon) while its holders live on, their lock
// descriptors stale from then on (the next lease has a fresh lock file).
// It is how the [idle] policy reclaims a login's lease: the device, not
// the login. A process that had opened the device node keeps what it
// opened; the background scan reports it as unleased use.
func (e *Ender) Detach(held []lease.Holding, why string) {
	for _, h := range held {
		if e.c.Access != nil {
			if err := e.c.Access.Revoke(h.Device, e.c.Table.Keep(h.Device, h.Lease)); err != nil {
				e.c.Log.Printf("%s: %v", why, err)
			}
		}
		if err := e.c.Table.Abandon(h.Lease, h.Device); err != nil {
			e.c.Log.Printf("%s: %v", why, err)
		}
	}
}

// chase signals the processes that hold held's lock files: SIGTERM, then
// SIGKILL to those that hold them still after grace; once none does,
// what is held still is let go of.
func (e *Ender) chase(held []lease.Holding, why string, grace time.Duration) {
	sig, wait := unix.SIGTERM, grace
	for range maxRounds + 1 {
		found, done := e.sweep(held, why, sig)
		if done {
			return
		}
		e.waitGone(found, wait)
		sig, wait = unix.SIGKILL, killWait
	}
	e.c.Log.Printf("%s: its lease is held still after SIGKILL; it ends when its holders are gone", why)
}

// sweep looks for the holders of held's lock files still locked. With a
// signal, it sends it to each; without (0), it leaves them be. It returns
// the holders found, and done where there is nothing left to look for:
// none is locked still, or none is held by a process, and then what is
// locked still is let go of (Abandon). That takes two sweeps that find
// nobody, the lock held through both: a holder that forked as the first
// went by, its child read before it was made and itself after it exited,
// is found by the second.
func (e *Ender) sweep(held []lease.Holding, why string, sig unix.Signal) (found []*procscan.Proc, done bool) {
	for pass := range 2 {
		targets := procscan.Targets{Files: map[fileid.ID]bool{}}
		devOf := map[fileid.ID]lease.Holding{}
		for _, h := range held {
			if e.c.Table.LockHeld(h.Lease, h.Device) {
				f := h.File
				targets.Files[f] = true
				devOf[f] = h
			}
		}
		if len(targets.Files) == 0 {
			return nil, true // released (its watcher ends it), or ended
		}
		e.sweepMu.Lock()
		res, err := e.c.Holders.Sweep(targets)
		e.sweepMu.Unlock()
		if err != nil {
			e.c.Log.Printf("%s: find who holds its lease: %v", why, err)
			return nil, true
		}
		for f, h := range devOf {
			if !e.c.Table.Holds(h.Lease, h.Device) {
				// Released while /proc was read: its lock file may be
				// gone and its inode number given to a later lease's
				// file, whose holders the sweep then found under it.
				// Held still, the file was this lease's all along (the
				// table keeps it open while the lease holds it).
				delete(devOf, f)
				continue
			}
			for _, pid := range res.Files[f] {
				pi := res.Info[pid]
				if pi == nil || pid <= 1 {
					continue
				}
				if !slices.Contains(found, pi) {
					found = append(found, pi)
				}
				if sig != 0 {
					e.signal(pi, h.Device, why, sig)
				}
			}
		}
		if len(found) > 0 {
			return found, false
		}
		if pass == 0 {
			continue
		}
		for _, h := range devOf {
			if !e.c.Table.LockHeld(h.Lease, h.Device) {
				continue
			}
			// Locked, and by no process: by a descriptor in flight.
			e.c.Log.Printf("%s: no process holds its lease of %s, whose lock is held still by a descriptor no process has (sent over a socket and not received): the lease ends",
				why, e.c.Vendor.Format([]int{h.Device}))
			if err := e.c.Table.Abandon(h.Lease, h.Device); err != nil {
				e.c.Log.Printf("%s: %v", why, err)
			}
		}
	}
	return nil, true
}

// signal sends sig to pi, a holder of the lease of device id, and logs it.
func (e *Ender) signal(pi *procscan.Proc, id int, why string, sig unix.Signal) {
	err := e.c.Holders.Signal(pi.PID, pi.Start, sig)
	what := fmt.Sprintf("%s: pid %d (%s) still holds its lease of %s", why, pi.PID, e.c.Describe(pi), e.c.Vendor.Format([]int{id}))
	switch {
	case err == nil:
		e.c.Log.Printf("%s: sent %s", what, unix.SignalName(sig))
	case !errors.Is(err, unix.ESRCH):
		e.c.Log.Printf("%s: send %s: %v", what, unix.SignalName(sig), err)
	}
}

// Follow follows lease l, held by a process tree: the process it was
// granted to (l.PID, started at l.PIDStart where known), then whoever
// holds it; once they are gone and no process holds its lock files while
// one is locked still, the lease ends (Abandon). A lease with no process
// known (one found held at start) is looked at now. It returns at once.
func (e *Ender) Follow(l *lease.Lease) {
	if e.c.Holders == nil {
		return
	}
	var first []*procscan.Proc
	if l.PID > 0 {
		first = []*procscan.Proc{{PID: l.PID, Start: l.PIDStart}}
	}
	done := make(chan struct{})
	e.mu.Lock()
	e.follows[l] = done
	e.mu.Unlock()
	go e.follow(l, first, done)
}

// Released tells that lease l holds no device any more (its last one
// released): its follow, if any, ends, and the descriptors it waits on
// are closed, however long the processes live.
func (e *Ender) Released(l *lease.Lease) {
	e.mu.Lock()
	done := e.follows[l]
	delete(e.follows, l)
	e.mu.Unlock()
	if done != nil {
		close(done)
	}
}

func (e *Ender) follow(l *lease.Lease, procs []*procscan.Proc, done <-chan struct{}) {
	defer e.Released(l)
	why := fmt.Sprintf("the lease of %s (lease %d) has no holder left", l.User, l.ID)
	if l.User == "" {
		why = fmt.Sprintf("lease %d has no holder left", l.ID)
	}
	var last time.Time
	for {
		if len(e.c.Table.HeldBy(l)) == 0 {
			return // ended before its follow began, or meanwhile
		}
		if !e.waitAnyGone(procs, done) {
			return
		}
		// A lease's holders may come and go fast (a tree of short-lived
		// processes passing the descriptor on): its sweeps, each a look
		// at every process, are paced as the background scan is.
		if wait := time.Until(last.Add(followPace)); wait > 0 && !sleep(wait, done) {
			return
		}
		held := e.c.Table.HeldBy(l)
		if len(held) == 0 {
			return
		}
		last = time.Now()
		found, over := e.sweep(held, why, 0)
		if over {
			return
		}
		slices.SortFunc(found, func(a, b *procscan.Proc) int {
			if a.Start != b.Start {
				return int(a.Start) - int(b.Start)
			}
			return a.PID - b.PID
		})
		procs = found[:min(len(found), maxFollow)]
	}
}

// pidfd opens a pidfd of p, non-blocking (for the runtime's poller), if p
// is still the process that started at p.Start (any, where that is 0):
// -1 once it is gone; an error where no pidfd can be had (a kernel
// without them).
func (e *Ender) pidfd(p *procscan.Proc) (int, error) {
	fd, err := unix.PidfdOpen(p.PID, unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		return -1, nil
	}
	if err != nil {
		return -1, err
	}
	if start := e.c.Holders.Start(p.PID); start == 0 || p.Start != 0 && start != p.Start {
		unix.Close(fd)
		return -1, nil
	}
	e.fds.Add(1)
	return fd, nil
}

// noPoll is how long a follow waits before it looks again where it
// cannot wait for a process's exit (no pidfd, or none the poller takes).
const noPoll = 10 * time.Second

// waitAnyGone returns once one of procs is gone (at once where one is
// gone already, or there are none), true; or once done is closed, false.
// It waits in the runtime's poller, on no thread of its own.
func (e *Ender) waitAnyGone(procs []*procscan.Proc, done <-chan struct{}) bool {
	if len(procs) == 0 {
		return true
	}
	files := make([]*os.File, 0, len(procs))
	defer func() { e.closeAll(files) }()
	for _, p := range procs {
		fd, err := e.pidfd(p)
		if err != nil {
			return sleep(noPoll, done)
		}
		if fd < 0 {
			return true
		}
		files = append(files, os.NewFile(uintptr(fd), "pidfd"))
	}
	gone := make(chan bool, len(files))
	for _, f := range files {
		go func() { gone <- waitExit(f) }()
	}
	select {
	case ok := <-gone:
		return ok || sleep(noPoll, done)
	case <-done:
		return false
	}
}

// sleep waits for d, and tells whether it did (done was not closed
// first).
func sleep(d time.Duration, done <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
}

// waitExit waits until the process of pidfd f has exited, or f is
// closed; false where it cannot wait (f is not in the poller).
func waitExit(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	err = rc.Read(func(fd uintptr) bool {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(p, 0)
		return err != nil && err != unix.EINTR || n > 0
	})
	return err == nil || errors.Is(err, os.ErrClosed)
}

// waitGone waits until every process of procs is gone, or for timeout.
func (e *Ender) waitGone(procs []*procscan.Proc, timeout time.Duration) {
	if len(procs) == 0 {
		return
	}
	var files []*os.File
	for _, p := range procs[:min(len(procs), 64)] {
		if fd, _ := e.pidfd(p); fd >= 0 {
			files = append(files, os.NewFile(uintptr(fd), "pidfd"))
		}
	}
	done := make(chan bool, 1)
	go func() {
		ok := true
		for _, f := range files {
			ok = waitExit(f) && ok
		}
		done <- ok
	}()
	t := time.NewTimer(timeout)
	select {
	case ok := <-done:
		if !ok {
			<-t.C // could not wait: the whole timeout
		}
	case <-t.C:
	}
	t.Stop()
	e.closeAll(files)
}

// closeAll closes the pidfds files.
func (e *Ender) closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
	e.fds.Add(-int64(len(files)))
}
