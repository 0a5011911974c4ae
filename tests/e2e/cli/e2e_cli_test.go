package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// TestExitStatuses: npurun's own failures have distinct statuses and say
// why on standard error.
func TestExitStatuses(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(2))
	h := harness.Hold(t, b, "holder", "-n", "2")
	defer h.Release()
	for _, tc := range []struct {
		name string
		args []string
		env  []string // added to the broker's environment
		code int
		want []string // each must appear in the output
	}{
		{"no-wait when busy", []string{"--no-wait", "true"}, nil, 75, []string{"npurun: ", "no device free"}},
		{"no-wait on a held device", []string{"--no-wait", "-d", "1", "true"}, nil, 75, []string{"npurun: ", "npu 1 is in use"}},
		{"timeout", []string{"--timeout", "300ms", "true"}, nil, 75, []string{"npurun: gave up after 300ms"}},
		// Quiet, the message still says what it waited for (issue 14.5).
		{"timeout, quiet", []string{"-q", "--timeout", "1s", "-d", "1", "true"}, nil, 75, []string{"npurun: gave up after 1s waiting for device 1 in pool \"default\": 1st in line\n"}},
		{"more than the pool", []string{"-n", "3", "true"}, nil, 77, []string{"npurun: ", "3 devices", "only 2"}},
		{"no such device", []string{"-d", "99", "true"}, nil, 2, []string{"npurun: ", "no npu 99"}},
		{"no such pool", []string{"-p", "nope", "true"}, nil, 2, []string{"npurun: ", `"nope"`}},
		{"no broker", []string{"true"}, []string{"NPURUN_SOCKET=" + filepath.Join(b.Dir, "absent.sock")}, 69, []string{"npurun: ", "npurun: hint:"}},
		{"no command", nil, nil, 2, []string{"npurun: no command given"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := b.Npurun(tc.args...)
			cmd.Env = append(cmd.Env, tc.env...)
			code, out := harness.ExitCode(t, cmd)
			if code != tc.code {
				t.Fatalf("npurun %s: exit %d, want %d; output:\n%s", strings.Join(tc.args, " "), code, tc.code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

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

// TestConfigErrors: check-config and serve name every problem by file, line
// and key.
func TestConfigErrors(t *testing.T) {
	bin := harness.Bins(t)
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.conf", harness.FakeConfig(4)+"[pools]\na = \"0-1\"\nb = \"2-3\"\n[limits]\nmax_devices = 2\n")
	bad := write("bad.conf", harness.FakeConfig(4)+`[pools]
a = "0-1"
b = "1-5"
[limits]
max_device = 2
[broker]
max_connections = 0
`)
	syntax := write("syntax.conf", "[devices]\nvendor = \"fake\"\nids = \"0-3\n")

	for _, tc := range []struct {
		name string
		args []string
		code int
		out  []string // in standard output
		err  []string // in standard error
	}{
		{"valid", []string{"check-config", good}, 0, []string{good + ": ok"}, nil},
		{"several errors", []string{"check-config", bad}, 1, nil, []string{
			bad + ":6: [pools] b: device 1 is in both pools",
			bad + ":6: [pools] b: devices 4-5 are not in [devices] ids",
			bad + ":8: [limits] max_device: unknown key",
			bad + ":10: [broker] max_connections: must be at least 1",
		}},
		{"syntax error", []string{"check-config", syntax}, 1, nil, []string{syntax + ":3"}},
		{"missing file", []string{"check-config", filepath.Join(dir, "absent.conf")}, 1, nil, []string{"absent.conf"}},
		{"serve refuses a bad config", []string{"serve", "--config", bad, "--run-dir", filepath.Join(dir, "run")}, 1, nil, []string{
			bad + ":6: [pools] b:",
			bad + ":8: [limits] max_device:",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin.Broker, tc.args...)
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.code {
				t.Fatalf("npubroker %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(tc.args, " "), code, tc.code, &stdout, &stderr)
			}
			for _, w := range tc.out {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("standard output lacks %q:\n%s", w, &stdout)
				}
			}
			for _, w := range tc.err {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("standard error lacks %q:\n%s", w, &stderr)
				}
			}
		})
	}
}
