package lease

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
)

// TestStaleSocket: a socket that accepts but never answers (a dead
// broker's, held a moment by a child it was starting) is replaced; a broker
// that answers is not.
func TestStaleSocket(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(1))

	// A second broker on a live one's socket refuses to start.
	out, err := exec.Command(b.Bin.Broker, "serve", "--config", b.Conf, "--run-dir", filepath.Join(b.Dir, "run2"),
		"--socket", b.Socket, "--state-dir", filepath.Join(b.Dir, "spool2")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another broker is serving there") {
		t.Fatalf("second broker on a live socket: %v, %s; want a refusal", err, out)
	}
	b.Stop()

	// A listener that never accepts stands where the broker's socket was.
	if err := os.Remove(b.Socket); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: b.Socket}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 8); err != nil {
		t.Fatal(err)
	}
	b.Start() // fails the test unless the broker serves
	if out, err := b.Npurun("--no-wait", "true").CombinedOutput(); err != nil {
		t.Fatalf("npurun against the broker that replaced a stale socket: %v, %s", err, out)
	}
}
