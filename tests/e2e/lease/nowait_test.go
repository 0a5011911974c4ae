package lease

import (
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// TestNoWaitAfterExit: `npurun --no-wait` right after another npurun of
// the same device has exited is granted, every time, as users script it
// (a loop of --no-wait runs). The kernel lets the lease's lock go as its
// last holder exits, before the shell hears of the exit; the broker's
// watcher records the end a moment later, and a --no-wait request that
// came meanwhile was refused "npu 0 is in use" (exit 75).
func TestNoWaitAfterExit(t *testing.T) {
	// As it comes: 200 runs in a row, each started once the previous
	// one has exited. Under load (the race detector, a busy machine) the
	// watcher is late now and then: refused within 200 runs more often
	// than not before the fix.
	t.Run("in a row", func(t *testing.T) {
		b := harness.StartBroker(t, harness.FakeConfig(1))
		const runs = 200
		for i := range runs {
			for _, args := range [][]string{{"-d", "0"}, {"-n", "1"}} {
				args = append(args, "--no-wait", "true")
				if code, out := harness.ExitCode(t, b.Npurun(args...)); code != 0 {
					t.Fatalf("run %d of %d: npurun %q, right after the previous one exited: exit %d: %s", i+1, runs, args, code, out)
				}
			}
		}
	})
	// The watcher late every time (NPUBROKER_TEST_HOOK=late-release
	// holds it a while once its flock has returned, before it records
	// the end): the window a loaded machine opens now and then.
	t.Run("watcher late", func(t *testing.T) {
		b := harness.StartBrokerEnv(t, harness.FakeConfig(1), "NPUBROKER_TEST_HOOK=late-release")
		for i := range 5 {
			for _, args := range [][]string{{"-d", "0"}, {"-n", "1"}} {
				args = append(args, "--no-wait", "true")
				if code, out := harness.ExitCode(t, b.Npurun(args...)); code != 0 {
					t.Fatalf("run %d: npurun %q, right after the previous one exited: exit %d: %s", i+1, args, code, out)
				}
			}
		}
		// A holder that ends: the next --no-wait is granted.
		h := harness.Hold(t, b, "holder", "-d", "0")
		h.Release()
		if code, out := harness.ExitCode(t, b.Npurun("-d", "0", "--no-wait", "true")); code != 0 {
			t.Fatalf("npurun -d 0 --no-wait right after the holder of npu 0 exited: exit %d: %s", code, out)
		}
		// A holder that runs on: refused at once, its lease left be.
		h = harness.Hold(t, b, "holder", "-d", "0")
		start := time.Now()
		if code, out := harness.ExitCode(t, b.Npurun("-d", "0", "--no-wait", "true")); code != 75 {
			t.Fatalf("npurun -d 0 --no-wait while npu 0 is held: exit %d, want 75: %s", code, out)
		}
		if d := time.Since(start); d > promptly {
			t.Errorf("npurun -d 0 --no-wait while npu 0 is held took %s to be refused, want within %s", d, promptly)
		}
		h.Release()
	})
}

// TestLoginAfterLogout: a restricted login that is not to wait
// (on_busy = "deny") right after the previous login's session ended gets
// the login lease; the broker's watcher late (the test hook), as above.
// The end is the watcher's own: the previous user's ACL entry on the
// device's node is gone before the next user's lease begins.
func TestLoginAfterLogout(t *testing.T) {
	dev := harness.NewDevTree(t, 1)
	users := []harness.TestUser{harness.NewUser(t), harness.NewUser(t)}
	conf := dev.Config("0", fmt.Sprintf("[restrict]\nusers = [%q, %q]\non_busy = \"deny\"\n", users[0].Name, users[1].Name))
	b := harness.StartBrokerEnv(t, conf, "NPUBROKER_TEST_HOOK=late-release")
	node := dev.Node("davinci0")
	for i := range 4 {
		u, prev := users[i%2], users[(i+1)%2]
		c := b.Dial()
		if err := c.Send(&wire.Request{Op: wire.OpSession, User: u.Name, Service: "login", TTY: "tty1", Login: true}); err != nil {
			t.Fatal(err)
		}
		r, fds, err := c.Recv(harness.EventTimeout)
		if err != nil || r.Type != wire.TypeGrant || len(fds) != 1 {
			t.Fatalf("login %d, of %s, right after the previous session ended: %+v, %d descriptors, %v", i+1, u.Name, r, len(fds), err)
		}
		if !harness.CanOpen(t, u, node) || i > 0 && harness.CanOpen(t, prev, node) {
			t.Errorf("login %d, of %s: %s may open %s: %v, and %s (whose session ended): %v",
				i+1, u.Name, u.Name, node, harness.CanOpen(t, u, node), prev.Name, harness.CanOpen(t, prev, node))
		}
		unix.Close(fds[0]) // the session ends
		c.Close()
	}
}
