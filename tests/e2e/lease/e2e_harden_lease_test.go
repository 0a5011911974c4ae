package lease

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// TestStaleDescriptorTakesNothing: a client that keeps its lease's
// descriptor, unlocks it and waits in flock on it gets nothing when later
// leases of that device end: the next lease is granted as usual, and the
// kept descriptor's lock is not the device's.
func TestStaleDescriptorTakesNothing(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(1))

	thief := harness.StartProc(t, "thief", b.Npurun("-d", "0", b.Bin.Workload, "-relock"))
	thief.WaitLine("unlocked npu0")
	// The broker sees the lease end: the device is free again. Only then
	// does the thief wait in flock on its kept descriptor (were it quicker,
	// it would only go on with its own lease).
	free := harness.StartProc(t, "free", b.Npurun("-d", "0", "--timeout", "10s", "true"))
	free.MustSucceed()
	if _, err := io.WriteString(thief.Stdin, "\n"); err != nil {
		t.Fatal(err)
	}

	for i := range 3 {
		h := harness.Hold(t, b, fmt.Sprintf("holder %d", i), "-d", "0")
		h.Release()
	}
	// Were the kept descriptor on the device's lock file, it would have
	// raced the broker for it at each release above and won: the device
	// would never come free again.
	next := harness.StartProc(t, "next", b.Npurun("-d", "0", "--timeout", "10s", "sh", "-c", `echo "held $NPURUN_DEVICES"; read x; exit 0`))
	next.WaitLine("held 0")
	thief.WaitLine("relocked npu0") // it has a lock, just not the device's

	// And the thief's descriptor does not pass for a lease either.
	cmd := b.Npurun("-v", "--no-wait", "true")
	cmd.Env = append(cmd.Env, "NPURUN_LEASE=0:3")
	cmd.ExtraFiles = []*os.File{lockedCopyOf(t, thief)}
	if code, out := harness.ExitCode(t, cmd); code != 75 || strings.Contains(out, "inside a lease") {
		t.Fatalf("an earlier lease's descriptor: exit %d, want 75 from asking the broker; output:\n%s", code, out)
	}
	next.Stdin.Close()
	next.MustSucceed()
}

// lockedCopyOf opens the thief's lease descriptor (its first lease fd, 3)
// through /proc: the same file, but a new open file, which is then locked;
// the file is the thief's old lock, now nobody's.
func lockedCopyOf(t *testing.T, p *harness.Proc) *os.File {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/fd/3", p.Cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	// The thief holds the old file's lock; release it so that ours can.
	p.Stdin.Close()
	p.MustSucceed()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatalf("lock the old lock file: %v", err)
	}
	return f
}

// TestForgedLeaseFile: a lock file of the user's own making, named like the
// broker's and flocked, is not a lease.
func TestForgedLeaseFile(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(1))
	h := harness.Hold(t, b, "holder")
	defer h.Release()

	fake := filepath.Join(t.TempDir(), "npu0.lock")
	f, err := os.Create(fake)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	cmd := b.Npurun("-v", "--no-wait", "true")
	cmd.Env = append(cmd.Env, "NPURUN_LEASE=0:3")
	cmd.ExtraFiles = []*os.File{f}
	if code, out := harness.ExitCode(t, cmd); code != 75 || strings.Contains(out, "inside a lease") {
		t.Fatalf("self-made %s: exit %d, want 75 from asking the broker; output:\n%s", fake, code, out)
	}
}

// TestOneBrokerPerDirectory: a second broker on the run directory or the
// state directory of a live one refuses to start and names its pid; once
// the first is gone (even by kill -9) the directories are free.
func TestOneBrokerPerDirectory(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(1))
	b.Mu.Lock()
	pid := b.Cmd.Process.Pid
	b.Mu.Unlock()

	for _, tc := range []struct{ name, runDir, stateDir string }{
		{"state directory", filepath.Join(b.Dir, "run2"), b.StateDir},
		{"run directory", b.RunDir, filepath.Join(b.Dir, "spool2")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A broker that does start would serve for ever: bounded.
			ctx, cancel := context.WithTimeout(context.Background(), harness.EventTimeout)
			defer cancel()
			cmd := exec.CommandContext(ctx, b.Bin.Broker, "serve", "--config", b.Conf, "--run-dir", tc.runDir,
				"--socket", filepath.Join(tc.runDir, "other.sock"), "--state-dir", tc.stateDir)
			code, out := harness.ExitCode(t, cmd)
			want := fmt.Sprintf("another broker uses it (pid %d)", pid)
			if code != 1 || !strings.Contains(out, want) {
				t.Fatalf("second broker on the same %s: exit %d, output:\n%s\nwant exit 1 and %q", tc.name, code, out, want)
			}
		})
	}
	if _, err := os.Stat(b.Socket); err != nil {
		t.Fatalf("the refused broker touched the live one's socket: %v", err)
	}
	h := harness.Hold(t, b, "holder") // the first broker still serves
	h.Release()

	b.Kill()
	b.Start() // fails the test unless it serves
	harness.Hold(t, b, "after restart").Release()
}

// TestSocketMode: everyone may connect (identity comes from SO_PEERCRED).
func TestSocketMode(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(1))
	var st unix.Stat_t
	if err := unix.Lstat(b.Socket, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK || st.Mode&0o777 != 0o666 {
		t.Fatalf("socket mode %o, want a socket with mode 0666", st.Mode)
	}
}

// TestSilentBroker: a broker that takes no connection, or takes one and
// says nothing, is reported within wire.FirstAnswer with exit 69, by
// npurun and task-submit alike; nobody hangs in the listen queue.
func TestSilentBroker(t *testing.T) {
	bin := harness.Bins(t)
	sock := filepath.Join(t.TempDir(), "silent.sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) }) // after the parallel subtests
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	// A queue of one: the first client is queued and never answered, the
	// next find the queue full.
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		cmd  string
		args []string
	}{
		{"npurun queued", bin.Npurun, []string{"--no-wait", "true"}},
		{"npurun queue full", bin.Npurun, []string{"true"}},
		{"task-submit list", bin.TaskSubmit, []string{"list"}},
		{"task-submit wait", bin.TaskSubmit, []string{"wait", "1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), wire.FirstAnswer+harness.EventTimeout)
			defer cancel()
			cmd := exec.CommandContext(ctx, tc.cmd, tc.args...)
			cmd.Env = append(os.Environ(), "NPURUN_SOCKET="+sock)
			code, out := harness.ExitCode(t, cmd)
			if code != 69 || !strings.Contains(out, "does not answer") {
				t.Fatalf("%s against a silent broker: exit %d, want 69 naming the silence; output:\n%s", tc.name, code, out)
			}
		})
	}
}

// TestProgressStaysFlat: as grants move a long line up, a waiter is not
// told of every move (that costs the broker a message per waiter per
// grant), yet whoever becomes next in line is told so at once.
func TestProgressStaysFlat(t *testing.T) {
	const waiters, steps = 200, 20
	b := harness.StartBroker(t, harness.FakeConfig(1))
	h := harness.Hold(t, b, "holder")
	conns := make([]*wire.Conn, waiters)
	for i := range conns {
		conns[i] = b.Dial()
		if err := conns[i].Send(&wire.Request{Op: wire.OpAcquire, N: 1}); err != nil {
			t.Fatal(err)
		}
	}
	// Everyone hears their place once; the places say the order (the
	// connections' requests reach the broker in no set order).
	line := make([]*wire.Conn, waiters)
	for i, c := range conns {
		r, _, err := c.Recv(harness.EventTimeout)
		if err != nil || r.Type != wire.TypeQueued || r.Position < 1 || r.Position > waiters || line[r.Position-1] != nil {
			t.Fatalf("waiter %d: %+v %v, want queued at a place of its own", i, r, err)
		}
		line[r.Position-1] = c
	}
	conns = line
	h.Release()
	// Each step: the head is granted and holds its device until the next
	// has heard that it is next, then lets go. Each step so spans at least
	// one round of reports.
	for i := range steps {
		var held []int
		for held == nil {
			r, fds, err := conns[i].Recv(harness.EventTimeout)
			if err != nil {
				t.Fatalf("waiter %d: %v", i, err)
			}
			if r.Type == wire.TypeGrant {
				held = fds
			}
		}
		for {
			r, _, err := conns[i+1].Recv(harness.EventTimeout)
			if err != nil {
				t.Fatalf("waiter %d, next after a grant: %v", i+1, err)
			}
			if r.Position == 1 {
				break
			}
		}
		for _, fd := range held {
			unix.Close(fd)
		}
	}
	// What the rest were sent meanwhile.
	sent := 0
	for _, c := range conns[steps+1:] {
		for {
			_, _, err := c.Recv(0)
			if err != nil {
				break
			}
			sent++
		}
	}
	rest := waiters - steps - 1
	if limit := 5 * rest; sent > limit {
		t.Fatalf("%d waiters were sent %d progress messages over %d grants (%.1f each), want at most %d", rest, sent, steps, float64(sent)/float64(rest), limit)
	}
	t.Logf("%d waiters were sent %d progress messages over %d grants", rest, sent, steps)
}
