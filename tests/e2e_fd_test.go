package tests

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
	b := StartBroker(t, FakeConfig(2)+"[broker]\nmetrics_listen = \"127.0.0.1:0\"\n")
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
		if code, out := exitCode(t, b.Npurun("--timeout", "10s", "true")); code != 0 {
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
	hc := &http.Client{Timeout: eventTimeout} // each waits its turn to be read and closed, half a second at least
	resp, err := hc.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape after the flood: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape after the flood: %s", resp.Status)
	}
}
