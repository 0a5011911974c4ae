package wire

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/quantity"
)

// DefaultSocket is where the broker listens unless told otherwise.
const DefaultSocket = "/run/npurun/broker.sock"

// SocketPath is the socket a client uses: flag, then $NPURUN_SOCKET, then
// DefaultSocket.
func SocketPath(flag string) string {
	if flag != "" {
		return flag
	}
	if s := os.Getenv("NPURUN_SOCKET"); s != "" {
		return s
	}
	return DefaultSocket
}

// Sentinel errors of the client side.
var (
	// ErrNoBroker means no broker is there: nothing at the path, nothing
	// listening, or something that is not the broker's socket.
	ErrNoBroker = errors.New("no broker")
	// ErrTimeout means no message came before the deadline.
	ErrTimeout = errors.New("timed out")
	// ErrNoAnswer means a broker is there but did not answer in time: it
	// accepted no connection, or said nothing to a request, for FirstAnswer.
	ErrNoAnswer = errors.New("the broker does not answer")
)

// FirstAnswer bounds how long a client waits for the broker to take its
// connection, and then for the first answer to each request. A request
// that waits for devices is answered at once all the same (granted, or
// told its place in line); one whose real answer may take hours (wait for
// a task) is followed by a ping, whose answer shows the broker serves.
const FirstAnswer = 10 * time.Second

// Conn is a client connection to the broker. It uses raw system calls
// only: npurun sits in front of every job and its start-up is measured.
type Conn struct {
	fd    int
	path  string
	buf   []byte
	oob   []byte
	asked time.Time // a request waits for its first answer since then; zero once answered
	pings int       // pings sent by Send whose pong is still to come
}

// Dial connects to the broker's socket.
func Dial(path string) (*Conn, error) { return DialWithin(path, FirstAnswer) }

// DialWithin connects to the broker's socket, waiting at most within for
// a broker whose listen queue is full to take the connection (and for
// each send later on).
func DialWithin(path string, within time.Duration) (*Conn, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	// A broker that accepts nothing (stalled, out of descriptors) leaves a
	// connect waiting while its listen queue is full; the send timeout
	// bounds that wait (and a send to a broker that reads nothing).
	tv := unix.NsecToTimeval(int64(within))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("socket: %w", err)
	}
	for {
		err = unix.Connect(fd, &unix.SockaddrUnix{Name: path})
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		if why := noBroker(path, err); why != "" {
			return nil, fmt.Errorf("%w at %s: %s", ErrNoBroker, path, why)
		}
		if err == unix.EAGAIN {
			return nil, fmt.Errorf("%w at %s: it took no connection for %s", ErrNoAnswer, path, quantity.Duration(within))
		}
		return nil, fmt.Errorf("connect %s: %w", path, err)
	}
	return &Conn{fd: fd, path: path, buf: make([]byte, MaxMessage), oob: make([]byte, oobSpace)}, nil
}

// noBroker says why connect's err means that no broker is at path, or
// returns "" when err means something else (such as no permission).
func noBroker(path string, err error) string {
	switch err {
	case unix.ENOENT:
		return "no such file"
	case unix.ENOTDIR:
		return "a part of the path is not a directory"
	case unix.ENOTSOCK:
		return "not a socket"
	case unix.EPROTOTYPE:
		return "the socket there is of another type than the broker's"
	case unix.ECONNREFUSED:
		// Connecting to a file that is not a socket is refused too.
		var st unix.Stat_t
		if unix.Stat(path, &st) != nil {
			return "nothing listens there"
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFSOCK:
			return "nothing listens on the socket"
		case unix.S_IFDIR:
			return "a directory, not a socket"
		case unix.S_IFREG:
			return "a regular file, not a socket"
		}
		return "not a socket"
	}
	return ""
}

// Close closes the connection; a waiting request is thereby cancelled.
func (c *Conn) Close() error { return unix.Close(c.fd) }

// FD is the connection's descriptor, for poll(2) beside others.
func (c *Conn) FD() int { return c.fd }

// Send sends one request, filling in the protocol version.
func (c *Conn) Send(req *Request) error {
	req.V = Version
	b, ok := appendRequest(nil, req)
	if !ok {
		var err error
		if b, err = Encode(req); err != nil {
			return err
		}
	}
	if len(b) > MaxMessage {
		return ErrTooLarge
	}
	if c.asked.IsZero() {
		c.asked = time.Now()
	}
	if err := c.send(b); err != nil {
		if Gone(err) {
			// A broker that refuses the connection (at its cap) says
			// why and closes it, maybe before the request went: its
			// reason is there to read, and is the error then.
			if _, _, rerr := c.pending(); errors.As(rerr, new(*Error)) {
				return rerr
			}
		}
		return err
	}
	if req.Op == OpWait {
		// Its answer comes when the task ends; the pong comes now.
		if err := c.send([]byte(`{"v":` + strconv.Itoa(Version) + `,"op":"` + OpPing + `"}`)); err != nil {
			return err
		}
		c.pings++
	}
	return nil
}

func (c *Conn) send(b []byte) error {
	err := SendMsg(c.fd, b, nil, 0)
	if err == unix.EAGAIN {
		return fmt.Errorf("%w at %s: it read nothing for %s", ErrNoAnswer, c.path, quantity.Duration(FirstAnswer))
	}
	return err
}

// Recv waits up to timeout (forever when timeout < 0) for one reply and
// the descriptors it carries. An error reply is returned as *Error. The
// first answer to a request must come within FirstAnswer, whatever the
// timeout: ErrNoAnswer otherwise.
func (c *Conn) Recv(timeout time.Duration) (*Reply, []int, error) {
	var deadline time.Time
	if timeout >= 0 {
		deadline = time.Now().Add(timeout)
	}
	for {
		until, silent := deadline, false
		if !c.asked.IsZero() {
			if first := c.asked.Add(FirstAnswer); until.IsZero() || first.Before(until) {
				until, silent = first, true
			}
		}
		if !until.IsZero() {
			ready, err := c.poll(until)
			switch {
			case err != nil:
				return nil, nil, err
			case !ready && silent:
				return nil, nil, fmt.Errorf("%w at %s: no answer for %s", ErrNoAnswer, c.path, quantity.Duration(FirstAnswer))
			case !ready:
				return nil, nil, ErrTimeout
			}
		}
		r, fds, err := c.read()
		c.asked = time.Time{} // answered, if only by closing
		if err == nil && r.Type == TypePong && c.pings > 0 {
			c.pings--
			continue
		}
		return r, fds, err
	}
}

// poll waits until the connection is readable or until has passed.
func (c *Conn) poll(until time.Time) (bool, error) {
	for {
		ms := int(time.Until(until) / time.Millisecond)
		if ms < 0 {
			ms = 0
		}
		pfd := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, ms)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("poll: %w", err)
		}
		if n > 0 {
			return true, nil
		}
		if ms == 0 {
			return false, nil
		}
	}
}

// read reads and decodes one reply. A connection reset with a reply
// still queued (a broker at its connection cap says why and closes the
// connection, whose request it never read: the kernel reports the reset
// before the queue) gives that reply.
func (c *Conn) read() (*Reply, []int, error) {
	b, fds, err := RecvMsg(c.fd, c.buf, c.oob, 0)
	if err == unix.ECONNRESET {
		if r, fds, perr := c.pending(); r != nil {
			return r, fds, perr
		}
	}
	if err != nil {
		return nil, nil, err
	}
	return c.decode(b, fds)
}

// pending reads a reply already queued on the connection, without
// waiting: nil, nil, and an error when there is none.
func (c *Conn) pending() (*Reply, []int, error) {
	b, fds, err := RecvMsg(c.fd, c.buf, c.oob, unix.MSG_DONTWAIT)
	if err != nil {
		return nil, nil, err
	}
	return c.decode(b, fds)
}

// decode decodes reply b, which came with fds.
func (c *Conn) decode(b []byte, fds []int) (*Reply, []int, error) {
	rp, ok, err := decodeReply(b)
	if err == nil && !ok {
		if full == nil {
			err = ErrNoCodec
		} else {
			rp = new(Reply)
			err = full.Unmarshal(b, rp)
		}
	}
	if err != nil {
		closeAll(fds)
		return nil, nil, fmt.Errorf("decode reply: %w", err)
	}
	r := *rp
	if r.Type != TypeGrant && len(fds) > 0 {
		closeAll(fds) // descriptors only belong to grants
		fds = nil
	}
	if r.Type == TypeGrant && len(fds) != len(r.Devices) {
		closeAll(fds)
		return nil, nil, fmt.Errorf("grant of %d devices came with %d descriptors", len(r.Devices), len(fds))
	}
	if r.Type == TypeError {
		return &r, nil, &Error{Code: r.Code, Message: r.Message, Hint: r.Hint}
	}
	return &r, fds, nil
}

// Gone tells whether err, from a send or a receive on a connection, means
// that the peer went away: it closed the connection (ErrClosed), or it was
// reset (a broker that died with the connection still unaccepted, or with
// a request unread), or a send found it closed (EPIPE).
func Gone(err error) bool {
	return errors.Is(err, ErrClosed) || errors.Is(err, unix.ECONNRESET) || errors.Is(err, unix.EPIPE)
}
