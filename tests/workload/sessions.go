package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/wire"
)

// sessions asks the broker at $NPURUN_SOCKET for n login sessions of its
// own user, one after the other, each with origin ("SERVICE,TTY,RHOST")
// and ended at once by closing its lease's descriptors, as a user's own
// raw session requests may; says "sessions N"; then, with hold, asks for
// one more, says "holding" and keeps it until standard input closes.
func sessions(n int, origin string, hold bool) {
	f := strings.SplitN(origin, ",", 3)
	for len(f) < 3 {
		f = append(f, "")
	}
	one := func() []int {
		c := mustDial(wire.SocketPath(""))
		defer c.Close()
		if err := c.Send(&wire.Request{Op: wire.OpSession, Login: true, Service: f[0], TTY: f[1], RHost: f[2]}); err != nil {
			fail("session", err)
		}
		for {
			r, fds, err := c.Recv(30 * time.Second)
			if err != nil {
				fail("session", err)
			}
			switch r.Type {
			case wire.TypeQueued:
				continue
			case wire.TypeGrant:
				return fds
			}
			fail("session", fmt.Errorf("reply %q: %s", r.Type, r.Message))
		}
	}
	for range n {
		for _, fd := range one() {
			unix.Close(fd)
		}
	}
	fmt.Printf("sessions %d\n", n)
	if hold {
		one()
		fmt.Println("holding")
		io.Copy(io.Discard, os.Stdin)
	}
}
