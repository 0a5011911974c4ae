package lease

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// Tests of the broker out of descriptors: a real low RLIMIT_NOFILE, set on
// the running broker with prlimit(2).

// setNofile sets process pid's soft limit on open files to n, keeping its
// hard limit, and puts the old soft limit back when the test ends.
func setNofile(t *testing.T, pid int, n uint64) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &old); err != nil {
		t.Fatalf("prlimit %d: %v", pid, err)
	}
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: n, Max: old.Max}, nil); err != nil {
		t.Fatalf("prlimit %d: %v", pid, err)
	}
	t.Cleanup(func() { unix.Prlimit(pid, unix.RLIMIT_NOFILE, &old, nil) })
}

// openFDs counts process pid's open descriptors.
func openFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestMetricsFlood: connections to the metrics endpoint that send a POST's
// headers, announce a body and never send it, 150 of them against a broker
// limited to 100 descriptors, take a bounded number of its descriptors,
// and the broker goes on granting; once they are closed, a scrape is
// served.
func TestMetricsFlood(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(2)+"[broker]\nmetrics_listen = \"127.0.0.1:0\"\n")
	m := regexp.MustCompile(`metrics on http://(\S+)/metrics`).FindStringSubmatch(b.Log())
	if m == nil {
		t.Fatalf("no metrics address in the log:\n%s", b.Log())
	}
	addr := m[1]
	pid := b.Pid()
	setNofile(t, pid, 100)
	before := openFDs(t, pid)

	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	for range 150 {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			break // the backlog is full: as good
		}
		fmt.Fprintf(c, "POST /metrics HTTP/1.1\r\nHost: %s\r\nContent-Length: 20000\r\n\r\n", addr)
		flood = append(flood, c)
	}
	if len(flood) < 120 {
		t.Fatalf("only %d connections made: the flood would not have run the broker out of descriptors", len(flood))
	}
	for i := range 5 {
		if code, out := harness.ExitCode(t, b.Npurun("--timeout", "10s", "true")); code != 0 {
			t.Fatalf("npurun %d during the flood: exit %d: %s\nbroker log:\n%s", i, code, out, b.Log())
		}
	}
	if n := openFDs(t, pid); n > before+8+4 {
		t.Errorf("during the flood the broker has %d descriptors open, %d before it: the metrics endpoint takes more than its 8 connections", n, before)
	}

	for _, c := range flood {
		c.Close()
	}
	flood = nil
	hc := &http.Client{Timeout: harness.EventTimeout} // each waits its turn to be read and closed, half a second at least
	resp, err := hc.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape after the flood: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape after the flood: %s", resp.Status)
	}
}

// TestLowDescriptorLimit: a broker on 4 devices whose RLIMIT_NOFILE is
// 256, all four leased, 40 clients waiting in line, each to run a workload
// that proves its own exclusivity (an O_EXCL marker per device); then 300
// idle connections, as many as the broker takes. A client that comes then
// is refused at once. The holders let go: every waiting client runs, none
// waits past a bound, no device leaves service (a lease's end needs no new
// descriptor, and the connections never take those kept for the devices),
// and all four are back at the end.
func TestLowDescriptorLimit(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(4))
	setNofile(t, b.Pid(), 256)
	var holders []harness.Holder
	for i := range 4 {
		holders = append(holders, harness.Hold(t, b, fmt.Sprintf("holder %d", i), "-d", strconv.Itoa(i)))
	}
	w := harness.NewWorkload(t)
	var waiting []*harness.Proc
	for i := range 40 {
		waiting = append(waiting, harness.Queue(t, b, fmt.Sprintf("client %d", i),
			append([]string{"--timeout", "60s"}, w.Args(b, fmt.Sprintf("c%d", i), 50*time.Millisecond)...)...))
	}
	mark := b.LogLen()
	var idle []*wire.Conn
	for range 300 {
		c, err := wire.Dial(b.Socket)
		if err != nil {
			break
		}
		idle = append(idle, c)
	}
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()

	// A client that comes now is told at once that the broker is full,
	// rather than left unanswered.
	late := time.Now()
	code, out := harness.ExitCode(t, b.Npurun("--timeout", "20s", "true"))
	if code != 75 || !strings.Contains(out, "connections at once") || time.Since(late) > 5*time.Second {
		t.Errorf("a client during the flood: exit %d after %s: %s; want exit 75 at once, the connection cap named", code, time.Since(late).Round(time.Millisecond), out)
	}

	start := time.Now()
	for _, h := range holders {
		h.Release()
	}
	for _, p := range waiting {
		p.MustSucceed()
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("the 40 waiting clients took %s to run", took.Round(time.Millisecond))
	}
	if got := len(w.Runs(t)); got != len(waiting) {
		t.Errorf("%d runs logged, want %d", got, len(waiting))
	}
	log := b.Log()[mark:]
	if n := strings.Count(log, "out of service"); n > 0 {
		t.Errorf("devices left service %d times:\n%s", n, log)
	}
	for _, c := range idle {
		c.Close()
	}
	idle = nil
	if code, out := harness.ExitCode(t, b.Npurun("-n", "4", "--timeout", "10s", "true")); code != 0 {
		t.Errorf("all four devices after the flood: exit %d: %s\nbroker log:\n%s", code, out, log)
	}
}

// TestRepeatedLogLine: a broker out of descriptors fails every accept of
// a waiting connection, ten times a second; the line is logged once, not
// each time. Once it has descriptors again, it serves the connection.
func TestRepeatedLogLine(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(1))
	pid := b.Pid()
	mark := b.LogLen()
	setNofile(t, pid, uint64(openFDs(t, pid))) // not one more
	c := b.Dial()                              // waits in the backlog
	b.WaitLog(mark, "too many open files")
	time.Sleep(2 * time.Second) // the window over which lines are counted
	if n := strings.Count(b.Log()[mark:], "too many open files"); n > 1 {
		t.Errorf("in 2s the broker logged its accept error %d times:\n%s", n, b.Log()[mark:])
	}
	setNofile(t, pid, 4096)
	if err := c.Send(&wire.Request{Op: wire.OpPing}); err != nil {
		t.Fatal(err)
	}
	if r, _, err := c.Recv(harness.EventTimeout); err != nil || r.Type != wire.TypePong {
		t.Fatalf("ping once descriptors are back: %v %v", r, err)
	}
}
