package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/npu"
)

// conn is one client connection. Its goroutine reads requests; the
// scheduler writes grants and progress to it under Server.mu.
type conn struct {
	s    *Server
	c    *net.UnixConn
	rc   syscall.RawConn
	uid  uint32
	pid  int32
	acct *account

	w      *Waiter   // the request waiting, nil when none
	queued time.Time // when w was queued
	closed bool
}

// rbuf is a receive buffer, taken from a pool only while a message is being
// read, so that a waiting connection holds none.
type rbuf struct{ b, oob []byte }

var rbufs = sync.Pool{New: func() any {
	return &rbuf{b: make([]byte, client.MaxMessage+1), oob: make([]byte, unix.CmsgSpace(client.MaxDevices*4))}
}}

func (s *Server) handle(nc *net.UnixConn) {
	defer nc.Close()
	rc, err := nc.SyscallConn()
	if err != nil {
		return
	}
	c := &conn{s: s, c: nc, rc: rc}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || cerr != nil {
		s.log.Printf("peer credentials: %v", errors.Join(err, cerr))
		return
	}
	c.uid, c.pid = cred.Uid, cred.Pid

	s.mu.Lock()
	if s.conns >= s.cfg.MaxConnections {
		c.sendLocked(errReply(client.CodeTooMany, fmt.Sprintf("the broker serves at most %d connections at once", s.cfg.MaxConnections), "try again later"))
		s.mu.Unlock()
		return
	}
	s.conns++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.conns--
		c.closed = true
		if c.w != nil && s.q.Remove(c.w, false) {
			c.w = nil
			s.scheduleLocked() // its reservations are gone
			s.progressLocked()
		}
		s.mu.Unlock()
	}()

	for {
		req, err := c.read()
		if err != nil {
			var bad *badRequest
			if errors.As(err, &bad) {
				s.mu.Lock()
				c.sendLocked(errReply(client.CodeBadRequest, bad.msg, ""))
				s.mu.Unlock()
			}
			return
		}
		if !c.serve(req) {
			return
		}
	}
}

type badRequest struct{ msg string }

func (b *badRequest) Error() string { return b.msg }

// read waits for the next request without holding a buffer while waiting.
func (c *conn) read() (*client.Request, error) {
	var req *client.Request
	var rerr error
	if e := c.rc.Read(func(fd uintptr) bool {
		buf := rbufs.Get().(*rbuf)
		defer rbufs.Put(buf)
		data, fds, err := client.RecvMsg(int(fd), buf.b, buf.oob, unix.MSG_DONTWAIT)
		if err == unix.EAGAIN {
			return false
		}
		for _, f := range fds {
			unix.Close(f) // clients send no descriptors
		}
		switch {
		case errors.Is(err, client.ErrTooLarge):
			rerr = &badRequest{fmt.Sprintf("message larger than %d bytes", client.MaxMessage)}
		case err != nil:
			rerr = err
		case len(data) > client.MaxMessage:
			rerr = &badRequest{fmt.Sprintf("message larger than %d bytes", client.MaxMessage)}
		default:
			req, rerr = decode(data)
		}
		return true
	}); e != nil {
		return nil, e
	}
	return req, rerr
}

func decode(data []byte) (*client.Request, error) {
	var req client.Request
	if err := json.Unmarshal(data, &req); err != nil {
		return nil, &badRequest{fmt.Sprintf("malformed message: %v", err)}
	}
	if req.V != client.Version {
		return nil, &badRequest{fmt.Sprintf("protocol version %d not supported (this broker speaks %d)", req.V, client.Version)}
	}
	return &req, nil
}

func errReply(code, msg, hint string) *client.Reply {
	return &client.Reply{Type: client.TypeError, Code: code, Message: msg, Hint: hint}
}

// sendLocked sends a reply without blocking. A client that does not read
// its socket loses progress messages; a grant that cannot be sent fails.
func (c *conn) sendLocked(r *client.Reply, fds ...int) error {
	if c.closed {
		return client.ErrClosed
	}
	r.V = client.Version
	b, err := client.Encode(r)
	if err != nil {
		return err
	}
	var serr error
	if err := c.rc.Control(func(fd uintptr) {
		serr = client.SendMsg(int(fd), b, fds, unix.MSG_DONTWAIT)
	}); err != nil {
		return err
	}
	return serr
}

// serve handles one request; false closes the connection.
func (c *conn) serve(req *client.Request) bool {
	s := c.s
	switch req.Op {
	case client.OpPing:
		s.mu.Lock()
		defer s.mu.Unlock()
		return c.sendLocked(&client.Reply{Type: client.TypePong}) == nil
	case client.OpAcquire:
		if c.acct == nil {
			c.acct = s.users.lookup(c.uid)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if c.w != nil {
			c.sendLocked(errReply(client.CodeBadRequest, "this connection already waits for devices", ""))
			return false
		}
		w, rep := s.admit(c, req)
		if rep != nil {
			c.sendLocked(rep)
			return rep.Code != client.CodeBadRequest
		}
		c.w, c.queued = w, time.Now()
		s.q.Add(w)
		s.scheduleLocked()
		if c.w == nil {
			return true // granted at once
		}
		if req.NoWait {
			s.q.Remove(w, false)
			c.w = nil
			s.scheduleLocked()
			c.sendLocked(errReply(client.CodeBusy, busyMessage(w), ""))
			return true
		}
		s.reportLocked(w)
		return true
	default:
		c.sendLocked(errReply(client.CodeBadRequest, fmt.Sprintf("unknown operation %q", req.Op), ""))
		return false
	}
}

// admit checks a request against the inventory and the policy. It returns
// the waiter to queue, or the reply that refuses it.
func (s *Server) admit(c *conn, req *client.Request) (*Waiter, *client.Reply) {
	lim := s.cfg.LimitFor(c.acct.name, c.acct.groups)
	w := &Waiter{UID: c.uid, conn: c}
	if len(req.Devices) > 0 {
		if req.N != 0 && req.N != len(req.Devices) {
			return nil, errReply(client.CodeBadRequest, fmt.Sprintf("asked for %d devices but named %d", req.N, len(req.Devices)), "")
		}
		if len(req.Devices) > client.MaxDevices {
			return nil, errReply(client.CodeBadRequest, fmt.Sprintf("at most %d devices in one request", client.MaxDevices), "")
		}
		ids := slices.Clone(req.Devices)
		slices.Sort(ids)
		if len(slices.Compact(slices.Clone(ids))) != len(ids) {
			return nil, errReply(client.CodeBadRequest, fmt.Sprintf("device named twice in %v", req.Devices), "")
		}
		for _, id := range ids {
			if id < 0 || id >= len(s.devs) || s.devs[id] == nil {
				return nil, errReply(client.CodeNoDevice, fmt.Sprintf("no npu %d here", id), "this broker manages npu "+npu.FormatIDs(s.inv.IDs))
			}
			p := s.poolOf[id]
			if !lim.AllowsPool(p) {
				return nil, errReply(client.CodeDenied, fmt.Sprintf("npu %d is in pool %q, which %s does not open to %s", id, p, lim.Source, c.acct.name), "")
			}
			w.Pool = p
		}
		w.Cand, w.N, w.Exact = ids, len(ids), true
	} else {
		w.N = req.N
		if w.N == 0 {
			w.N = 1
		}
		if w.N < 0 || w.N > client.MaxDevices {
			return nil, errReply(client.CodeBadRequest, fmt.Sprintf("bad device count %d", req.N), "")
		}
		w.Pool = s.poolName(req.Pool)
		ids, ok := s.pools[w.Pool]
		if !ok {
			return nil, errReply(client.CodeNoSuchPool, fmt.Sprintf("no pool %q here", req.Pool), "pools: "+poolList(s))
		}
		if !lim.AllowsPool(w.Pool) {
			return nil, errReply(client.CodeDenied, fmt.Sprintf("pool %q is not open to %s (%s)", w.Pool, c.acct.name, lim.Source), "")
		}
		if w.N > len(ids) {
			return nil, errReply(client.CodeDenied, fmt.Sprintf("%d devices asked, pool %q has only %d", w.N, w.Pool, len(ids)), "")
		}
		w.Cand = ids
	}
	if lim.MaxDevices > 0 && w.N > lim.MaxDevices {
		return nil, errReply(client.CodeDenied, fmt.Sprintf("%d devices asked, the limit for %s is %d held at once (%s)", w.N, c.acct.name, lim.MaxDevices, lim.Source), "")
	}
	if s.q.UserCount(c.uid) >= s.cfg.MaxWaitingPerUser {
		return nil, errReply(client.CodeTooMany, fmt.Sprintf("%s already has %d requests waiting, the most the broker queues for one user", c.acct.name, s.cfg.MaxWaitingPerUser), "")
	}
	return w, nil
}

func busyMessage(w *Waiter) string {
	if w.Exact {
		return fmt.Sprintf("npu %s is in use", npu.FormatIDs(w.Cand))
	}
	if w.N == 1 {
		return fmt.Sprintf("no device free in pool %q", w.Pool)
	}
	return fmt.Sprintf("fewer than %d devices free in pool %q", w.N, w.Pool)
}

// scheduleLocked grants what can be granted now.
func (s *Server) scheduleLocked() {
	for s.nfree > 0 && s.q.Len() > 0 {
		var room map[uint32]int
		for _, w := range s.q.Waiters() {
			if _, seen := room[w.UID]; seen {
				continue
			}
			lim := s.cfg.LimitFor(w.conn.acct.name, w.conn.acct.groups)
			if lim.MaxDevices > 0 {
				if room == nil {
					room = map[uint32]int{}
				}
				room[w.UID] = lim.MaxDevices - s.held[w.UID]
			}
		}
		free := make([]bool, len(s.devs))
		for id, d := range s.devs {
			free[id] = d != nil && d.fd >= 0
		}
		grants := Plan(s.q.Waiters(), free, room)
		if len(grants) == 0 {
			return
		}
		failed := false
		for _, g := range grants {
			s.q.Remove(g.W, true)
			if !s.grantLocked(g) {
				failed = true
			}
		}
		s.progressLocked()
		if !failed {
			return
		}
		// A client vanished before its grant: its devices are still free
		// and the next waiters may take them.
	}
}

// grantLocked sends the locked descriptors to the waiter's client. On
// success the broker keeps nothing but a watcher per device.
func (s *Server) grantLocked(g Grant) bool {
	c := g.W.conn
	c.w = nil
	fds := make([]int, len(g.Devices))
	for i, id := range g.Devices {
		fds[i] = s.devs[id].fd
	}
	r := &client.Reply{
		Type:     client.TypeGrant,
		Devices:  g.Devices,
		Vendor:   string(s.inv.Vendor),
		Env:      s.inv.Env(g.Devices),
		WaitedMS: time.Since(c.queued).Milliseconds(),
	}
	if err := c.sendLocked(r, fds...); err != nil {
		s.log.Printf("grant npu %s to %s (pid %d): %v", npu.FormatIDs(g.Devices), c.acct.name, c.pid, err)
		c.closed = true
		c.c.Close()
		return false
	}
	now := time.Now()
	for _, id := range g.Devices {
		d := s.devs[id]
		unix.Close(d.fd)
		d.fd = -1
		d.leased, d.holder, d.since = true, c.uid, now
		s.nfree--
		s.held[c.uid]++
		fd, err := openLock(d.path)
		if err != nil {
			s.log.Printf("npu %d: %v; device taken out of service", id, err)
			continue
		}
		go s.watch(d, fd)
	}
	return true
}

// progressLocked arranges for waiters to hear their new positions soon.
func (s *Server) progressLocked() {
	if s.pending || s.q.Len() == 0 {
		return
	}
	s.pending = true
	time.AfterFunc(progressDelay, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.pending = false
		s.reportAllLocked()
	})
}

// maxAhead is how many users ahead a progress message names.
const maxAhead = 3

// position computes where w stands in its pool: its place, the users
// ahead, and a reason if it waits for something besides its turn.
type standing struct {
	pos   int
	ahead []string
}

// reportAllLocked sends every waiter whose place changed its new place.
func (s *Server) reportAllLocked() {
	st := map[string]*standing{}
	for _, w := range s.q.Waiters() {
		p := st[w.Pool]
		if p == nil {
			p = &standing{}
			st[w.Pool] = p
		}
		p.pos++
		why := s.reasonLocked(w)
		if p.pos != w.pos || why != w.why {
			w.pos, w.why = p.pos, why
			w.conn.sendLocked(s.queuedReply(w, p.ahead))
		}
		if len(p.ahead) < maxAhead && !slices.Contains(p.ahead, w.conn.acct.name) {
			p.ahead = append(p.ahead, w.conn.acct.name)
		}
	}
}

// reportLocked tells a newly queued waiter its place.
func (s *Server) reportLocked(w *Waiter) {
	pos := 0
	var ahead []string
	for _, o := range s.q.Waiters() {
		if o.Pool != w.Pool {
			continue
		}
		pos++
		if o == w {
			break
		}
		if len(ahead) < maxAhead && !slices.Contains(ahead, o.conn.acct.name) {
			ahead = append(ahead, o.conn.acct.name)
		}
	}
	w.pos, w.why = pos, s.reasonLocked(w)
	w.conn.sendLocked(s.queuedReply(w, ahead))
}

func (s *Server) queuedReply(w *Waiter, ahead []string) *client.Reply {
	r := &client.Reply{Type: client.TypeQueued, Pool: w.Pool, Position: w.pos, Reason: w.why}
	if w.pos > 1 {
		r.Ahead = ahead
	}
	return r
}

// reasonLocked says why w waits beyond its turn, if it does.
func (s *Server) reasonLocked(w *Waiter) string {
	lim := s.cfg.LimitFor(w.conn.acct.name, w.conn.acct.groups)
	if lim.MaxDevices > 0 && s.held[w.UID]+w.N > lim.MaxDevices {
		return fmt.Sprintf("%s holds %d of %d devices allowed (%s)", w.conn.acct.name, s.held[w.UID], lim.MaxDevices, lim.Source)
	}
	return ""
}
