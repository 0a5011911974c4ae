package broker

import (
	"fmt"
	"slices"
	"time"

	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/npu"
)

// acquire serves an npurun's request for a lease.
func (s *Server) acquire(c *conn, req *client.Request) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.w != nil {
		c.sendLocked(errReply(client.CodeBadRequest, "this connection already waits for devices", ""))
		return false
	}
	if req.N != 0 && len(req.Devices) > 0 && req.N != len(req.Devices) {
		c.sendLocked(errReply(client.CodeBadRequest, fmt.Sprintf("asked for %d devices but named %d", req.N, len(req.Devices)), ""))
		return false
	}
	if s.leaseWaits[c.uid] >= s.cfg.MaxWaitingPerUser {
		c.sendLocked(errReply(client.CodeTooMany, fmt.Sprintf("%s already has %d requests waiting, the most the broker queues for one user", c.acct.name, s.cfg.MaxWaitingPerUser), ""))
		return true
	}
	w, rep := s.admitLocked(c.uid, c.acct, req.N, req.Devices, req.Pool)
	if rep != nil {
		c.sendLocked(rep)
		return rep.Code != client.CodeBadRequest
	}
	w.conn = c
	c.w = w
	s.leaseWaits[c.uid]++
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
func (s *Server) admitLocked(uid uint32, acct *account, n int, devices []int, pool string) (*Waiter, *client.Reply) {
	lim := s.cfg.LimitFor(acct.name, acct.groups)
	w := &Waiter{UID: uid, user: acct.name, lim: lim, queued: time.Now()}
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
			return nil, errReply(client.CodeDenied, fmt.Sprintf("%d devices asked, pool %q has only %d", w.N, w.Pool, len(ids)), "")
		}
		w.Cand = ids
	}
	if lim.MaxDevices > 0 && w.N > lim.MaxDevices {
		return nil, errReply(client.CodeDenied, fmt.Sprintf("%d devices asked, the limit for %s is %d held at once (%s)", w.N, acct.name, lim.MaxDevices, lim.Source), "")
	}
	return w, nil
}

// unwaitLocked clears c's waiting request (granted, refused or cancelled).
func (s *Server) unwaitLocked(c *conn) {
	if c.w == nil {
		return
	}
	c.w = nil
	if s.leaseWaits[c.uid]--; s.leaseWaits[c.uid] <= 0 {
		delete(s.leaseWaits, c.uid)
	}
}

func busyMessage(w *Waiter, v npu.Vendor) string {
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
		grants := Plan(s.q.Waiters(), free, s.roomLocked(s.q))
		if len(grants) == 0 {
			break
		}
		failed := false
		for _, g := range grants {
			s.q.Remove(g.W, true)
			var ok bool
			if g.W.task != nil {
				ok = s.startTaskLocked(g.W.task, g.Devices)
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
		for _, g := range Plan(s.cpuq.Waiters(), s.cpuFree, s.roomLocked(s.cpuq)) {
			s.cpuq.Remove(g.W, true)
			s.startTaskLocked(g.W.task, nil, g.Devices[0])
		}
	}
	if !s.loading {
		s.warmLocked()
	}
}

// roomLocked is what Plan needs of the limits: per user, how many more
// devices they may hold, or (for a task) how many more tasks they may run.
func (s *Server) roomLocked(q *Queue) Room {
	var room Room
	for _, w := range q.Waiters() {
		if w.lim.MaxDevices > 0 {
			if room.Devices == nil {
				room.Devices = map[uint32]int{}
			}
			room.Devices[w.UID] = w.lim.MaxDevices - s.held[w.UID]
		}
		if w.task != nil && w.lim.MaxRunning > 0 {
			if room.Tasks == nil {
				room.Tasks = map[uint32]int{}
			}
			room.Tasks[w.UID] = w.lim.MaxRunning - s.running[w.UID]
		}
	}
	return room
}

// grantLocked sends the locked descriptors to the waiter's client. On
// success the broker keeps nothing but a watcher per device.
func (s *Server) grantLocked(g Grant) bool {
	c := g.W.conn
	s.unwaitLocked(c)
	fds := make([]int, len(g.Devices))
	for i, id := range g.Devices {
		fds[i] = s.devs[id].fd
	}
	r := &client.Reply{
		Type:     client.TypeGrant,
		Devices:  g.Devices,
		Vendor:   string(s.inv.Vendor),
		Env:      s.inv.Env(g.Devices),
		WaitedMS: time.Since(g.W.queued).Milliseconds(),
	}
	if err := c.sendLocked(r, fds...); err != nil {
		s.log.Printf("grant npu %s to %s (pid %d): %v", npu.FormatIDs(g.Devices), c.acct.name, c.pid, err)
		c.closed = true
		c.c.Close()
		return false
	}
	s.inlineGrantedLocked(c, g, fds)
	for _, id := range g.Devices {
		d := s.devs[id]
		closeFD(d.fd)
		d.fd = -1
		s.releasedLocked(d, c.uid)
	}
	return true
}

// progressLocked arranges for waiters to hear their new places soon.
func (s *Server) progressLocked() {
	if s.pending || s.q.Len() == 0 {
		return
	}
	s.pending = true
	time.AfterFunc(progressDelay, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.pending = false
		s.reportLocked()
	})
}

// maxAhead is how many users ahead a progress message names.
const maxAhead = 3

// standing is a pool's line as the report walks it.
type standing struct {
	pos   int
	ahead []string
}

// reportLocked sends every waiting client whose place changed its new
// place (1 is next), the users ahead of it, and why it waits if not only
// for its turn.
func (s *Server) reportLocked() {
	st := map[string]*standing{}
	for _, w := range s.q.Waiters() {
		p := st[w.Pool]
		if p == nil {
			p = &standing{}
			st[w.Pool] = p
		}
		p.pos++
		if w.conn != nil {
			why := s.reasonLocked(w)
			if p.pos != w.pos || why != w.why {
				w.pos, w.why = p.pos, why
				r := &client.Reply{Type: client.TypeQueued, Pool: w.Pool, Position: w.pos, Reason: w.why}
				if w.pos > 1 {
					r.Ahead = p.ahead
				}
				w.conn.sendLocked(r)
			}
		} else {
			w.pos = p.pos
		}
		if len(p.ahead) < maxAhead && !slices.Contains(p.ahead, w.user) {
			p.ahead = append(p.ahead, w.user)
		}
	}
}

// reasonLocked says why w waits beyond its turn, if it does.
func (s *Server) reasonLocked(w *Waiter) string {
	if w.lim.MaxDevices > 0 && s.held[w.UID]+w.N > w.lim.MaxDevices {
		return fmt.Sprintf("%s holds %d of %d devices allowed (%s)", w.user, s.held[w.UID], w.lim.MaxDevices, w.lim.Source)
	}
	return ""
}
