package board

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/wire"
)

const xss = `<img src=x onerror=alert(1)>`

// peerBox is a peer's answer whose every string is a would-be script.
func peerBox() *Box {
	now := time.Now().UnixMilli()
	return &Box{Name: "box2" + xss, Fetched: now,
		Status: &wire.Board{Time: now, Vendor: "fake", Devices: []wire.DeviceState{{ID: 0, Name: "npu0" + xss, Pool: "p" + xss, State: wire.DeviceLeased, Since: now - 1000,
			Lease: &wire.LeaseInfo{ID: 7, Kind: wire.KindTask, User: "eve" + xss, Devices: []int{0}, Since: now - 1000,
				Holders: []wire.Holder{{PID: 1, User: "eve" + xss, Command: "sh -c " + xss}}}}},
			Waiting: []wire.Line{{Pool: "p" + xss, Count: 1, Waiters: []wire.WaiterInfo{{Position: 1, Kind: wire.KindInline, User: "mallory" + xss, N: 1, Since: now, Why: xss}}}}},
		History: &wire.HistoryReport{Entries: []wire.HistoryEntry{{Lease: 7, Device: 0, Name: "npu0" + xss, Kind: wire.KindTask, User: "eve" + xss, Start: now - 1000}}},
		Usage:   &wire.UsageReport{Rows: []wire.UsageRow{{User: "eve" + xss, DeviceHours: 1}}},
	}
}

// TestPageEscapesPeers: a peer's strings land on the page as text; a
// peer that answers garbage, one over the size bound and one that never
// answers are shown down, the last within the timeout; every answer
// carries the CSP and nosniff.
func TestPageEscapesPeers(t *testing.T) {
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(peerBox())
	}))
	defer good.Close()
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "<html>"+xss+"</html>")
	}))
	defer garbage.Close()
	huge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"host":"`+strings.Repeat("a", 8<<10)+`"}`)
	}))
	defer huge.Close()
	hang := make(chan struct{})
	silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-hang }))
	defer silent.Close()
	defer close(hang)

	s := New(Config{Socket: filepath.Join(t.TempDir(), "none.sock"), Host: "box1", Refresh: time.Minute,
		Peers: []string{good.URL, garbage.URL, huge.URL, silent.URL}, PeerTimeout: 300 * time.Millisecond, PeerMax: 4 << 10})
	srv := httptest.NewServer(s)
	defer srv.Close()
	start := time.Now()
	resp, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	page := string(body)
	if took > 2*time.Second {
		t.Errorf("the page took %v with a peer that never answers (timeout 300ms)", took)
	}
	if got := resp.Header.Get("Content-Security-Policy"); !strings.Contains(got, "script-src 'self'") || !strings.Contains(got, "style-src 'self'") || strings.Contains(got, "unsafe") {
		t.Errorf("CSP %q", got)
	}
	if resp.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("no nosniff")
	}
	if strings.Contains(page, "<img") {
		t.Errorf("a peer's string became HTML:\n%s", page)
	}
	for _, want := range []string{"eve&lt;img src=x onerror=alert(1)&gt;", "box2&lt;img", "mallory&lt;img",
		"answered what is not npuboard&#39;s JSON", "answer too large", "no answer within 300ms", "no such file"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page does not say %q", want)
		}
	}
	if n := strings.Count(page, "<strong>down</strong>"); n != 4 {
		t.Errorf("%d boxes down, want 4 (this one's broker, garbage, too large, silent)", n)
	}
	for _, path := range []string{"/static/board.js", "/api/status", "/nothing"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.Header.Get("Content-Security-Policy") != CSP || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: headers %v", path, resp.Header)
		}
	}
	resp, err = http.Post(srv.URL+"/", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %s, want 405", resp.Status)
	}
}
