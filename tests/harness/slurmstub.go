package harness

import (
	"encoding/json"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/wire"
)

// stubBroker is a socket that speaks the broker's framing and answers
// what its handler says: for the clients of operations the broker does
// not serve yet (the Slurm ones), and for answers a broker would never
// give (silence). Each request is recorded with its sender's credentials.
type stubBroker struct {
	Socket string

	mu   sync.Mutex
	reqs []StubRequest
	got  chan struct{} // closed and replaced on every request
}

// StubRequest is one request the stub received.
type StubRequest struct {
	Req  wire.Request
	Cred unix.Ucred
}

// StubAnswer is what the stub sends back: replies in turn, the last one
// with fds (closed after the send); none leaves the connection silent.
type StubAnswer struct {
	Replies []wire.Reply
	FDs     []int
}

// StartStub listens on a SOCK_SEQPACKET socket in a directory others may
// enter and answers each request with handle's answer.
func StartStub(t testing.TB, handle func(StubRequest) StubAnswer) *stubBroker {
	t.Helper()
	dir := SharedDir(t)
	s := &stubBroker{Socket: filepath.Join(dir, "broker.sock"), got: make(chan struct{})}
	ln, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(ln, &unix.SockaddrUnix{Name: s.Socket}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(s.Socket, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(ln, 64); err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	var mu sync.Mutex
	var open []int
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			fd, _, err := unix.Accept4(ln, unix.SOCK_CLOEXEC)
			if err == unix.EINTR || err == unix.ECONNABORTED {
				continue
			}
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, fd)
			mu.Unlock()
			conns.Add(1)
			go func() {
				defer conns.Done()
				s.serve(fd, handle)
			}()
		}
	}()
	t.Cleanup(func() {
		unix.Shutdown(ln, unix.SHUT_RDWR)
		unix.Close(ln)
		<-done
		mu.Lock()
		for _, fd := range open {
			unix.Shutdown(fd, unix.SHUT_RDWR)
		}
		mu.Unlock()
		conns.Wait()
	})
	return s
}

func (s *stubBroker) serve(fd int, handle func(StubRequest) StubAnswer) {
	defer unix.Close(fd)
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return
	}
	buf := make([]byte, wire.MaxMessage)
	for {
		n, _, _, _, err := unix.Recvmsg(fd, buf, nil, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return
		}
		var r StubRequest
		r.Cred = *cred
		if json.Unmarshal(buf[:n], &r.Req) != nil {
			return
		}
		s.mu.Lock()
		s.reqs = append(s.reqs, r)
		close(s.got)
		s.got = make(chan struct{})
		s.mu.Unlock()
		a := handle(r)
		for i, rep := range a.Replies {
			rep.V = wire.Version
			b, _ := json.Marshal(&rep)
			var fds []int
			if i == len(a.Replies)-1 {
				fds = a.FDs
			}
			wire.SendMsg(fd, b, fds, 0)
		}
		for _, f := range a.FDs {
			unix.Close(f)
		}
	}
}

// Requests returns the requests received so far.
func (s *stubBroker) Requests() []StubRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]StubRequest(nil), s.reqs...)
}
