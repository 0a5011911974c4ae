package broker

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestLogLinesPrintable: whatever a message carries — a newline, an
// escape sequence, bytes that are not UTF-8 — the log gets one printable
// line for it, cut at MaxLogLine.
func TestLogLinesPrintable(t *testing.T) {
	var out bytes.Buffer
	lg := StderrLog(&out)
	forged := "innocent\nnpubroker: npu 3: lease of alice (inline) from before this start goes on\x1b[2J"
	lg.Printf("npu 1: pid 42 (bob: %s 600) has /dev/davinci1 open without a lease", forged)
	lg.Printf("bad bytes \xff\xfe, a tab\there, C1 \u009b, DEL \x7f, and fine: naïve …")
	lg.Print("ends in its own newline\n")
	lg.Print(strings.Repeat("é", MaxLogLine)) // two bytes each
	got := out.String()
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines, want 4:\n%s", len(lines), got)
	}
	for i, want := range []string{
		"npubroker: npu 1: pid 42 (bob: innocent?npubroker: npu 3: lease of alice (inline) from before this start goes on?[2J 600) has /dev/davinci1 open without a lease",
		"npubroker: bad bytes ??, a tab?here, C1 ?, DEL ?, and fine: naïve …",
		"npubroker: ends in its own newline",
	} {
		if lines[i] != want {
			t.Errorf("line %d:\n got %q\nwant %q", i, lines[i], want)
		}
	}
	long := strings.TrimPrefix(lines[3], "npubroker: ")
	if len(long) > MaxLogLine || !strings.HasSuffix(long, "é…") {
		t.Errorf("a long line: %d bytes, ending %q; want at most %d, ending in é…", len(long), long[len(long)-8:], MaxLogLine)
	}
	if regexp.MustCompile(`[\x00-\x09\x0b-\x1f\x7f]`).MatchString(got) {
		t.Errorf("control characters in the log: %q", got)
	}
}

// TestSyslogWriter: each line is one datagram in syslog(3)'s local form,
// made printable; a system log that restarts is connected to again.
func TestSyslogWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	listen := func() *net.UnixConn {
		c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	recv := func(c *net.UnixConn) string {
		t.Helper()
		buf := make([]byte, 65536)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("read the system log: %v", err)
		}
		return string(buf[:n])
	}
	l := listen()
	sw, err := dialSyslog(path, "npubroker")
	if err != nil {
		t.Fatal(err)
	}
	lg := newSyslogLogger(sw)
	lg.Print("serving fake npu 0-3\x1b[2J\nforged")
	form := regexp.MustCompile(`^<30>[A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d npubroker\[\d+\]: serving fake npu 0-3\?\[2J\?forged$`)
	if got := recv(l); !form.MatchString(got) {
		t.Errorf("datagram %q does not match %s", got, form)
	}
	lg.Print("warning: socket elsewhere")
	if got := recv(l); !strings.HasPrefix(got, "<28>") || !strings.HasSuffix(got, "]: warning: socket elsewhere") {
		t.Errorf("warning datagram %q, want severity 4 (<28>)", got)
	}
	// The system log restarts: a new socket at the same path.
	l.Close()
	os.Remove(path)
	lg.Print("lost: nobody listens")
	l = listen()
	defer l.Close()
	lg.Print("after the restart")
	if got := recv(l); !strings.HasSuffix(got, "]: 1 line of this log dropped (the system log took none); after the restart") {
		t.Errorf("datagram after a restart: %q", got)
	}
}
