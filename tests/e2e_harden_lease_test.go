package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestStaleDescriptorTakesNothing: a client that keeps its lease's
// descriptor, unlocks it and waits in flock on it gets nothing when later
// leases of that device end: the next lease is granted as usual, and the
// kept descriptor's lock is not the device's.
func TestStaleDescriptorTakesNothing(t *testing.T) {
	b := StartBroker(t, FakeConfig(1))

	thief := startProc(t, "thief", b.Npurun("-d", "0", b.Bin.Workload, "-relock"))
	thief.waitLine("unlocked npu0")

	for i := range 3 {
		h := hold(t, b, fmt.Sprintf("holder %d", i), "-d", "0")
		h.release()
	}
	// Were the kept descriptor on the device's lock file, it would have
	// raced the broker for it at each release above and won: the device
	// would never come free again.
	next := startProc(t, "next", b.Npurun("-d", "0", "--timeout", "10s", "sh", "-c", `echo "held $NPURUN_DEVICES"; read x; exit 0`))
	next.waitLine("held 0")
	thief.waitLine("relocked npu0") // it has a lock, just not the device's

	// And the thief's descriptor does not pass for a lease either.
	cmd := b.Npurun("-v", "--no-wait", "true")
	cmd.Env = append(cmd.Env, "NPURUN_LEASE=0:3")
	cmd.ExtraFiles = []*os.File{lockedCopyOf(t, thief)}
	if code, out := exitCode(t, cmd); code != 75 || strings.Contains(out, "inside a lease") {
		t.Fatalf("an earlier lease's descriptor: exit %d, want 75 from asking the broker; output:\n%s", code, out)
	}
	next.stdin.Close()
	next.mustSucceed()
}

// lockedCopyOf opens the thief's lease descriptor (its first lease fd, 3)
// through /proc: the same file, but a new open file, which is then locked;
// the file is the thief's old lock, now nobody's.
func lockedCopyOf(t *testing.T, p *proc) *os.File {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/fd/3", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	// The thief holds the old file's lock; release it so that ours can.
	p.stdin.Close()
	p.mustSucceed()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatalf("lock the old lock file: %v", err)
	}
	return f
}

// TestForgedLeaseFile: a lock file of the user's own making, named like the
// broker's and flocked, is not a lease.
func TestForgedLeaseFile(t *testing.T) {
	b := StartBroker(t, FakeConfig(1))
	h := hold(t, b, "holder")
	defer h.release()

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
	if code, out := exitCode(t, cmd); code != 75 || strings.Contains(out, "inside a lease") {
		t.Fatalf("self-made %s: exit %d, want 75 from asking the broker; output:\n%s", fake, code, out)
	}
}

// TestOneBrokerPerDirectory: a second broker on the run directory or the
// state directory of a live one refuses to start and names its pid; once
// the first is gone (even by kill -9) the directories are free.
func TestOneBrokerPerDirectory(t *testing.T) {
	b := StartBroker(t, FakeConfig(1))
	b.mu.Lock()
	pid := b.cmd.Process.Pid
	b.mu.Unlock()

	for _, tc := range []struct{ name, runDir, stateDir string }{
		{"state directory", filepath.Join(b.Dir, "run2"), b.StateDir},
		{"run directory", b.RunDir, filepath.Join(b.Dir, "spool2")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A broker that does start would serve for ever: bounded.
			ctx, cancel := context.WithTimeout(context.Background(), eventTimeout)
			defer cancel()
			cmd := exec.CommandContext(ctx, b.Bin.Broker, "serve", "--config", b.Conf, "--run-dir", tc.runDir,
				"--socket", filepath.Join(tc.runDir, "other.sock"), "--state-dir", tc.stateDir)
			code, out := exitCode(t, cmd)
			want := fmt.Sprintf("another broker uses it (pid %d)", pid)
			if code != 1 || !strings.Contains(out, want) {
				t.Fatalf("second broker on the same %s: exit %d, output:\n%s\nwant exit 1 and %q", tc.name, code, out, want)
			}
		})
	}
	if _, err := os.Stat(b.Socket); err != nil {
		t.Fatalf("the refused broker touched the live one's socket: %v", err)
	}
	h := hold(t, b, "holder") // the first broker still serves
	h.release()

	b.Kill()
	b.Start() // fails the test unless it serves
	hold(t, b, "after restart").release()
}

// TestSocketMode: everyone may connect (identity comes from SO_PEERCRED).
func TestSocketMode(t *testing.T) {
	b := StartBroker(t, FakeConfig(1))
	var st unix.Stat_t
	if err := unix.Lstat(b.Socket, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK || st.Mode&0o777 != 0o666 {
		t.Fatalf("socket mode %o, want a socket with mode 0666", st.Mode)
	}
}
