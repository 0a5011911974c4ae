package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// The load of npuboard's benchmark: 4 boxes of 16 devices, each with
// 1,000 requests waiting and 10,000 leases in the day's history.
const (
	benchBoardBoxes   = 4
	benchBoardDevices = 16
	benchBoardWaiters = 1000
	benchBoardHistory = 10000
	benchBoardSamples = 40
)

// benchBoardLog writes an accounting log of n leases ended within the
// last day, spread over the devices, for the broker to start on.
func benchBoardLog(b *testing.B, stateDir string, n, devices int) {
	b.Helper()
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		b.Fatal(err)
	}
	var buf bytes.Buffer
	now := time.Now().Add(-time.Minute).UnixMilli()
	span := int64(23 * time.Hour / time.Millisecond)
	for i := range n {
		dev := i % devices
		start := now - span + int64(i)*span/int64(n)
		end := start + span/int64(n)*int64(devices)*9/10
		user := "user" + strconv.Itoa(i%23)
		fmt.Fprintf(&buf, `{"t":%d,"ev":"start","lease":%d,"kind":"inline","user":%q,"uid":%d,"pool":"default","devices":[%d]}`+"\n", start, 1000+i, user, 20000+i%23, dev)
		fmt.Fprintf(&buf, `{"t":%d,"ev":"end","lease":%d,"device":%d,"how":"released","dur_ms":%d}`+"\n", end, 1000+i, dev, end-start)
	}
	if err := os.WriteFile(filepath.Join(stateDir, "usage.log"), buf.Bytes(), 0o600); err != nil {
		b.Fatal(err)
	}
}

// benchBoardQueue holds every device and queues n more requests, each
// on a connection of its own, closed when the benchmark ends.
func benchBoardQueue(b *testing.B, br *harness.Broker, devices, n int) {
	b.Helper()
	holder := br.Dial()
	if err := holder.Send(&wire.Request{Op: wire.OpAcquire, N: devices}); err != nil {
		b.Fatal(err)
	}
	r, fds, err := holder.Recv(10 * time.Second)
	if err != nil || r.Type != wire.TypeGrant {
		b.Fatalf("holder: %v %v", r, err)
	}
	req, err := wire.Encode(&wire.Request{V: wire.Version, Op: wire.OpAcquire, N: 1})
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, wire.MaxMessage)
	oob := make([]byte, unix.CmsgSpace(wire.MaxDevices*4))
	socks := make([]int, 0, n)
	b.Cleanup(func() {
		br.Stop()
		for _, fd := range socks {
			unix.Close(fd)
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
	})
	for i := range n {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			b.Fatalf("waiter %d: %v", i, err)
		}
		socks = append(socks, fd)
		if err := unix.Connect(fd, &unix.SockaddrUnix{Name: br.Socket}); err != nil {
			b.Fatalf("waiter %d: connect: %v", i, err)
		}
		if err := wire.SendMsg(fd, req, nil, 0); err != nil {
			b.Fatalf("waiter %d: send: %v", i, err)
		}
	}
	for i, fd := range socks {
		if _, _, err := wire.RecvMsg(fd, buf, oob, 0); err != nil {
			b.Fatalf("waiter %d: recv: %v", i, err)
		}
	}
}

// benchGet times a GET of url, failing the benchmark unless it answers 200.
func benchGet(b *testing.B, c *http.Client, url string) (time.Duration, []byte) {
	b.Helper()
	t0 := time.Now()
	resp, err := c.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(t0)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("GET %s: %s %v", url, resp.Status, err)
	}
	return d, body
}

// BenchmarkBoard: npuboard with 4 boxes of 16 devices, 1,000 waiting
// requests and 10,000 leases of history each (this box's broker, and
// three peers that serve what this box's npuboard serves its peers): the
// page drawn (p50, targets ≤ 50 ms), /api/status beside npubroker status
// --json as a whole command (≤ 1.2×), npuboard's memory after it all
// (≤ 30 MiB), and a refresh with a peer that never answers (≤ its 2 s
// timeout more than one without).
func BenchmarkBoard(b *testing.B) {
	benchNoNsPerOp(b)
	harness.NeedRoot(b) // npuboard runs as a user of its own
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < 4096 {
		lim.Cur = min(lim.Max, 4096)
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	br := harness.NewBroker(b, harness.FakeConfig(benchBoardDevices)+"[broker]\nmax_waiting_per_user = 5000\n")
	benchBoardLog(b, br.StateDir, benchBoardHistory, benchBoardDevices)
	br.Start()
	benchBoardQueue(b, br, benchBoardDevices, benchBoardWaiters)
	user := harness.NewUser(b)
	dir := harness.SharedDir(b)

	// Three peers: this box's own /api/box, renamed, served from memory.
	conf := func(name, refresh string, peers ...string) string {
		p := filepath.Join(dir, name)
		q, _ := json.Marshal(append([]string{}, peers...))
		if err := os.WriteFile(p, []byte("[board]\nrefresh = \""+refresh+"\"\npeers = "+string(q)+"\n"), 0o644); err != nil {
			b.Fatal(err)
		}
		return p
	}
	client := &http.Client{Timeout: 30 * time.Second}
	alone := harness.FreePort(b)
	harness.StartBoard(b, br, conf("alone.conf", "60s"), alone, "box0", user.Name)
	_, box := benchGet(b, client, "http://"+alone+"/api/box")
	var peers []string
	for i := 1; i < benchBoardBoxes; i++ {
		body := bytes.Replace(box, []byte(`"host":"box0"`), []byte(`"host":"box`+strconv.Itoa(i)+`"`), 1)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Write(body)
		}))
		b.Cleanup(srv.Close)
		peers = append(peers, srv.URL)
	}
	var hist wire.HistoryReport
	_, histJSON := benchGet(b, client, "http://"+alone+"/api/history?since=24h")
	if err := json.Unmarshal(histJSON, &hist); err != nil || len(hist.Entries) != benchBoardHistory {
		b.Fatalf("the history has %d entries, want %d (%v)", len(hist.Entries), benchBoardHistory, err)
	}

	// The page: npuboard with the three peers, its data kept for 60 s.
	addr := harness.FreePort(b)
	p := harness.StartBoard(b, br, conf("board.conf", "60s", peers...), addr, "box0", user.Name)
	page := "http://" + addr + "/"
	cold, html := benchGet(b, client, page)
	if n := strings.Count(string(html), `class="dev `); n != benchBoardBoxes*benchBoardDevices {
		b.Fatalf("the page has %d device rows, want %d", n, benchBoardBoxes*benchBoardDevices)
	}
	var tp, ta, tc []time.Duration
	for range benchBoardSamples {
		d, _ := benchGet(b, client, page)
		tp = append(tp, d)
	}
	// /api/status beside npubroker status --json, as the same user,
	// interleaved.
	status := func() *exec.Cmd {
		cmd := user.As(exec.Command(br.Bin.Broker, "status", "--json"), dir)
		cmd.Env = br.Env()
		cmd.Stdout = io.Discard
		return cmd
	}
	for i := range benchBoardSamples {
		if i%2 == 0 {
			d, _ := benchGet(b, client, page+"api/status")
			ta = append(ta, d)
			tc = append(tc, benchTimeRun(b, status()))
		} else {
			tc = append(tc, benchTimeRun(b, status()))
			d, _ := benchGet(b, client, page+"api/status")
			ta = append(ta, d)
		}
	}
	pid := p.Cmd.Process.Pid
	rss, hwm := benchProcStatus(b, pid, "VmRSS"), benchProcStatus(b, pid, "VmHWM")

	// A refresh with a peer that never answers, beside one without: a
	// board that keeps its data 1 s, so that every page fetches anew.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var held []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	b.Cleanup(func() { ln.Close() })
	live, dead := harness.FreePort(b), harness.FreePort(b)
	harness.StartBoard(b, br, conf("live.conf", "1s", peers...), live, "box0", user.Name)
	harness.StartBoard(b, br, conf("dead.conf", "1s", append(peers, "http://"+ln.Addr().String())...), dead, "box0", user.Name)
	var tl, td []time.Duration
	for range 4 {
		time.Sleep(1100 * time.Millisecond) // past the refresh: the page fetches every box anew
		d, _ := benchGet(b, client, "http://"+live+"/")
		tl = append(tl, d)
		d, body := benchGet(b, client, "http://"+dead+"/")
		td = append(td, d)
		if !strings.Contains(string(body), "no answer within 2s") || strings.Count(string(body), `class="dev `) != benchBoardBoxes*benchBoardDevices {
			b.Fatalf("with a dead peer, the page does not show it down or lacks the others' devices")
		}
	}

	p50, a50, c50 := benchQuantile(tp, 0.5), benchQuantile(ta, 0.5), benchQuantile(tc, 0.5)
	b.ReportMetric(benchMs(p50), "page-p50-ms")
	b.ReportMetric(float64(a50)/float64(c50), "api/cli")
	b.ReportMetric(rss/benchMib, "rss-MiB")
	benchSummary(b, fmt.Sprintf("npuboard: %d boxes × %d devices, %d waiting, %d leases of history each", benchBoardBoxes, benchBoardDevices, benchBoardWaiters, benchBoardHistory), [][]string{
		{"", "p50", "p90", "target"},
		{"page (data kept), GET /", fmtMs(p50), fmtMs(benchQuantile(tp, 0.9)), "≤ 50 ms"},
		{"page, first (every box fetched)", fmtMs(cold), "", ""},
		{"GET /api/status", fmtMs(a50), fmtMs(benchQuantile(ta, 0.9)), ""},
		{"npubroker status --json", fmtMs(c50), fmtMs(benchQuantile(tc, 0.9)), ""},
		{"ratio p50", strconv.FormatFloat(float64(a50)/float64(c50), 'f', 3, 64), "", "≤ 1.2"},
		{"npuboard VmRSS / VmHWM", fmt.Sprintf("%.1f / %.1f MiB", rss/benchMib, hwm/benchMib), "", "≤ 30 MiB"},
		{"refresh, all peers up / one dead (max)", fmtMs(benchQuantile(tl, 1)), fmtMs(benchQuantile(td, 1)), "dead ≤ up + 2 s"},
	})
	for _, c := range held {
		c.Close()
	}
}
