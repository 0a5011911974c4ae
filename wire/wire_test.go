package wire

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pair is a connected SOCK_SEQPACKET socket pair, closed with the test.
func pair(t *testing.T) (int, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return fds[0], fds[1]
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func bufs() ([]byte, []byte) {
	return make([]byte, MaxMessage), make([]byte, oobSpace)
}

func TestSendRecvPassesDescriptors(t *testing.T) {
	a, b := pair(t)
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	devNull, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(devNull)

	if err := SendMsg(a, []byte(`{"type":"grant"}`), []int{p[1], devNull}, 0); err != nil {
		t.Fatal(err)
	}
	buf, oob := bufs()
	data, fds, err := RecvMsg(b, buf, oob, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if string(data) != `{"type":"grant"}` {
		t.Errorf("payload %q", data)
	}
	if len(fds) != 2 {
		t.Fatalf("%d descriptors received, want 2", len(fds))
	}
	for _, fd := range fds {
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err != nil || flags&unix.FD_CLOEXEC == 0 {
			t.Errorf("received descriptor %d is not close-on-exec (flags %d, %v)", fd, flags, err)
		}
	}
	// The first one is the pipe's write end: what goes in comes out of ours.
	if _, err := unix.Write(fds[0], []byte("x")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 1)
	if n, err := unix.Read(p[0], got); err != nil || n != 1 || got[0] != 'x' {
		t.Fatalf("read through passed pipe: %d %q %v", n, got, err)
	}
}

func TestRecvTooLarge(t *testing.T) {
	a, b := pair(t)
	devNull, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(devNull)
	before := openFDs(t)
	if err := SendMsg(a, make([]byte, 100), []int{devNull}, 0); err != nil {
		t.Fatal(err)
	}
	_, oob := bufs()
	data, fds, err := RecvMsg(b, make([]byte, 10), oob, 0)
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("RecvMsg of 100 bytes into 10: %q, %v, %v; want ErrTooLarge", data, fds, err)
	}
	if after := openFDs(t); after != before {
		t.Errorf("descriptors of the oversized packet left open: %d before, %d after", before, after)
	}
}

func TestRecvDescriptorsTruncated(t *testing.T) {
	a, b := pair(t)
	devNull, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(devNull)
	before := openFDs(t)
	if err := SendMsg(a, []byte("{}"), []int{devNull, devNull, devNull}, 0); err != nil {
		t.Fatal(err)
	}
	buf, _ := bufs()
	_, _, err = RecvMsg(b, buf, make([]byte, unix.CmsgSpace(4)), 0)
	if !errors.Is(err, ErrFDsTruncated) {
		t.Fatalf("RecvMsg with room for one of three descriptors: %v, want ErrFDsTruncated", err)
	}
	if after := openFDs(t); after != before {
		t.Errorf("descriptors that did arrive left open: %d before, %d after", before, after)
	}
}

func TestRecvClosed(t *testing.T) {
	a, b := pair(t)
	if err := SendMsg(a, []byte("last"), nil, 0); err != nil {
		t.Fatal(err)
	}
	unix.Shutdown(a, unix.SHUT_WR)
	buf, oob := bufs()
	if data, _, err := RecvMsg(b, buf, oob, 0); err != nil || string(data) != "last" {
		t.Fatalf("RecvMsg: %q, %v; want the pending message first", data, err)
	}
	if _, _, err := RecvMsg(b, buf, oob, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("RecvMsg at end of stream: %v, want ErrClosed", err)
	}
}

func TestRecvDontWait(t *testing.T) {
	_, b := pair(t)
	buf, oob := bufs()
	if _, _, err := RecvMsg(b, buf, oob, unix.MSG_DONTWAIT); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("RecvMsg with nothing pending and MSG_DONTWAIT: %v, want EAGAIN", err)
	}
}

func TestEncodeTooLarge(t *testing.T) {
	if _, err := Encode(&Request{V: Version, Op: OpAcquire, Pool: strings.Repeat("x", MaxMessage)}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Encode of an oversized request: %v, want ErrTooLarge", err)
	}
	b, err := Encode(&Request{V: Version, Op: OpPing})
	if err != nil || string(b) != `{"v":1,"op":"ping"}` {
		t.Fatalf("Encode(ping) = %s, %v", b, err)
	}
}

// connPair is a Conn talking to a raw peer descriptor.
func connPair(t *testing.T) (*Conn, int) {
	a, b := pair(t)
	buf, oob := bufs()
	return &Conn{fd: a, buf: buf, oob: oob}, b
}

func TestConnRecv(t *testing.T) {
	devNull, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(devNull)

	t.Run("error reply", func(t *testing.T) {
		c, peer := connPair(t)
		SendMsg(peer, []byte(`{"v":1,"type":"error","code":"busy","message":"npu 0 is in use","hint":"wait"}`), nil, 0)
		_, _, err := c.Recv(time.Second)
		var e *Error
		if !errors.As(err, &e) || e.Code != CodeBusy || e.Message != "npu 0 is in use" || e.Hint != "wait" {
			t.Fatalf("Recv: %v, want *Error busy with message and hint", err)
		}
	})
	t.Run("grant with its descriptor", func(t *testing.T) {
		c, peer := connPair(t)
		SendMsg(peer, []byte(`{"v":1,"type":"grant","devices":[3]}`), []int{devNull}, 0)
		r, fds, err := c.Recv(time.Second)
		if err != nil || r.Type != TypeGrant || len(fds) != 1 {
			t.Fatalf("Recv: %+v %v %v", r, fds, err)
		}
		unix.Close(fds[0])
	})
	t.Run("grant missing a descriptor", func(t *testing.T) {
		c, peer := connPair(t)
		before := openFDs(t)
		SendMsg(peer, []byte(`{"v":1,"type":"grant","devices":[3,4]}`), []int{devNull}, 0)
		if _, _, err := c.Recv(time.Second); err == nil {
			t.Fatal("Recv accepted a grant of two devices with one descriptor")
		}
		if after := openFDs(t); after != before {
			t.Errorf("descriptor of the bad grant left open: %d before, %d after", before, after)
		}
	})
	t.Run("descriptor on a non-grant is dropped", func(t *testing.T) {
		c, peer := connPair(t)
		before := openFDs(t)
		SendMsg(peer, []byte(`{"v":1,"type":"queued","position":2}`), []int{devNull}, 0)
		r, fds, err := c.Recv(time.Second)
		if err != nil || r.Type != TypeQueued || r.Position != 2 || len(fds) != 0 {
			t.Fatalf("Recv: %+v %v %v", r, fds, err)
		}
		if after := openFDs(t); after != before {
			t.Errorf("descriptor of a queued reply left open: %d before, %d after", before, after)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		c, _ := connPair(t)
		if _, _, err := c.Recv(20 * time.Millisecond); !errors.Is(err, ErrTimeout) {
			t.Fatalf("Recv with nothing sent: %v, want ErrTimeout", err)
		}
	})
	t.Run("peer gone", func(t *testing.T) {
		c, peer := connPair(t)
		unix.Shutdown(peer, unix.SHUT_WR)
		if _, _, err := c.Recv(time.Second); !errors.Is(err, ErrClosed) {
			t.Fatalf("Recv after the peer closed: %v, want ErrClosed", err)
		}
	})
}

func TestDialNoBroker(t *testing.T) {
	_, err := Dial(t.TempDir() + "/absent.sock")
	if !errors.Is(err, ErrNoBroker) {
		t.Fatalf("Dial of a missing socket: %v, want ErrNoBroker", err)
	}
}

// TestStartBy: an estimated start as people read it.
func TestStartBy(t *testing.T) {
	now := time.Date(2026, 11, 26, 11, 0, 0, 0, time.Local)
	for _, tc := range []struct {
		at   int64
		want string
	}{
		{0, "start unknown"},
		{now.Add(-time.Second).UnixMilli(), "starts now"},
		{now.Add(90 * time.Minute).UnixMilli(), "starts by 12:30"},
		{now.Add(26 * time.Hour).UnixMilli(), "starts by Nov 27 13:00"},
	} {
		if got := StartBy(tc.at, now); got != tc.want {
			t.Errorf("StartBy(%d): %q, want %q", tc.at, got, tc.want)
		}
	}
}

func TestWanted(t *testing.T) {
	for _, tc := range []struct {
		n     int
		mem   int64
		named string
		want  string
	}{
		{1, 0, "", "1 device"},
		{3, 0, "", "3 devices"},
		{2, 0, "npu 2,3", "npu 2,3"},
		{1, 12 * 1024, "", "12G of 1 device"},
		{2, 8 * 1024, "", "8G of each of 2 devices"},
		{2, 1536, "npu 2,3", "1.5G of each of npu 2,3"},
	} {
		if got := Wanted(tc.n, tc.mem, tc.named); got != tc.want {
			t.Errorf("Wanted(%d, %d, %q) = %q, want %q", tc.n, tc.mem, tc.named, got, tc.want)
		}
	}
}
