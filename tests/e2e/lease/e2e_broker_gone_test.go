package lease

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
)

// goneBroker is a socket at the broker's path whose "broker" goes away in
// the middle of every request, as one that dies or restarts then does:
//
//	close    takes the connection and closes it at once
//	read     takes the connection, reads the request, and closes it
//	pending  takes nothing, and closes its listening socket once a
//	         connection waits (the kernel resets it)
//
// It ends conns connections so (0: every one), then stops listening and
// removes its socket; done is closed then.
type goneBroker struct {
	fd   int
	path string
	n    atomic.Int32 // connections ended
	done chan struct{}
}

func startGoneBroker(t *testing.T, path, mode string, conns int) *goneBroker {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 16); err != nil {
		t.Fatal(err)
	}
	f := &goneBroker{fd: fd, path: path, done: make(chan struct{})}
	go f.serve(mode, conns)
	t.Cleanup(f.stop)
	return f
}

func (f *goneBroker) serve(mode string, conns int) {
	defer close(f.done)
	defer os.Remove(f.path)
	defer unix.Close(f.fd)
	for conns == 0 || int(f.n.Load()) < conns {
		if mode == "pending" {
			// A connection waits unaccepted: closing the listening
			// socket resets it.
			for {
				n, err := unix.Poll([]unix.PollFd{{Fd: int32(f.fd), Events: unix.POLLIN}}, -1)
				if n > 0 || (err != nil && err != unix.EINTR) {
					break
				}
			}
			f.n.Add(1)
			return
		}
		c, _, err := unix.Accept4(f.fd, unix.SOCK_CLOEXEC)
		if err == unix.EINTR || err == unix.ECONNABORTED {
			continue
		}
		if err != nil {
			return // stopped
		}
		if mode == "read" {
			buf := make([]byte, 64<<10)
			unix.Read(c, buf)
		}
		unix.Close(c)
		f.n.Add(1)
	}
}

// stop ends the fake broker, if it still listens.
func (f *goneBroker) stop() {
	unix.Shutdown(f.fd, unix.SHUT_RDWR) // wakes an accept
	<-f.done
}

// delayedSend wraps an npurun command in strace so that its first
// sendmsg, the request, starts a second late: a fake broker that closes
// at once has closed by then, and the request meets a closed peer (EPIPE),
// the case of a broker gone between connect and request.
func delayedSend(t *testing.T, cmd *exec.Cmd) *exec.Cmd {
	t.Helper()
	strace, err := exec.LookPath("strace")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no strace (.ci/run installs it): %v", err)
		}
		t.Skip("no strace here")
	}
	cmd.Args = append([]string{strace, "-f", "-qq", "-o", "/dev/null", "-e", "trace=sendmsg", "-e", "inject=sendmsg:delay_enter=1000000:when=1"}, cmd.Args...)
	cmd.Path = strace
	return cmd
}

// goneModes are the ways a broker goes away during a request.
var goneModes = []struct {
	name, mode string
	delayed    bool
}{
	{"closes at once", "close", false},
	{"closes before the request is sent", "close", true},
	{"reads the request and closes", "read", false},
	{"dies with the connection unaccepted", "pending", false},
}

// TestBrokerGoneNoWait: npurun --no-wait whose broker goes away during
// the request exits 69 (no broker), saying so, and does not reconnect.
func TestBrokerGoneNoWait(t *testing.T) {
	for _, m := range goneModes {
		t.Run(m.name, func(t *testing.T) {
			b := harness.NewBroker(t, harness.FakeConfig(1)) // its paths; a fake at its socket
			f := startGoneBroker(t, b.Socket, m.mode, 1)
			cmd := b.Npurun("-v", "--no-wait", "true")
			if m.delayed {
				cmd = delayedSend(t, cmd)
			}
			p := harness.StartProc(t, "npurun --no-wait", cmd)
			code, _ := p.Wait()
			<-p.OutDone
			out := p.Output()
			if code != 69 || !strings.Contains(out, "npurun: the broker went away before it answered") || strings.Contains(out, "reconnecting") {
				t.Errorf("exit %d, want 69 saying the broker went away, without reconnecting; output:\n%s", code, out)
			}
			<-f.done
			if n := f.n.Load(); n != 1 {
				t.Errorf("the fake broker saw %d connections, want 1", n)
			}
		})
	}
}

// TestBrokerGoneReconnects: a waiting npurun whose broker goes away during
// the request, however it goes, reconnects and gets its device from the
// broker that comes back.
func TestBrokerGoneReconnects(t *testing.T) {
	for _, m := range goneModes {
		t.Run(m.name, func(t *testing.T) {
			b := harness.NewBroker(t, harness.FakeConfig(1))
			f := startGoneBroker(t, b.Socket, m.mode, 1)
			cmd := b.Npurun("-v", "--timeout", "60s", "sh", "-c", `echo "ran on $NPURUN_DEVICES"`)
			if m.delayed {
				cmd = delayedSend(t, cmd)
			}
			p := harness.StartProc(t, "npurun", cmd)
			p.WaitLine("npurun: the broker went away; reconnecting")
			<-f.done
			b.Start()
			p.WaitLine("ran on 0")
			p.MustSucceed()
		})
	}
}

// TestBrokerGoneEveryTime: a broker that goes away at every request
// counts, after 11 times in a row, as no broker (69), not as a wait for
// ever.
func TestBrokerGoneEveryTime(t *testing.T) {
	b := harness.NewBroker(t, harness.FakeConfig(1))
	f := startGoneBroker(t, b.Socket, "close", 0)
	p := harness.StartProc(t, "npurun", b.Npurun("-v", "true"))
	code, _ := p.Wait()
	<-p.OutDone
	if out := p.Output(); code != 69 || !strings.Contains(out, "the broker went away 11 times in a row without answering") {
		t.Errorf("exit %d, want 69 after 11 tries; output:\n%s", code, out)
	}
	if n := f.n.Load(); n != 11 {
		t.Errorf("the fake broker saw %d connections, want 11", n)
	}
}

// TestBrokerKilledWhileQueued: the real broker killed (-9) while npurun
// waits in line; npurun reconnects to the restarted broker, queues again,
// and runs once the device is released.
func TestBrokerKilledWhileQueued(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(1))
	h := harness.Hold(t, b, "holder")
	q := harness.Queue(t, b, "waiter", "sh", "-c", `echo "ran on $NPURUN_DEVICES"`)
	b.Kill()
	q.WaitLine("npurun: the broker went away; reconnecting")
	b.Start()
	h.Release()
	q.WaitLine("ran on 0")
	q.MustSucceed()
}

// TestBrokerGoneHint: a broker that goes away before it answers (here, it
// dies with the connection unaccepted) makes npurun --no-wait, task-submit
// and npubroker status say the hint of wire.Hint, one for all three:
// root is shown where the broker's log is (journalctl where systemd runs
// the machine), an ordinary user is told to try again or tell their
// administrator, and shown no administrator's command (issue 27.26;
// npurun told everyone to "see 'journalctl -u npubroker'"). /run is a
// tmpfs of the test's in a mount namespace, with and without systemd's
// directory.
func TestBrokerGoneHint(t *testing.T) {
	b := harness.Bins(t)
	u := harness.NewUser(t)
	asUser := fmt.Sprintf("setpriv --reuid=%d --regid=%d --clear-groups ", u.UID, u.GID)
	for _, tc := range []struct {
		name, setup, want string
	}{
		{"systemd", "mount -t tmpfs tmpfs /run; mkdir -p /run/systemd/system; exec ", "hint: it may be restarting, or failing: try again, or see 'journalctl -u npubroker'"},
		{"no systemd", "mount -t tmpfs tmpfs /run; exec ", "hint: it may be restarting, or failing: try again, or see its log (its standard error, or the system log)"},
		{"systemd, a user", "mount -t tmpfs tmpfs /run; mkdir -p /run/systemd/system; exec " + asUser, "hint: it may be restarting, or failing: try again later, or tell your administrator"},
	} {
		for _, client := range [][]string{{b.Npurun, "--no-wait", "true"}, {b.TaskSubmit, "list"}, {b.Broker, "status"}} {
			name := filepath.Base(client[0])
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				sock := filepath.Join(harness.SharedDir(t), "gone.sock")
				f := startGoneBroker(t, sock, "pending", 1)
				if err := os.Chmod(sock, 0o666); err != nil {
					t.Fatal(err)
				}
				code, out := harness.ExitCode(t, harness.InMountNS(t, []string{"NPURUN_SOCKET=" + sock}, tc.setup+`"$@"`, client...))
				if code != 69 || !strings.Contains(out, name+": the broker went away before it answered") || !strings.Contains(out, name+": "+tc.want) {
					t.Errorf("exit %d, want 69 and %q; output:\n%s", code, tc.want, out)
				}
				if strings.HasSuffix(tc.name, "a user") && (strings.Contains(out, "journalctl") || strings.Contains(out, "systemctl")) {
					t.Errorf("an ordinary user is shown an administrator's command:\n%s", out)
				}
				<-f.done
			})
		}
	}
}
