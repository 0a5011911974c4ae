package lease

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// rawConn is a protocol connection driven by hand, to send what no client
// would.
type rawConn struct {
	t  *testing.T
	fd int
}

func rawDial(t *testing.T, b *harness.Broker) *rawConn {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: b.Socket}); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	c := &rawConn{t: t, fd: fd}
	t.Cleanup(c.close)
	return c
}

func (c *rawConn) close() {
	if c.fd >= 0 {
		unix.Close(c.fd)
		c.fd = -1
	}
}

func (c *rawConn) send(b []byte, fds ...int) {
	c.t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if err := unix.Sendmsg(c.fd, b, oob, nil, unix.MSG_NOSIGNAL); err != nil {
		c.t.Fatalf("send %d bytes: %v", len(b), err)
	}
}

// recv waits for the next packet: a reply, or nil at end of stream.
func (c *rawConn) recv() *wire.Reply {
	c.t.Helper()
	pfd := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(pfd, int(harness.EventTimeout/time.Millisecond))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			c.t.Fatal(err)
		}
		if n == 0 {
			c.t.Fatalf("no reply and no close within %s", harness.EventTimeout)
		}
		break
	}
	buf := make([]byte, wire.MaxMessage+1)
	oob := make([]byte, unix.CmsgSpace(wire.MaxDevices*4))
	data, fds, err := wire.RecvMsg(c.fd, buf, oob, 0)
	for _, fd := range fds {
		unix.Close(fd)
	}
	if errors.Is(err, wire.ErrClosed) || errors.Is(err, unix.ECONNRESET) {
		return nil
	}
	if err != nil {
		c.t.Fatal(err)
	}
	var r wire.Reply
	if err := json.Unmarshal(data, &r); err != nil {
		c.t.Fatalf("reply %q: %v", data, err)
	}
	return &r
}

func (c *rawConn) request(req wire.Request) []byte {
	b, err := json.Marshal(req)
	if err != nil {
		c.t.Fatal(err)
	}
	return b
}

// expectRejected checks that the next packet is a bad-request error (or,
// when replyOptional, that there is none) and that the broker then closes
// the connection.
func (c *rawConn) expectRejected(replyOptional bool) {
	c.t.Helper()
	r := c.recv()
	switch {
	case r == nil && replyOptional:
		return
	case r == nil:
		c.t.Fatal("connection closed without an error reply")
	case r.Type != wire.TypeError || r.Code != wire.CodeBadRequest:
		c.t.Fatalf("reply %+v, want an error with code %q", r, wire.CodeBadRequest)
	case r.V != wire.Version:
		c.t.Errorf("error reply carries version %d, want %d", r.V, wire.Version)
	}
	if r := c.recv(); r != nil {
		c.t.Fatalf("after the error reply got %+v, want the connection closed", r)
	}
}

// brokerServes checks that the broker still answers and grants.
func brokerServes(t *testing.T, b *harness.Broker) {
	t.Helper()
	c := rawDial(t, b)
	c.send(c.request(wire.Request{V: wire.Version, Op: wire.OpPing}))
	if r := c.recv(); r == nil || r.Type != wire.TypePong {
		t.Fatalf("ping: got %+v, want pong", r)
	}
	if code, out := harness.ExitCode(t, b.Npurun("--timeout", "5s", "true")); code != 0 {
		t.Fatalf("npurun true after the bad client: exit %d: %s", code, out)
	}
}

// TestMalformedMessages: malformed input gets a bad-request error and a
// closed connection; the broker serves on.
func TestMalformedMessages(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(2))
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	ping := `{"v":1,"op":"ping"}`
	for _, tc := range []struct {
		name          string
		msg           []byte
		fds           []int
		replyOptional bool // no reply is also fine (nothing to tell apart from a close)
	}{
		{name: "garbage", msg: []byte("\x00\xffnot json{")},
		{name: "json but not an object", msg: []byte(`[1,2,3]`)},
		{name: "wrong version", msg: []byte(`{"v":2,"op":"ping"}`)},
		{name: "no version", msg: []byte(`{"op":"ping"}`)},
		{name: "unknown op", msg: []byte(`{"v":1,"op":"frobnicate"}`)},
		{name: "negative count", msg: []byte(`{"v":1,"op":"acquire","n":-1}`)},
		{name: "device named twice", msg: []byte(`{"v":1,"op":"acquire","devices":[1,1]}`)},
		{name: "70 KiB", msg: []byte(`{"v":1,"op":"ping","pool":"` + strings.Repeat("x", 70<<10) + `"}`)},
		{name: "descriptor attached", msg: []byte(ping), fds: []int{int(devNull.Fd())}},
		{name: "zero length", msg: []byte{}, replyOptional: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := rawDial(t, b)
			c.send(tc.msg, tc.fds...)
			c.expectRejected(tc.replyOptional)
			brokerServes(t, b)
		})
	}

	t.Run("second acquire while waiting", func(t *testing.T) {
		h := harness.Hold(t, b, "holder", "-n", "2")
		defer h.Release()
		c := rawDial(t, b)
		acquire := c.request(wire.Request{V: wire.Version, Op: wire.OpAcquire, N: 1})
		c.send(acquire)
		if r := c.recv(); r == nil || r.Type != wire.TypeQueued {
			t.Fatalf("first acquire: %+v, want queued", r)
		}
		c.send(acquire)
		c.expectRejected(false)
	})

	t.Run("closed while waiting", func(t *testing.T) {
		w := harness.NewWorkload(t)
		h := harness.Hold(t, b, "holder", "-n", "2")
		c := rawDial(t, b)
		c.send(c.request(wire.Request{V: wire.Version, Op: wire.OpAcquire, N: 2}))
		if r := c.recv(); r == nil || r.Type != wire.TypeQueued {
			t.Fatalf("acquire: %+v, want queued", r)
		}
		// A waiter behind the one that goes away.
		next := harness.Queue(t, b, "next", append([]string{"-n", "2"}, w.Args(b, "next", 0)...)...)
		c.close()
		h.Release()
		next.MustSucceed()
		brokerServes(t, b)
	})

	if strings.Contains(b.Log(), "panic") {
		t.Errorf("broker log:\n%s", b.Log())
	}
}
