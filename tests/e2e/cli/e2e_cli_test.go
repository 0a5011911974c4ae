package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// TestReentrancy: an npurun inside a lease recognises the lease and runs
// its command without asking again; a lease variable that names no held
// lock is not trusted.
func TestReentrancy(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(1))
	npurun := b.Bin.Npurun

	t.Run("nested npurun does not deadlock", func(t *testing.T) {
		// One device: asking the broker again could only wait for ever;
		// the inner --timeout turns that deadlock into a failure.
		code, out := harness.ExitCode(t, b.Npurun("sh", "-c", npurun+` -v --timeout 5s sh -c 'echo "inner $NPURUN_DEVICES"'`))
		if code != 0 {
			t.Fatalf("exit %d; output:\n%s", code, out)
		}
		if !strings.Contains(out, "inside a lease") || !strings.Contains(out, "inner 0") {
			t.Errorf("inner npurun did not run inside the outer lease:\n%s", out)
		}
	})

	t.Run("nested request beyond the lease", func(t *testing.T) {
		code, out := harness.ExitCode(t, b.Npurun("sh", "-c", npurun+" -n 2 true"))
		if code != 1 || !strings.Contains(out, "inside a lease") {
			t.Fatalf("exit %d, want 1 with a message naming the lease; output:\n%s", code, out)
		}
	})

	// The broker's own lock file, open but not locked by us.
	lockFile := filepath.Join(b.RunDir, "locks", "npu0.lock")
	for _, tc := range []struct {
		name  string
		lease string
		extra func(t *testing.T) *os.File // becomes descriptor 3
	}{
		{"stdin", "0:0", nil},
		{"not a number", "0:x", nil},
		{"closed descriptor", "0:9", nil},
		{"lock file not locked", "0:3", func(t *testing.T) *os.File {
			f, err := os.Open(lockFile)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			return f
		}},
	} {
		t.Run("forged "+tc.name, func(t *testing.T) {
			h := harness.Hold(t, b, "holder")
			defer h.Release()
			cmd := b.Npurun("-v", "--no-wait", "true")
			cmd.Env = append(cmd.Env, "NPURUN_LEASE="+tc.lease)
			if tc.extra != nil {
				cmd.ExtraFiles = []*os.File{tc.extra(t)}
			}
			// The only device is held: asking the broker gives 75; trusting
			// the forged lease would run the command.
			code, out := harness.ExitCode(t, cmd)
			if code != 75 || strings.Contains(out, "inside a lease") {
				t.Fatalf("NPURUN_LEASE=%s: exit %d, want 75 from asking the broker; output:\n%s", tc.lease, code, out)
			}
		})
	}
}
