package status

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
)

// TestLogInjection: a process whose name a user chose — a newline, a line
// that looks like the broker's, an escape sequence — is named in the
// broker's log as one printable line (issue 14.13): its unleased use of a
// device node is logged with the control characters shown as "?".
func TestLogInjection(t *testing.T) {
	dev := harness.FakeDev(t, 2)
	// The test runs as root, whom unleased_exempt_users exempts by default.
	b := harness.StartBroker(t, harness.AscendConfig(dev, 2, "[status]\nscan_interval = \"1s\"\nunleased_grace = \"1s\"\nunleased_exempt_users = []\n"))
	forged := "innocent\nnpubroker: npu 3: lease of alice (inline) from before this start goes on\x1b[2J"
	node, err := os.Open(filepath.Join(dev, "davinci1"))
	if err != nil {
		t.Fatal(err)
	}
	sleeper := &exec.Cmd{Path: "/bin/sleep", Args: []string{forged, "600"}, Stdin: node}
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	node.Close()
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })

	b.WaitLogWithin(0, "innocent", harness.ScanTimeout) // its own line: another process may be seen first
	log := b.Log()
	want := "(" + harness.Me(t) + ": innocent?npubroker: npu 3: lease of alice (inline) from before this start goes on?[2J 600) has " + dev + "/davinci1 open without a lease"
	if !strings.Contains(log, want) {
		t.Errorf("the log lacks %q:\n%q", want, log)
	}
	for _, line := range strings.Split(log, "\n") {
		if strings.HasPrefix(line, "npubroker: npu 3:") {
			t.Errorf("a forged line in the broker's log: %q", line)
		}
	}
	if i := strings.IndexFunc(log, func(r rune) bool { return r < 0x20 && r != '\n' || r == 0x7f }); i >= 0 {
		t.Errorf("a control character in the broker's log at %d: %q", i, log)
	}
}

// TestLogToSyslog: a broker whose standard error goes nowhere (/dev/null,
// as an init script starts a daemon) logs to the system log at /dev/log,
// a datagram a line in syslog(3)'s form, warnings as such; one whose
// standard error is kept logs there (every other test reads it so), and
// --log stderr keeps it there. /dev/log is the test's own socket, in a
// mount namespace whose /dev is a tmpfs.
func TestLogToSyslog(t *testing.T) {
	b := harness.NewBroker(t, harness.FakeConfig(2))
	dir := harness.SharedDir(t)
	sock := filepath.Join(dir, "log")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lines := make(chan string, 100)
	go func() {
		buf := make([]byte, 65536)
		for {
			n, err := l.Read(buf)
			if err != nil {
				close(lines)
				return
			}
			lines <- string(buf[:n])
		}
	}()
	next := func(what string) string {
		t.Helper()
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("the system log closed before %s", what)
			}
			return line
		case <-time.After(harness.EventTimeout):
			t.Fatalf("nothing in the system log for %s within %s", what, harness.EventTimeout)
		}
		return ""
	}
	// /dev is a tmpfs here: null, and log linked to the test's socket.
	const setup = `mount -t tmpfs tmpfs /dev; mknod -m 666 /dev/null c 1 3; ln -s "$1" /dev/log; shift; `
	serve := func(stderr string, args ...string) *exec.Cmd {
		full := append([]string{sock, b.Bin.Broker, "serve", "--config", b.Conf, "--run-dir", filepath.Join(dir, "run"), "--state-dir", b.StateDir, "--cgroup", "off"}, args...)
		return harness.InMountNS(t, nil, setup+`exec "$@" `+stderr, full...)
	}

	// Standard error to /dev/null: the system log. A socket outside the
	// run directory draws a warning, at severity warning.
	cmd := serve("2>/dev/null", "--socket", filepath.Join(dir, "elsewhere.sock"))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	form := regexp.MustCompile(`^<(\d+)>[A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d npubroker\[(\d+)\]: (.*)$`)
	var serving string
	for serving == "" {
		line := next("the serving line")
		m := form.FindStringSubmatch(line)
		switch {
		case m == nil:
			t.Fatalf("not in syslog(3)'s form: %q", line)
		case strings.HasPrefix(m[3], "warning: socket"):
			if m[1] != "28" {
				t.Errorf("a warning at priority %s, want 28 (daemon.warning): %q", m[1], line)
			}
		case strings.HasPrefix(m[3], "serving fake npu 0-1"):
			if m[1] != "30" {
				t.Errorf("priority %s, want 30 (daemon.info): %q", m[1], line)
			}
			serving = line
		}
	}
	// The client's socket works; the broker stops on SIGTERM, and says so
	// in the system log too.
	cl := exec.Command(b.Bin.Npurun, "true")
	cl.Env = append(os.Environ(), "NPURUN_SOCKET="+filepath.Join(dir, "elsewhere.sock"))
	if o, err := cl.CombinedOutput(); err != nil {
		t.Fatalf("npurun against the broker: %v\n%s", err, o)
	}
	// unshare execs sh, which execs the broker: its pid is the broker's.
	cmd.Process.Signal(os.Interrupt)
	for {
		if line := next("the stop"); strings.HasSuffix(line, "]: stopped") {
			break
		}
	}
	cmd.Wait()
	if out.Len() > 0 {
		t.Errorf("output beside the system log: %q", out.String())
	}

	// Standard error kept (a pipe), or --log stderr: nothing to the system
	// log, the lines on standard error.
	for _, tc := range []struct {
		name, redirect string
		args           []string
	}{{"stderr a pipe", "", nil}, {"--log stderr", "2>&1", []string{"--log", "stderr"}}} {
		cmd := serve(tc.redirect, append([]string{"--socket", filepath.Join(dir, "run", "broker.sock")}, tc.args...)...)
		p := harness.StartProc(t, tc.name, cmd)
		p.WaitLine("npubroker: serving fake npu 0-1")
		cmd.Process.Signal(os.Interrupt)
		p.Wait()
		select {
		case line := <-lines:
			t.Errorf("%s: a line in the system log: %q", tc.name, line)
		default:
		}
	}
}

// TestNoBrokerHint: with no broker, npurun, task-submit and npubroker
// status say how to start one as fits the machine: systemctl where systemd
// runs it (/run/systemd/system is a directory), npubroker serve where it
// does not (issue 14.7). That is root's to do: an ordinary user is told
// to ask their administrator, and shown no command (issue 27.26). /run is
// a tmpfs of the test's in a mount namespace, with and without that
// directory.
func TestNoBrokerHint(t *testing.T) {
	b := harness.Bins(t)
	u := harness.NewUser(t)
	asUser := fmt.Sprintf("setpriv --reuid=%d --regid=%d --clear-groups ", u.UID, u.GID)
	absent := filepath.Join(harness.SharedDir(t), "absent.sock")
	for _, tc := range []struct {
		name, setup, want string
	}{
		{"systemd", "mount -t tmpfs tmpfs /run; mkdir -p /run/systemd/system; exec ", "hint: start the broker with 'systemctl start npubroker', or point NPURUN_SOCKET at a running one"},
		{"no systemd", "mount -t tmpfs tmpfs /run; exec ", "hint: start the broker as root with 'npubroker serve' (npubroker(8), WITHOUT SYSTEMD), or point NPURUN_SOCKET at a running one"},
		{"systemd, a user", "mount -t tmpfs tmpfs /run; mkdir -p /run/systemd/system; exec " + asUser, "hint: the broker is not running: ask your administrator to start it, or point NPURUN_SOCKET at a running one"},
		{"no systemd, a user", "mount -t tmpfs tmpfs /run; exec " + asUser, "hint: the broker is not running: ask your administrator to start it, or point NPURUN_SOCKET at a running one"},
	} {
		for _, client := range [][]string{{b.Npurun, "true"}, {b.TaskSubmit, "list"}, {b.Broker, "status"}} {
			name := filepath.Base(client[0])
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				code, out := harness.ExitCode(t, harness.InMountNS(t, []string{"NPURUN_SOCKET=" + absent}, tc.setup+`"$@"`, client...))
				if code != 69 || !strings.Contains(out, name+": no broker at "+absent) || !strings.Contains(out, name+": "+tc.want) {
					t.Errorf("exit %d, want 69 and %q; output:\n%s", code, tc.want, out)
				}
				if strings.HasSuffix(tc.name, "a user") && (strings.Contains(out, "systemctl") || strings.Contains(out, "npubroker serve")) {
					t.Errorf("an ordinary user is shown root's command to start the broker:\n%s", out)
				}
			})
		}
	}
}
