package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
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
)

// Conn is a client connection to the broker. It uses raw system calls
// only: npurun sits in front of every job and its start-up is measured.
type Conn struct {
	fd  int
	buf []byte
	oob []byte
}

// Dial connects to the broker's socket.
func Dial(path string) (*Conn, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
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
		return nil, fmt.Errorf("connect %s: %w", path, err)
	}
	return &Conn{fd: fd, buf: make([]byte, MaxMessage), oob: make([]byte, oobSpace)}, nil
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
	return SendMsg(c.fd, b, nil, 0)
}

// Recv waits up to timeout (forever when timeout < 0) for one reply and
// the descriptors it carries. An error reply is returned as *Error.
func (c *Conn) Recv(timeout time.Duration) (*Reply, []int, error) {
	if timeout >= 0 {
		deadline := time.Now().Add(timeout)
		for {
			ms := int(time.Until(deadline) / time.Millisecond)
			if ms < 0 {
				ms = 0
			}
			pfd := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}}
			n, err := unix.Poll(pfd, ms)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return nil, nil, fmt.Errorf("poll: %w", err)
			}
			if n > 0 {
				break
			}
			if ms == 0 {
				return nil, nil, ErrTimeout
			}
		}
	}
	b, fds, err := RecvMsg(c.fd, c.buf, c.oob, 0)
	if err != nil {
		return nil, nil, err
	}
	rp, ok, err := decodeReply(b)
	if err == nil && !ok {
		rp = new(Reply)
		err = json.Unmarshal(b, rp)
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
