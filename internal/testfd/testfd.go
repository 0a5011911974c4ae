// Package testfd holds what the lease tests do to a descriptor in flight:
// put it in a socket's queue, where nobody holds it but the queue, and
// take it out again later. Only tests import it.
package testfd

import (
	"testing"

	"golang.org/x/sys/unix"
)

// InFlight sends fd over one end of a socketpair that nobody reads and
// closes fd: the descriptor is then held by the socket's queue alone. It
// returns the other end, from which Receive takes it later; the test's
// cleanup closes that end.
func InFlight(t testing.TB, fd int) int {
	t.Helper()
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Sendmsg(sp[0], []byte("x"), unix.UnixRights(fd), nil, 0); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	unix.Close(sp[0])
	t.Cleanup(func() { unix.Close(sp[1]) })
	return sp[1]
}

// Receive takes the descriptor waiting on socket s.
func Receive(t testing.TB, s int) int {
	t.Helper()
	buf, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(s, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		t.Fatalf("no descriptor: %v", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		t.Fatalf("no descriptor: %v", err)
	}
	return fds[0]
}
