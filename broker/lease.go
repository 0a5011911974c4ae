package broker

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/tasks"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/pam"
	"github.com/npurun/npurun/wire"
)

// acquire serves an npurun's request for a lease.
func (s *Server) acquire(c *conn, req *wire.Request) bool {
	uid, acct, ok := s.accountFor(c, req.User)
	if !ok {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if req.User != "" {
		c.origin = &Origin{User: acct.name, Service: req.Service, TTY: req.TTY, RHost: req.RHost, ByRoot: true}
	}
	if c.w != nil {
		c.sendLocked(errReply(wire.CodeBadRequest, "this connection already waits for devices", ""))
		return false
	}
	if req.N != 0 && len(req.Devices) > 0 && req.N != len(req.Devices) {
		c.sendLocked(errReply(wire.CodeBadRequest, fmt.Sprintf("asked for %d devices but named %d", req.N, len(req.Devices)), ""))
		return false
	}
	if s.leaseWaits[uid] >= s.policy().MaxWaitingPerUser {
		c.sendLocked(errReply(wire.CodeTooMany, fmt.Sprintf("%s already has %s waiting, the most the broker queues for one user", acct.name, quantity.Count(s.policy().MaxWaitingPerUser, "request", "requests")), ""))
		return true
	}
	kind, rep := containerKind(req)
	if rep != nil {
		c.sendLocked(rep)
		return false
	}
	if req.Container != nil && !s.status.MayNameContainer(req.Container, c.uid) { // the caller's: root's runtime asks for the owner
		c.sendLocked(errReply(wire.CodeDenied, fmt.Sprintf("uid %d may not name container %.12s: it is another user's", c.uid, req.Container.ID), ""))
		return true
	}
	if rep := s.timeLimit(req); rep != nil {
		c.sendLocked(rep)
		return rep.Code != wire.CodeBadRequest
	}
	h := c.holder(kind, uid, acct)
	h.Container = req.Container.Label()
	c.time = time.Duration(req.TimeSec) * time.Second
	if c.time > 0 {
		h.Limit = c.time + s.policy().Tasks.KillGrace
	}
	w, rep := s.admitLocked(h, acct, req.N, req.Devices, req.Pool, req.Mem)
	if rep != nil {
		c.sendLocked(rep)
		return rep.Code != wire.CodeBadRequest
	}
	w.Ref = c
	c.w = w
	s.leaseWaits[uid]++
	s.table.Add(w)
	s.scheduleLocked()
	if c.w == nil {
		return true // granted at once
	}
	if req.NoWait && s.awaitEndsLocked(c, w) {
		return true // granted as a device came free, or the connection closed meanwhile
	}
	if req.NoWait {
		why := s.table.Reason(w) // a drain, or the user's cap, that holds it back
		s.table.Remove(w)
		s.unwaitLocked(c)
		s.scheduleLocked()
		c.sendLocked(errReply(wire.CodeBusy, busyMessage(w, s.inv.Vendor, why), ""))
		return true
	}
	s.progressLocked() // its place, soon: a short wait costs no message
	return true
}

// endingWait bounds how long a request that is not to wait waits for the
// watchers of leases whose holders are gone to end them (awaitEndsLocked):
// a moment, unless a device's gate cannot close it (then it is out of
// service, and the request refused).
const endingWait = 5 * time.Second

// awaitEndsLocked is the wait of request w on connection c, not granted
// and not to wait (longer): npurun --no-wait, a login whose on_busy wait
// is over. It waits for the leases of devices w may take whose holders
// are gone already while their watchers have not ended them yet
// (lease.Table.Ending): the previous holder's command has exited, so the
// device is not in use. It lets s.mu go meanwhile: a watcher's end serves
// the line (tableOwner.Freed), w in it. It tells whether w is settled
// (granted, or its connection closed); false: w waits still, and is to be
// refused.
func (s *Server) awaitEndsLocked(c *conn, w *lease.Waiter) bool {
	ends := s.table.Ending(w)
	if len(ends) == 0 {
		return false
	}
	s.mu.Unlock()
	bound := time.NewTimer(endingWait)
wait:
	for _, end := range ends {
		select {
		case <-end:
		case <-bound.C:
			break wait
		}
	}
	bound.Stop()
	s.mu.Lock()
	if c.w != w {
		return true
	}
	s.scheduleLocked()
	return c.w == nil
}

// admitLocked checks a request for n devices (or exactly devices) from pool
// against the inventory and the policy (lease.Table.Admit). It returns the
// waiter to queue, or the reply that refuses it.
func (s *Server) admitLocked(h lease.Holder, acct *account, n int, devices []int, pool string, mem int64) (*lease.Waiter, *wire.Reply) {
	if err := s.slurmRefusal(devices); err != nil {
		return nil, refusalReply(err)
	}
	w, err := s.table.Admit(lease.Request{Holder: h, N: n, Devices: devices, Pool: pool, Limit: s.policy().LimitFor(acct.name, acct.groups), Mem: mem})
	if err != nil {
		return nil, refusalReply(err)
	}
	return w, nil
}

// The lease table's cap on the devices a request names is the wire's.
var _ = [1]struct{}{}[lease.MaxDevices-wire.MaxDevices]

// holder is the holder of kind of a lease asked for on c for uid, whose
// account is acct: c's peer, where the request came from.
func (c *conn) holder(kind lease.Kind, uid uint32, acct *account) lease.Holder {
	h := lease.Holder{Kind: kind, UID: uid, User: acct.name, PID: int(c.pid)}
	if o := c.origin; o != nil {
		h.Service, h.TTY, h.RHost, h.Claimed = o.Service, o.TTY, o.RHost, !o.ByRoot
	}
	return h
}

// connOf is the connection a waiter's grant goes to; nil for a task's.
func connOf(w *lease.Waiter) *conn {
	c, _ := w.Ref.(*conn)
	return c
}

// refuseLocked tells the clients of waiters the lease table took out of
// line (a reload's Reconfigure, a device found not shared:
// lease.Table.SetCapacity) that they are refused (code denied: npurun
// exits 77), msg before each refusal's reason. It returns the tasks'
// among them, for tasks.Room.Refuse once s.mu is let go.
func (s *Server) refuseLocked(refused []lease.Refused, msg string) (tasks []lease.Refused) {
	for _, r := range refused {
		c := connOf(r.W)
		if c == nil {
			tasks = append(tasks, r)
			continue
		}
		if c.w == r.W {
			s.unwaitLocked(c)
			c.sendLocked(errReply(wire.CodeDenied, msg+r.Why.Msg, r.Why.Hint))
		}
	}
	return tasks
}

// unwaitLocked clears c's waiting request (granted, refused or cancelled).
// Waits count against the user they are for (not root's, for a request on
// another user's behalf).
func (s *Server) unwaitLocked(c *conn) {
	if c.w == nil {
		return
	}
	uid := c.w.UID
	c.w = nil
	c.told = told{}
	c.login = nil
	if s.leaseWaits[uid]--; s.leaseWaits[uid] <= 0 {
		delete(s.leaseWaits, uid)
	}
}

// busyMessage says why --no-wait request w is not granted at once; why
// is the lease table's reason, if it has one (a drained device, by whom,
// since when and why; the user's cap).
func busyMessage(w *lease.Waiter, v npu.Vendor, why string) string {
	if w.External {
		return fmt.Sprintf("pool %q is Slurm's to allocate: a request waits in Slurm's queue, which --no-wait does not", w.Pool)
	}
	msg := ""
	switch {
	case w.Exact && why != "":
		return v.Format(w.Cand) + " is not free: " + why
	case w.Exact:
		return v.Format(w.Cand) + " is in use"
	case w.N == 1:
		msg = fmt.Sprintf("no device free in pool %q", w.Pool)
	default:
		msg = fmt.Sprintf("fewer than %d devices free in pool %q", w.N, w.Pool)
	}
	if why != "" {
		msg += ": " + why
	}
	return msg
}

// scheduleLocked grants what can be granted now: devices to leases and
// tasks (the lease table plans; the task room starts the tasks among its
// grants, the broker delivers each other grant and commits or returns
// it), CPU slots to tasks that need no device.
func (s *Server) scheduleLocked() {
	s.serveLocked(false) // the task room launches the tasks granted
}

// serveLocked is scheduleLocked for a caller that launches the tasks
// granted itself (here), with tasks.Room.Launch once it has let the
// lock go: it returns them.
func (s *Server) serveLocked(here bool) []tasks.Start {
	s.status.Changed() // for status watchers: the line or the devices changed
	var starts []tasks.Start
	for {
		sv := s.tasks.Schedule(here)
		starts = append(starts, sv.Starts...)
		for _, b := range sv.Begun {
			s.status.Started(b.Lease, b.H)
		}
		failed := sv.Again
		for _, h := range sv.Others {
			failed = !s.deliverLocked(h) || failed
		}
		if len(sv.Begun) == 0 && len(sv.Others) == 0 && !sv.Again {
			break
		}
		s.progressLocked()
		if !failed {
			break
		}
		// A client vanished before its grant, or a task could not start:
		// their devices are free again and the next waiters may take them.
	}
	return starts
}

// deliverLocked delivers handover h to its waiter: a task's start (the
// task room's: tasks.Room.Deliver), or a grant to the client waiting on
// its connection. It tells whether it did; if not, the devices are free
// again.
func (s *Server) deliverLocked(h *lease.Handover) bool {
	if sv, mine := s.tasks.Deliver(h); mine {
		for _, b := range sv.Begun {
			s.status.Started(b.Lease, b.H)
		}
		return !sv.Again
	}
	if c := connOf(h.W); c != nil {
		return s.grantLocked(c, h)
	}
	s.table.Return(h)
	return false
}

// grantLocked delivers handover h to the client waiting on c: the locked
// descriptors go out on its socket. A restricted account's access to the
// devices comes first (before the descriptors leave the broker). On
// success the lease begins and the broker keeps nothing but the lease
// table's watcher per device; on failure the devices are free again.
func (s *Server) grantLocked(c *conn, h *lease.Handover) bool {
	isLogin := c.login != nil
	s.unwaitLocked(c)
	if err := s.table.Allow(h); err != nil {
		s.log.Printf("grant npu %s to %s: %v", npu.FormatIDs(h.Devices), h.W.User, err)
		s.table.Return(h)
		c.sendLocked(errReply(wire.CodeNoAccess, fmt.Sprintf("the broker could not open %s to %s: %v", s.inv.Vendor.Format(h.Devices), h.W.User, err), "tell the administrator: the broker's log says more"))
		return false
	}
	r := &wire.Reply{
		Type:     wire.TypeGrant,
		Devices:  h.Devices,
		Vendor:   string(s.inv.Vendor),
		Env:      s.inv.Env(h.Devices),
		WaitedMS: time.Since(h.W.Queued).Milliseconds(),
	}
	if isLogin {
		r.Message = pam.GrantMessage(s.inv.Vendor, h.Devices, h.W.Pool)
	} else if h.Mem() > 0 {
		r.Message = s.table.ShareMessage(h)
	}
	if !isLogin {
		r.SlurmJob = h.W.SlurmJob // an npurun stays to hear if Slurm ends it
	}
	if b := h.Backfill; b != nil {
		r.EndsBy, r.Before, r.Beside = b.EndsBy.UnixMilli(), b.Of(), b.Beside
	}
	if err := c.sendLocked(r, h.FDs()...); err != nil {
		// A client that has gone (its npurun killed while it waited, the
		// connection not yet seen closed) is the common case, and no news.
		if !wire.Gone(err) {
			s.log.Printf("grant npu %s to %s (pid %d): %v", npu.FormatIDs(h.Devices), h.W.User, c.pid, err)
		}
		s.table.Return(h)
		c.closed = true
		c.c.Close()
		return false
	}
	l := s.table.Commit(h)
	for _, fd := range h.FDs() {
		closeFD(fd) // the client has it
	}
	if r.SlurmJob != 0 {
		c.placeholder = r.SlurmJob
		s.byPlaceholder[r.SlurmJob] = c
	}
	s.status.Started(l, h)
	s.ender.Follow(l) // it ends with the client's process tree, whatever becomes of its descriptors
	if c.time > 0 {
		s.armTimeLimit(l, c.time)
	}
	return true
}

// progressLocked arranges for waiters to hear their new places soon.
func (s *Server) progressLocked() {
	s.progressAfterLocked(progressDelay)
}

// progressAfterLocked arranges a report within d: sooner than one already
// arranged, never later.
func (s *Server) progressAfterLocked(d time.Duration) {
	if s.table.Len() == 0 {
		return
	}
	at := time.Now().Add(d)
	if s.pending && !s.progressAt.After(at) {
		return
	}
	s.pending, s.progressAt = true, at
	if s.progressTimer == nil {
		s.progressTimer = time.AfterFunc(d, s.progressDue)
	} else {
		s.progressTimer.Reset(d)
	}
}

// progressDue reports, and arranges the next report for what it held back.
func (s *Server) progressDue() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending = false
	if again := s.reportLocked(time.Now()); again > 0 {
		s.progressAfterLocked(again)
	}
}

// Every grant moves everyone behind it one place up, so telling every
// waiter of every move costs a message per waiter per grant: with
// thousands waiting, the broker would do little else. A waiter is told
// what changed for it, when it matters: at once when it becomes next in
// line or the reason it waits changes; otherwise when its place has moved
// by a tenth or more since it was last told (every move, in the first ten
// places), and then at most once per progressEvery, or, further back than
// the first thousand places, once per millisecond of its place (5 s at the
// 5,000th) up to progressMax: a line of thousands that moves at thousands
// of grants a second would otherwise cost a message per waiter per
// second. Messages per grant so stay about constant however long the line;
// and where a line moves at the pace of jobs, minutes a grant, every move
// is told.
const (
	progressEvery = time.Second
	progressMax   = 10 * time.Second
)

// progressInterval is how often a waiter at place pos is told of a move at
// most.
func progressInterval(pos int) time.Duration {
	return min(max(progressEvery, time.Duration(pos)*time.Millisecond), progressMax)
}

// reportLocked tells waiting clients their new places (1 is next), the
// users ahead of them, and why they wait if not only for their turn, as the
// lease table's line shows them. It returns how soon to report again for
// waiters whose news was held back by progressInterval, or 0.
func (s *Server) reportLocked(now time.Time) time.Duration {
	var again time.Duration
	s.places = s.table.Line(s.places[:0])
	for _, p := range s.places {
		c := connOf(p.W)
		if c == nil || c.told.pos == p.Pos && p.W.Limit.MaxDevices == 0 && p.Why == "" && c.told.why == "" {
			continue
		}
		why := s.slurmWhy(p.W, p.Why)
		if p.W.External && why == "" {
			continue // its placeholder is being submitted: nothing to say yet
		}
		if wait := tellAfter(&c.told, p.Pos, why, now); wait == 0 {
			c.told = told{pos: p.Pos, why: why, at: now}
			r := &wire.Reply{Type: wire.TypeQueued, Pool: p.W.Pool, Position: p.Pos, Reason: why, Ahead: p.Ahead}
			if !p.Start.IsZero() {
				r.Start = p.Start.UnixMilli()
			}
			c.sendLocked(r)
		} else if wait > 0 && (again == 0 || wait < again) {
			again = wait
		}
	}
	clear(s.places) // hold no waiter until the next report
	return again
}

// told is what a waiting client was last told of its place: the place
// (0: nothing yet), the reason it waits, and when.
type told struct {
	pos int
	why string
	at  time.Time
}

// tellAfter decides whether a waiter last told last, now at place pos
// waiting for why, is to be told: 0 means now, a positive duration means
// later (it was told too recently), a negative one means not for this
// change.
func tellAfter(last *told, pos int, why string, now time.Time) time.Duration {
	switch {
	case last.pos == 0, why != last.why, pos == 1 && last.pos != 1:
		return 0
	case pos == last.pos:
		return -1
	}
	moved := pos - last.pos
	if moved < 0 {
		moved = -moved
	}
	if moved*10 < last.pos {
		return -1
	}
	if wait := last.at.Add(progressInterval(pos)).Sub(now); wait > 0 {
		return wait
	}
	return 0
}

func closeFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}
