package slurm

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestLogTrouble: trouble goes to the system log's socket as one
// datagram of facility daemon, level warning, control characters
// replaced.
func TestLogTrouble(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	old := syslogPath
	syslogPath = path
	defer func() { syslogPath = old }()
	logTrouble("job 42: no broker\nat /run/x")
	tv := unix.NsecToTimeval(int64(5 * time.Second))
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	buf := make([]byte, 512)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		t.Fatalf("nothing logged: %v", err)
	}
	got := string(buf[:n])
	if !strings.HasPrefix(got, "<28>npurun-slurm[") || !strings.HasSuffix(got, "]: job 42: no broker?at /run/x") {
		t.Errorf("logged %q", got)
	}
	syslogPath = filepath.Join(t.TempDir(), "none")
	logTrouble("nobody listens") // must not block or fail
}
