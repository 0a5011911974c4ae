package broker

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/pam"
	"github.com/npurun/npurun/policy"
)

// acquire serves an npurun's request for a lease.
func (s *Server) acquire(c *conn, req *client.Request) bool {
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
		c.sendLocked(errReply(client.CodeBadRequest, "this connection already waits for devices", ""))
		return false
	}
	if req.N != 0 && len(req.Devices) > 0 && req.N != len(req.Devices) {
		c.sendLocked(errReply(client.CodeBadRequest, fmt.Sprintf("asked for %d devices but named %d", req.N, len(req.Devices)), ""))
		return false
	}
	if s.leaseWaits[uid] >= s.cfg.MaxWaitingPerUser {
		c.sendLocked(errReply(client.CodeTooMany, fmt.Sprintf("%s already has %s waiting, the most the broker queues for one user", acct.name, quantity.Count(s.cfg.MaxWaitingPerUser, "request", "requests")), ""))
		return true
	}
	w, rep := s.admitLocked(c.holder(lease.Inline, uid, acct), acct, req.N, req.Devices, req.Pool)
	if rep != nil {
		c.sendLocked(rep)
		return rep.Code != client.CodeBadRequest
	}
	w.Ref = c
	c.w = w
	s.leaseWaits[uid]++
	s.q.Add(w)
	s.scheduleLocked()
	if c.w == nil {
		return true // granted at once
	}
	if req.NoWait {
		s.q.Remove(w, false)
		s.unwaitLocked(c)
		s.scheduleLocked()
		c.sendLocked(errReply(client.CodeBusy, busyMessage(w, s.inv.Vendor), ""))
		return true
	}
	s.progressLocked() // its place, soon: a short wait costs no message
	return true
}

// admitLocked checks a request for n devices (or exactly devices) from pool
// against the inventory and the policy. It returns the waiter to queue, or
// the reply that refuses it.
func (s *Server) admitLocked(h lease.Holder, acct *account, n int, devices []int, pool string) (*lease.Waiter, *client.Reply) {
	lim := s.cfg.LimitFor(acct.name, acct.groups)
	w := &lease.Waiter{Holder: h, Limit: lim, Queued: time.Now()}
	if len(devices) > 0 {
		if len(devices) > client.MaxDevices {
			return nil, errReply(client.CodeBadRequest, fmt.Sprintf("at most %d devices in one request", client.MaxDevices), "")
		}
		ids := slices.Clone(devices)
		slices.Sort(ids)
		if len(slices.Compact(slices.Clone(ids))) != len(ids) {
			return nil, errReply(client.CodeBadRequest, fmt.Sprintf("device named twice in %v", devices), "")
		}
		for _, id := range ids {
			if id < 0 || id >= len(s.devs) || s.devs[id] == nil {
				return nil, errReply(client.CodeNoDevice, "no "+s.inv.Vendor.Format([]int{id})+" here", "this broker manages "+s.inv.Vendor.Format(s.inv.IDs))
			}
			p, inPool := s.poolOf[id]
			switch {
			case !inPool:
				return nil, errReply(client.CodeDenied, fmt.Sprintf("%s is in no pool, so nobody may lease it", s.inv.Vendor.Format([]int{id})), "")
			case !lim.AllowsPool(p):
				return nil, errReply(client.CodeDenied, fmt.Sprintf("%s is in pool %q, which %s does not open to %s", s.inv.Vendor.Format([]int{id}), p, lim.Source, acct.name), "")
			}
			w.Pool = p
		}
		w.Cand, w.N, w.Exact = ids, len(ids), true
	} else {
		w.N = n
		if w.N == 0 {
			w.N = 1
		}
		if w.N < 0 {
			return nil, errReply(client.CodeBadRequest, fmt.Sprintf("bad device count %d", n), "")
		}
		w.Pool = s.poolName(pool)
		ids, ok := s.pools[w.Pool]
		if !ok {
			return nil, errReply(client.CodeNoSuchPool, fmt.Sprintf("no pool %q here", pool), "pools: "+poolList(s))
		}
		if !lim.AllowsPool(w.Pool) {
			return nil, errReply(client.CodeDenied, fmt.Sprintf("pool %q is not open to %s (%s)", w.Pool, acct.name, lim.Source), "")
		}
		if w.N > len(ids) {
			return nil, errReply(client.CodeDenied, fmt.Sprintf("%s asked, pool %q has only %d", quantity.Count(w.N, "device", "devices"), w.Pool, len(ids)), "")
		}
		w.Cand = ids
	}
	if lim.MaxDevices > 0 && w.N > lim.MaxDevices {
		return nil, errReply(client.CodeDenied, fmt.Sprintf("%s asked, the limit for %s is %d held at once (%s)", quantity.Count(w.N, "device", "devices"), acct.name, lim.MaxDevices, lim.Source), "")
	}
	return w, nil
}

// holder is the holder of kind of a lease asked for on c for uid, whose
// account is acct: c's peer, where the request came from.
func (c *conn) holder(kind lease.Kind, uid uint32, acct *account) lease.Holder {
	h := lease.Holder{Kind: kind, UID: uid, User: acct.name, PID: int(c.pid)}
	if o := c.origin; o != nil {
		h.Service, h.TTY, h.RHost, h.Claimed = o.Service, o.TTY, o.RHost, !o.ByRoot
	}
	return h
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

func busyMessage(w *lease.Waiter, v npu.Vendor) string {
	if w.Exact {
		return v.Format(w.Cand) + " is in use"
	}
	if w.N == 1 {
		return fmt.Sprintf("no device free in pool %q", w.Pool)
	}
	return fmt.Sprintf("fewer than %d devices free in pool %q", w.N, w.Pool)
}

// scheduleLocked grants what can be granted now: devices to leases and
// tasks, CPU slots to tasks that need no device.
func (s *Server) scheduleLocked() {
	s.changedLocked() // for status watchers: the line or the devices changed
	for s.nfree > 0 && s.q.Len() > 0 {
		free := make([]bool, len(s.devs))
		for id, d := range s.devs {
			free[id] = d != nil && d.fd >= 0
		}
		grants := lease.Plan(s.q.Waiters(), free, s.roomLocked(s.q))
		if len(grants) == 0 {
			break
		}
		failed := false
		for _, g := range grants {
			s.q.Remove(g.W, true)
			var ok bool
			if taskOf(g.W) != nil {
				ok = s.startTaskLocked(taskOf(g.W), g.Devices)
			} else {
				ok = s.grantLocked(g)
			}
			failed = failed || !ok
		}
		s.progressLocked()
		if !failed {
			break
		}
		// A client vanished before its grant, or a task could not start:
		// their devices are still free and the next waiters may take them.
	}
	if s.cpuq.Len() > 0 && slices.Contains(s.cpuFree, true) {
		for _, g := range lease.Plan(s.cpuq.Waiters(), s.cpuFree, s.roomLocked(s.cpuq)) {
			s.cpuq.Remove(g.W, true)
			s.startTaskLocked(taskOf(g.W), nil, g.Devices[0])
		}
	}
	if !s.loading {
		s.warmLocked()
	}
}

// roomLocked is what Plan needs of the limits: per user, how many more
// devices they may hold, or (for a task) how many more tasks they may run.
func (s *Server) roomLocked(q *lease.Queue) lease.Room {
	var room lease.Room
	q.Limits(func(uid uint32, lim policy.Limit) {
		if lim.MaxDevices > 0 {
			if room.Devices == nil {
				room.Devices = map[uint32]int{}
			}
			room.Devices[uid] = lim.MaxDevices - s.held[uid]
		}
		if lim.MaxRunning > 0 {
			if room.Tasks == nil {
				room.Tasks = map[uint32]int{}
			}
			room.Tasks[uid] = lim.MaxRunning - s.running[uid]
		}
	})
	return room
}

// grantLocked sends the locked descriptors to the waiter's client. A
// restricted account's access to the devices comes first (before the
// descriptors leave the broker). On success the broker keeps nothing but
// a watcher per device.
func (s *Server) grantLocked(g lease.Grant) bool {
	c := connOf(g.W)
	uid := g.W.UID
	isLogin := c.login != nil
	s.unwaitLocked(c)
	fds := make([]int, len(g.Devices))
	for i, id := range g.Devices {
		fds[i] = s.devs[id].fd
	}
	if err := s.acc.Allow(uid, g.Devices); err != nil {
		s.log.Printf("grant npu %s to %s: %v", npu.FormatIDs(g.Devices), g.W.User, err)
		s.undoAccessLocked(g.Devices)
		c.sendLocked(errReply(client.CodeNoAccess, fmt.Sprintf("the broker could not open %s to %s: %v", s.inv.Vendor.Format(g.Devices), g.W.User, err), "tell the administrator: the broker's log says more"))
		return false
	}
	r := &client.Reply{
		Type:     client.TypeGrant,
		Devices:  g.Devices,
		Vendor:   string(s.inv.Vendor),
		Env:      s.inv.Env(g.Devices),
		WaitedMS: time.Since(g.W.Queued).Milliseconds(),
	}
	if isLogin {
		r.Message = pam.GrantMessage(s.inv.Vendor, g.Devices, g.W.Pool)
	}
	if err := c.sendLocked(r, fds...); err != nil {
		// A client that has gone (its npurun killed while it waited, the
		// connection not yet seen closed) is the common case, and no news.
		if !goneClient(err) {
			s.log.Printf("grant npu %s to %s (pid %d): %v", npu.FormatIDs(g.Devices), g.W.User, c.pid, err)
		}
		s.undoAccessLocked(g.Devices)
		c.closed = true
		c.c.Close()
		return false
	}
	s.inlineGrantedLocked(c, g, fds, isLogin)
	for _, id := range g.Devices {
		d := s.devs[id]
		closeFD(d.fd)
		d.fd = -1
		d.origin = c.origin
		s.releasedLocked(d, uid)
	}
	return true
}

// connOf is the connection a waiter's grant goes to; nil for a task's.
func connOf(w *lease.Waiter) *conn {
	c, _ := w.Ref.(*conn)
	return c
}

// taskOf is the task a waiter queues; nil for a connection's request.
func taskOf(w *lease.Waiter) *task {
	t, _ := w.Ref.(*task)
	return t
}

// goneClient tells whether err, from a send, means the client has gone.
func goneClient(err error) bool {
	return errors.Is(err, unix.EPIPE) || errors.Is(err, unix.ECONNRESET) || errors.Is(err, client.ErrClosed)
}

// undoAccessLocked takes back the access a grant that failed gave: its
// devices stay free, so no managed entry belongs on their nodes. A device
// whose entries cannot all be removed is out of service until they are.
func (s *Server) undoAccessLocked(ids []int) {
	for _, id := range ids {
		if err := s.acc.Revoke(id); err != nil {
			s.holdOutLocked(s.devs[id], err)
		}
	}
}

// holdOutLocked takes free device d out of service while revokeUntilDone
// removes the entries that a grant that failed gave: its lock file, never
// handed out, serves again once they are gone.
func (s *Server) holdOutLocked(d *device, err error) {
	fd, spare := d.fd, d.spare
	d.fd, d.spare = -1, -1
	s.nfree--
	go func() {
		s.acc.revokeUntilDone(d.id, err)
		s.mu.Lock()
		d.fd, d.spare = fd, spare
		s.nfree++
		starts := s.scheduleHereLocked()
		s.mu.Unlock()
		s.launchAll(starts)
	}()
}

// progressLocked arranges for waiters to hear their new places soon.
func (s *Server) progressLocked() {
	s.progressAfterLocked(progressDelay)
}

// progressAfterLocked arranges a report within d: sooner than one already
// arranged, never later.
func (s *Server) progressAfterLocked(d time.Duration) {
	if s.q.Len() == 0 {
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

// maxAhead is how many users ahead a progress message names.
const maxAhead = 3

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

// standing is a pool's line as the report walks it.
type standing struct {
	pos   int
	ahead []string
}

// reportLocked tells waiting clients their new places (1 is next), the
// users ahead of them, and why they wait if not only for their turn. It
// returns how soon to report again for waiters whose news was held back by
// progressInterval, or 0.
func (s *Server) reportLocked(now time.Time) time.Duration {
	st := map[string]*standing{}
	var again time.Duration
	for _, w := range s.q.Waiters() {
		p := st[w.Pool]
		if p == nil {
			p = &standing{}
			st[w.Pool] = p
		}
		p.pos++
		if c := connOf(w); c != nil && (c.told.pos != p.pos || w.Limit.MaxDevices > 0) {
			why := s.reasonLocked(w)
			if wait := tellAfter(&c.told, p.pos, why, now); wait == 0 {
				c.told = told{pos: p.pos, why: why, at: now}
				r := &client.Reply{Type: client.TypeQueued, Pool: w.Pool, Position: p.pos, Reason: why}
				if p.pos > 1 {
					r.Ahead = p.ahead
				}
				c.sendLocked(r)
			} else if wait > 0 && (again == 0 || wait < again) {
				again = wait
			}
		}
		if len(p.ahead) < maxAhead && !slices.Contains(p.ahead, w.User) {
			p.ahead = append(p.ahead, w.User)
		}
	}
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

// reasonLocked says why w waits beyond its turn, if it does.
func (s *Server) reasonLocked(w *lease.Waiter) string {
	if w.Limit.MaxDevices > 0 && s.held[w.UID]+w.N > w.Limit.MaxDevices {
		return fmt.Sprintf("%s holds %d of %s allowed (%s)", w.User, s.held[w.UID], quantity.Count(w.Limit.MaxDevices, "device", "devices"), w.Limit.Source)
	}
	return ""
}
