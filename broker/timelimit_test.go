package broker

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/wire"
)

// TestTimeLimitTimerEnds: a lease with a time limit of a century that
// ends at once leaves no timer behind (the broker kept every one until
// its century had passed).
func TestTimeLimitTimerEnds(t *testing.T) {
	s, sock, _ := startServer(t, "[devices]\nvendor = \"fake\"\nids = \"0-1\"\n", t.TempDir())
	c, err := wire.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const leases = 20
	for range leases {
		if err := c.Send(&wire.Request{Op: wire.OpAcquire, N: 1, TimeSec: wire.MaxTimeSec}); err != nil {
			t.Fatal(err)
		}
		rep, fds, err := c.Recv(20 * time.Second)
		for err == nil && rep.Type == wire.TypeQueued {
			rep, fds, err = c.Recv(20 * time.Second)
		}
		if err != nil || rep.Type != wire.TypeGrant {
			t.Fatalf("acquire: %+v, %v", rep, err)
		}
		for _, fd := range fds {
			unix.Close(fd) // the lease ends
		}
	}
	for deadline := time.Now().Add(20 * time.Second); s.timeLimits() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d time limit timers kept after their %d leases ended", s.timeLimits(), leases)
		}
	}
}
