package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/internal/fileid"
	"github.com/npurun/npurun/wire"
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

	w      *lease.Waiter // the request waiting, nil when none
	time   time.Duration // its time limit (npurun --time); 0: none
	told   told          // what it was last told of its place (reportLocked)
	closed bool
	unread int // bytes sent that the client had not read when last looked at (SIOCOUTQ)

	passed []fileid.ID // the files of the descriptors the request read last came with (op container)

	origin *Origin // a session's, or a request's on behalf of another user
	login  *login  // a login session waiting for its lease
	// placeholder: the Slurm job through which the lease granted on this
	// connection is held (allocate mode), 0 for none: Server.byPlaceholder
	placeholder uint32
}

// rbuf is a receive buffer, taken from a pool only while a message is being
// read, so that a waiting connection holds none.
type rbuf struct{ b, oob []byte }

var rbufs = sync.Pool{New: func() any {
	return &rbuf{b: make([]byte, wire.MaxMessage+1), oob: make([]byte, unix.CmsgSpace(wire.MaxDevices*4))}
}}

// spareConns is how many connections a user may hold beyond their cap on
// waiting requests (for list, show, wait and the like).
const spareConns = 64

// handle serves a new connection. Its first request is served on the
// accepting goroutine when it has come already and is quick to serve: an
// acquire or a ping for the caller itself, whose account the broker knows
// (no user database to ask). That is the usual npurun's, which so waits
// for no goroutine to be started, and no thread woken to run it, before
// its grant: about 30 µs of its round trip here (issue 9). The rest of the
// connection is served on a goroutine of its own.
func (s *Server) handle(nc *net.UnixConn) {
	c := s.open(nc)
	if c == nil {
		return
	}
	var first *wire.Request
	// The account is taken from the cache here, once: a lookup later, in
	// serveOne, could find it expired and ask the user database on the
	// accepting goroutine.
	if acct := s.users.cached(c.uid); acct != nil && c.requestWaiting() {
		c.acct = acct
		req, err := c.read()
		if err != nil {
			c.refuse(err)
			c.finish()
			return
		}
		if (req.Op == wire.OpAcquire || req.Op == wire.OpPing) && req.User == "" {
			if !c.serveOne(req) {
				c.finish()
				return
			}
		} else {
			first = req
		}
	}
	go func() {
		defer c.finish()
		if first != nil && !c.serveOne(first) {
			return
		}
		c.loop()
	}()
}

// requestWaiting tells whether a message is there to read.
func (c *conn) requestWaiting() bool {
	ready := false
	c.rc.Control(func(fd uintptr) {
		n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
		ready = n > 0
	})
	return ready
}

// open registers a new connection, or refuses it (nil).
func (s *Server) open(nc *net.UnixConn) *conn {
	rc, err := nc.SyscallConn()
	if err != nil {
		nc.Close()
		return nil
	}
	c := &conn{s: s, c: nc, rc: rc}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || cerr != nil {
		s.log.Printf("peer credentials: %v", errors.Join(err, cerr))
		nc.Close()
		return nil
	}
	c.uid, c.pid = cred.Uid, cred.Pid
	// What the client leaves unread stays in the kernel, charged to this
	// socket: room for two full replies, no more.
	rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, sendBuf) })

	maxConns, fromLimit := s.connCap()
	s.mu.Lock()
	switch {
	case s.conns >= maxConns:
		c.sendLocked(errReply(wire.CodeTooMany, fmt.Sprintf("the broker serves at most %d connections at once", maxConns), "try again later"))
		s.mu.Unlock()
		if fromLimit {
			s.rlog.Printf("connections: %d served, as many as RLIMIT_NOFILE (%d) allows above the %d descriptors kept for the devices, tasks and the broker; refusing more (raise the limit: LimitNOFILE= in the service)", maxConns, s.nofile.get(), s.fdKeep)
		}
		nc.Close()
		return nil
	case s.userConns[c.uid] >= s.policy().MaxWaitingPerUser+spareConns && c.uid != 0:
		c.sendLocked(errReply(wire.CodeTooMany, fmt.Sprintf("uid %d already has %d connections to the broker", c.uid, s.userConns[c.uid]), ""))
		s.mu.Unlock()
		nc.Close()
		return nil
	}
	s.conns++
	s.userConns[c.uid]++
	if s.connsOf[c.uid] == nil {
		s.connsOf[c.uid] = map[*conn]struct{}{}
	}
	s.connsOf[c.uid][c] = struct{}{}
	s.mu.Unlock()
	return c
}

// finish forgets a connection that open registered, and closes it.
func (c *conn) finish() {
	s := c.s
	s.mu.Lock()
	s.conns--
	if s.userConns[c.uid]--; s.userConns[c.uid] <= 0 {
		delete(s.userConns, c.uid)
	}
	c.setUnreadLocked(0)
	if delete(s.connsOf[c.uid], c); len(s.connsOf[c.uid]) == 0 {
		delete(s.connsOf, c.uid)
	}
	c.closed = true
	if c.placeholder != 0 && s.byPlaceholder[c.placeholder] == c {
		delete(s.byPlaceholder, c.placeholder)
	}
	s.tasks.Unwatch(c) // the tasks whose end it waits for
	if c.w != nil && s.table.Remove(c.w) {
		s.unwaitLocked(c)
		s.scheduleLocked() // its reservations are gone
		s.progressLocked()
	}
	s.mu.Unlock()
	c.c.Close()
}

// loop serves the connection's requests until it closes or one fails.
func (c *conn) loop() {
	for {
		req, err := c.read()
		if err != nil {
			c.refuse(err)
			return
		}
		if !c.serveOne(req) {
			return
		}
	}
}

// refuse answers a request that could not be read, if it was malformed.
func (c *conn) refuse(err error) {
	var bad *badRequest
	if errors.As(err, &bad) {
		c.s.mu.Lock()
		c.sendLocked(errReply(wire.CodeBadRequest, bad.msg, ""))
		c.s.mu.Unlock()
	}
}

// serveOne serves a request read; false closes the connection.
func (c *conn) serveOne(req *wire.Request) bool {
	switch {
	case req.Op == wire.OpSubmit && (c.acct == nil || !c.acct.hasShell):
		c.acct = c.s.users.lookup(c.uid) // a --run task's shell
	case c.acct == nil:
		c.acct = c.s.users.lookupLease(c.uid)
	}
	return c.serve(req)
}

type badRequest struct{ msg string }

func (b *badRequest) Error() string { return b.msg }

// read waits for the next request without holding a buffer while waiting.
func (c *conn) read() (*wire.Request, error) {
	var req *wire.Request
	var rerr error
	if e := c.rc.Read(func(fd uintptr) bool {
		buf := rbufs.Get().(*rbuf)
		defer rbufs.Put(buf)
		data, fds, err := wire.RecvMsg(int(fd), buf.b, buf.oob, unix.MSG_DONTWAIT)
		if err == unix.EAGAIN {
			return false
		}
		defer closeAll(fds) // kept by none: op container's are known by their files (passedFiles)
		switch {
		case errors.Is(err, wire.ErrTooLarge) || (err == nil && len(data) > wire.MaxMessage):
			rerr = &badRequest{fmt.Sprintf("message larger than %d bytes", wire.MaxMessage)}
		case err != nil:
			rerr = err
		default:
			req, rerr = decode(data)
			if rerr == nil {
				c.passed, rerr = passedFiles(req, fds)
			}
		}
		return true
	}); e != nil {
		return nil, e
	}
	return req, rerr
}

func decode(data []byte) (*wire.Request, error) {
	req, ok := wire.DecodeRequest(data) // the lease exchange, without encoding/json
	if !ok {
		req = new(wire.Request)
		if err := json.Unmarshal(data, req); err != nil {
			return nil, &badRequest{fmt.Sprintf("malformed message: %v", err)}
		}
	}
	if req.V != wire.Version {
		return nil, &badRequest{fmt.Sprintf("protocol version %d not supported (this broker speaks %d)", req.V, wire.Version)}
	}
	return req, nil
}

func errReply(code, msg, hint string) *wire.Reply {
	return &wire.Reply{Type: wire.TypeError, Code: code, Message: msg, Hint: hint}
}

// sendLocked sends a reply without blocking. A client that does not read
// its socket loses progress messages; a grant that cannot be sent fails.
func (c *conn) sendLocked(r *wire.Reply, fds ...int) error {
	if c.closed {
		return wire.ErrClosed
	}
	r.V = wire.Version
	b, ok := wire.AppendReply(make([]byte, 0, 256), r) // the lease exchange, without encoding/json
	if !ok {
		var err error
		if b, err = wire.Encode(r); err != nil {
			return err
		}
	}
	if len(b) > wire.MaxMessage {
		return wire.ErrTooLarge
	}
	var serr error
	if err := c.rc.Control(func(fd uintptr) {
		serr = wire.SendMsg(int(fd), b, fds, unix.MSG_DONTWAIT)
	}); err != nil {
		return err
	}
	return serr
}

// sendTimeout bounds how long a reply sent from the connection's own
// goroutine waits for a client that does not read.
const sendTimeout = 10 * time.Second

// sendRaw sends an encoded reply from the connection's own goroutine
// (never under Server.mu), waiting for room in the socket.
func (c *conn) sendRaw(b []byte) error {
	if len(b) > wire.MaxMessage {
		return wire.ErrTooLarge
	}
	c.c.SetWriteDeadline(time.Now().Add(sendTimeout))
	defer c.c.SetWriteDeadline(time.Time{})
	var serr error
	if err := c.rc.Write(func(fd uintptr) bool {
		serr = wire.SendMsg(int(fd), b, nil, unix.MSG_DONTWAIT)
		return serr != unix.EAGAIN
	}); err != nil {
		return err
	}
	return serr
}

// What one user's clients may leave unread. Each connection's send buffer
// holds two full replies at most (the kernel doubles what is asked for).
// A page of a listing is built only once the client has read what it was
// sent (the socket is writable again, a quarter of its buffer at most
// unread), waiting sendTimeout at most: a client that asks and does not
// read costs one page, then is dropped. And while one user's connections
// together leave more than maxUnreadPerUser unread, that user's further
// listings are not served: the connection is held, reading nothing, for
// sendTimeout, then dropped.
const (
	sendBuf          = wire.MaxMessage + 16<<10
	maxUnreadPerUser = 4 << 20
)

// errUnread is a reply refused because its client leaves too much unread.
var errUnread = errors.New("replies left unread")

// readyForListing waits until a page of a listing may be sent on c, or
// says why it may not.
func (c *conn) readyForListing() error {
	if err := c.awaitRead(sendTimeout); err != nil {
		return fmt.Errorf("%w: %w", errUnread, err)
	}
	s := c.s
	s.mu.Lock()
	c.noteUnreadLocked()
	over := c.uid != 0 && s.unread[c.uid]+wire.MaxMessage > maxUnreadPerUser
	if over {
		for o := range s.connsOf[c.uid] {
			o.noteUnreadLocked() // some may have been read since
		}
		over = s.unread[c.uid]+wire.MaxMessage > maxUnreadPerUser
	}
	n := s.unread[c.uid]
	s.mu.Unlock()
	if !over {
		return nil
	}
	// Not served, and not dropped at once either, so that a client that
	// connects again straight away gains nothing: held, reading nothing,
	// for sendTimeout (a parked goroutine, woken by the read deadline).
	c.c.SetReadDeadline(time.Now().Add(sendTimeout))
	c.rc.Read(func(uintptr) bool { return false })
	c.c.SetReadDeadline(time.Time{})
	s.mu.Lock()
	c.sendLocked(errReply(wire.CodeTooMany, fmt.Sprintf("uid %d's connections leave %d KiB of replies unread, more than %d KiB: read them, or close them", c.uid, n>>10, maxUnreadPerUser>>10), ""))
	s.mu.Unlock()
	return errUnread
}

// awaitRead waits up to d for the client to have read what it was sent,
// as far as the socket counts it writable again.
func (c *conn) awaitRead(d time.Duration) error {
	c.c.SetWriteDeadline(time.Now().Add(d))
	defer c.c.SetWriteDeadline(time.Time{})
	return c.rc.Write(func(fd uintptr) bool {
		n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}, 0)
		return n > 0 // false: wait for the poller to say writable
	})
}

// sendListing sends a page of a listing from the connection's own
// goroutine.
func (c *conn) sendListing(b []byte) error {
	err := c.sendRaw(b)
	c.s.mu.Lock()
	c.noteUnreadLocked()
	c.s.mu.Unlock()
	return err
}

// noteUnreadLocked looks at how much the client has left unread.
func (c *conn) noteUnreadLocked() {
	n := 0
	if !c.closed {
		c.rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) })
	}
	c.setUnreadLocked(n)
}

func (c *conn) setUnreadLocked(n int) {
	s := c.s
	if s.unread[c.uid] += n - c.unread; s.unread[c.uid] <= 0 {
		delete(s.unread, c.uid)
	}
	c.unread = n
}

// serve handles one request; false closes the connection.
func (c *conn) serve(req *wire.Request) bool {
	s := c.s
	switch req.Op {
	case wire.OpPing:
		s.mu.Lock()
		defer s.mu.Unlock()
		return c.sendLocked(&wire.Reply{Type: wire.TypePong}) == nil
	case wire.OpAcquire:
		return s.acquire(c, req)
	case wire.OpSession:
		return s.session(c, req)
	case wire.OpSubmit, wire.OpList, wire.OpShow, wire.OpCancel, wire.OpWait, wire.OpTaskDone, wire.OpNotStarted,
		wire.OpHold, wire.OpRelease, wire.OpRequeue, wire.OpHistory:
		return s.taskOp(c, req)
	case wire.OpStatus, wire.OpUsage, wire.OpLeaseHistory:
		return s.statusOp(c, req)
	case wire.OpSlurmProlog, wire.OpSlurmEpilog, wire.OpSlurmHold, wire.OpSlurmTask:
		return s.slurmOp(c, req)
	case wire.OpContainer:
		return s.containerOp(c, req)
	case wire.OpDrain, wire.OpUndrain:
		return s.drainOp(c, req)
	case wire.OpReload:
		return s.reloadOp(c, req)
	default:
		s.mu.Lock()
		defer s.mu.Unlock()
		c.sendLocked(errReply(wire.CodeBadRequest, fmt.Sprintf("unknown operation %q", req.Op), ""))
		return false
	}
}
