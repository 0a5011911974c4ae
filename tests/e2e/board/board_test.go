package board

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// xss is the task's would-be script, as the issue names it; mark is one
// that, if it ever ran or loaded, would ask the marker server.
const xss = `<img src=x onerror=alert(1)>`

// hold runs npurun ARGS as u, holding its lease until the test ends.
func hold(t *testing.T, b *harness.Broker, u harness.TestUser, dir string, args ...string) *harness.Proc {
	t.Helper()
	args = append(args, "sh", "-c", `echo "held $NPURUN_DEVICES"; read x; exit 0`)
	p := harness.StartProc(t, "npurun "+strings.Join(args[:2], " "), u.As(b.Npurun(args...), dir))
	p.WaitLine("held")
	return p
}

// silentPeer accepts connections and never answers; garbagePeer answers
// what is not npuboard's JSON.
func silentPeer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // held open, never read or written
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return "http://" + ln.Addr().String()
}

// row is the HTML of the element of kind (tr, g) whose data-device is
// name, in the first box panel of html.
func row(html, kind, name string) string {
	re := regexp.MustCompile(`(?s)<` + kind + ` [^>]*data-device="` + regexp.QuoteMeta(name) + `"[^>]*>(.*?)</` + kind + `>`)
	m := re.FindStringSubmatch(html)
	if m == nil {
		return ""
	}
	return m[1]
}

// panel is the section of box name in html.
func panel(html, name string) string {
	i := strings.Index(html, `data-box="`+name+`"`)
	if i < 0 {
		return ""
	}
	rest := html[i:]
	if j := strings.Index(rest, "</section>"); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

func get(t *testing.T, url string) (string, http.Header, time.Duration) {
	t.Helper()
	start := time.Now()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, body)
	}
	return string(body), resp.Header, time.Since(start)
}

// volatile are the board's fields that change from one moment to the
// next: times and the last samples.
var volatile = map[string]bool{"time": true, "checked": true, "last": true, "took_ms": true, "procs": true,
	"util": true, "util_held": true, "idle_since": true, "idle_ends": true, "mem_used": true, "started": true, "holders": true, "more_holders": true}

func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k := range x {
			if volatile[k] {
				delete(x, k)
			} else {
				x[k] = normalize(x[k])
			}
		}
	case []any:
		for i := range x {
			x[i] = normalize(x[i])
		}
	}
	return v
}

// TestBoard: a broker with a lease, a share, a task, an idle lease, a
// drained device and a lease ended, and another box with a lease; an
// npuboard on each, peers of each other, the first with a peer that never
// answers and one that answers garbage. In Chromium the page shows each
// device's row with its holder, the timeline has the leases of the
// history, the task's would-be script is text and never runs, the dead
// peer is down within the timeout, and the page works with JavaScript
// off; /api/status is npubroker status --json.
func TestBoard(t *testing.T) {
	harness.NeedRoot(t)
	harness.Chromium(t)
	alice, bob, boardUser := harness.NewUser(t), harness.NewUser(t), harness.NewUser(t)
	dir := harness.SharedDir(t)
	utilDir := filepath.Join(dir, "util")
	if err := os.Mkdir(utilDir, 0o755); err != nil {
		t.Fatal(err)
	}
	setUtil := func(id int, v string) {
		p := filepath.Join(utilDir, fmt.Sprintf("npu%d", id))
		if err := os.WriteFile(p+".tmp", []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			t.Fatal(err)
		}
	}
	for id, v := range []string{"70", "30", "50", "0", "0", "0"} {
		setUtil(id, v)
	}
	b1 := harness.StartBroker(t, harness.FakeConfig(6)+fmt.Sprintf("fake_util = %q\n", utilDir)+
		"[tasks]\ncpu_slots = 4\nkill_grace = \"1s\"\n[status]\nutil_interval = \"1s\"\n"+
		"[share]\npools = \"all\"\ncapacity = \"8G\"\nmargin = \"0\"\n")
	b2 := harness.StartBroker(t, harness.FakeConfig(2))

	// Marker: what the would-be scripts would ask for if they ran.
	var hits atomic.Int64
	marker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer marker.Close()
	mark := `<img src=` + marker.URL + `/img onerror=fetch('` + marker.URL + `/hit')><script src=` + marker.URL + `/s.js></script>`

	// An ended lease (the history), a drained device, a lease, a share,
	// an idle lease and a task.
	if code, out := harness.ExitCode(t, alice.As(b1.Npurun("-d", "4", "true"), dir)); code != 0 {
		t.Fatalf("npurun -d 4 true: %d %s", code, out)
	}
	if code, _, errs := harness.DrainCmd(t, b1, nil, "drain", "npu5", "--reason", "fan <b>loud</b>"); code != 0 {
		t.Fatalf("drain: %s", errs)
	}
	hold(t, b1, alice, dir, "-d", "0")
	hold(t, b1, bob, dir, "-d", "1", "--mem", "1G")
	hold(t, b1, bob, dir, "-d", "3")
	logDir := harness.UserDir(t, &alice, 0o755)
	task := harness.SubmitTask(t, b1, &alice, logDir, "-d", "2", "--log", filepath.Join(logDir, "task.log"), "--", "sh", "-c", "sleep 600", xss, mark)
	t.Cleanup(func() { exec.Command(b1.Bin.TaskSubmit, "cancel", fmt.Sprint(task)).Run() })
	hold(t, b2, bob, dir, "-d", "1")
	harness.WaitBoard(t, b1, func(bd *wire.Board) bool {
		d2, d3 := harness.Device(t, bd, 2), harness.Device(t, bd, 3)
		return d2.State == wire.DeviceTask && len(d2.Lease.Holders) > 1 && d3.Lease != nil && d3.Lease.IdleSince != 0
	})

	// Two npuboards, each the other's peer; the first has a dead and a
	// garbage peer too.
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "<html>garbage "+xss+"</html>")
	}))
	defer garbage.Close()
	dead := silentPeer(t)
	addr1, addr2 := harness.FreePort(t), harness.FreePort(t)
	conf := func(name string, peers ...string) string {
		p := filepath.Join(dir, name)
		q, _ := json.Marshal(peers)
		if err := os.WriteFile(p, []byte("[board]\nrefresh = \"2s\"\npeers = "+string(q)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	harness.StartBoard(t, b1, conf("board1.conf", "http://"+addr2, dead, garbage.URL), addr1, "box1", boardUser.Name)
	harness.StartBoard(t, b2, conf("board2.conf", "http://"+addr1), addr2, "box2", boardUser.Name)
	url1 := "http://" + addr1 + "/"

	// The dead peer costs the page its timeout (2 s), once a refresh.
	page, hdr, took := get(t, url1)
	if took > 4*time.Second {
		t.Errorf("the page took %v with a peer that never answers (timeout 2s)", took)
	}
	if csp := hdr.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "style-src 'self'") || strings.Contains(csp, "unsafe") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
	if hdr.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("no X-Content-Type-Options: nosniff")
	}
	for _, want := range []string{"no answer within 2s", "answered what is not npuboard&#39;s JSON"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page does not say %q", want)
		}
	}

	// The history, as the timeline must show it.
	histJSON, _, _ := get(t, url1+"api/history?since=24h")
	var hist wire.HistoryReport
	if err := json.Unmarshal([]byte(histJSON), &hist); err != nil {
		t.Fatal(err)
	}
	perDevice := map[string][]wire.HistoryEntry{}
	for _, e := range hist.Entries {
		perDevice[e.Name] = append(perDevice[e.Name], e)
	}
	if len(perDevice["npu4"]) != 1 || perDevice["npu4"][0].End == 0 || perDevice["npu4"][0].User != alice.Name {
		t.Errorf("history of npu4: %+v, want alice's ended lease", perDevice["npu4"])
	}

	// Without JavaScript: Chromium's --dump-dom reads the DOM with a
	// script of its own, which scriptEnabled=false stops too, so the page
	// comes through a proxy that adds a second policy, script-src 'none':
	// the page's script is refused as a browser with JavaScript off
	// refuses it, and Chromium can still read the DOM.
	target, _ := neturl.Parse(url1)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(r *http.Response) error {
		r.Header.Add("Content-Security-Policy", "script-src 'none'")
		return nil
	}
	noJS := httptest.NewServer(proxy)
	defer noJS.Close()

	// In Chromium, with JavaScript (and time for a refresh in place) and
	// without.
	for _, js := range []bool{true, false} {
		t.Run(fmt.Sprintf("javascript=%v", js), func(t *testing.T) {
			url := url1
			if !js {
				url = noJS.URL + "/"
			}
			dom := harness.Browse(t, url, "--dump-dom", "--virtual-time-budget=6000")
			if ran := strings.Contains(dom, `class="live"`); ran != js {
				t.Errorf("the page's script ran: %v, want %v", ran, js)
			}
			if updated := strings.Contains(dom, `data-updated="`); updated != js {
				t.Errorf("the panels were refreshed in place: %v, want %v", updated, js)
			}
			box1 := panel(dom, "box1")
			for _, d := range []struct{ name, holder, state, note string }{
				{"npu0", alice.Name, "leased", ""},
				{"npu1", bob.Name, "shared", "1 shares"},
				{"npu2", alice.Name, "task", ""},
				{"npu3", bob.Name, "leased", "idle"},
				{"npu4", "", "free", ""},
				{"npu5", "", "drained", "drained: fan &lt;b&gt;loud&lt;/b&gt;"},
			} {
				r := row(box1, "tr", d.name)
				if r == "" {
					t.Errorf("no row for %s on box1:\n%s", d.name, box1)
					continue
				}
				if !strings.Contains(r, ">"+d.state+"<") || (d.holder != "" && !strings.Contains(r, d.holder)) || !strings.Contains(r, d.note) {
					t.Errorf("%s's row does not show %s, %s, %q:\n%s", d.name, d.state, d.holder, d.note, r)
				}
			}
			if r := row(box1, "tr", "npu0"); !strings.Contains(r, "<polyline") {
				t.Errorf("npu0's row has no sparkline:\n%s", r)
			}
			if r := row(panel(dom, "box2"), "tr", "npu1"); !strings.Contains(r, bob.Name) {
				t.Errorf("box2's npu1 row does not show bob:\n%s", panel(dom, "box2"))
			}
			for _, down := range []string{dead, garbage.URL} {
				if p := panel(dom, down); !strings.Contains(p, "down</strong> since") {
					t.Errorf("peer %s is not shown down:\n%s", down, p)
				}
			}
			// The timeline: a bar per lease of the history, titled with its user.
			for name, entries := range perDevice {
				g := row(box1, "g", name)
				if n := strings.Count(g, `class="lease"`); n != len(entries) {
					t.Errorf("timeline row %s has %d bars, the history %d leases:\n%s", name, n, len(entries), g)
				}
				for _, e := range entries {
					if !strings.Contains(g, e.User) {
						t.Errorf("timeline row %s does not name %s", name, e.User)
					}
				}
			}
			if g := row(box1, "g", "npu3"); !strings.Contains(g, `fill="url(#hatch)"`) {
				t.Errorf("npu3's idle lease has no hatched stretch:\n%s", g)
			}
			// The would-be scripts are text.
			if strings.Contains(dom, "<img") || strings.Count(dom, "<script") != 1 {
				t.Errorf("a task's string became HTML")
			}
			if !strings.Contains(dom, "&lt;img src=x onerror=alert(1)&gt;") {
				t.Errorf("the task's command is not shown as text:\n%s", row(box1, "tr", "npu2"))
			}
		})
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the marker was asked %d times: a task's string ran or loaded", n)
	}

	// box2's npuboard shows box1 as its peer.
	page2, _, _ := get(t, "http://"+addr2+"/")
	if r := row(panel(page2, "box1"), "tr", "npu0"); !strings.Contains(r, alice.Name) {
		t.Errorf("box2's page does not show box1's npu0 held by alice:\n%s", panel(page2, "box1"))
	}

	// /api/status is npubroker status --json for the same moment, asked
	// as the same user.
	var api, cli any
	apiText, _, _ := get(t, url1+"api/status")
	cmd := boardUser.As(exec.Command(b1.Bin.Broker, "status", "--json"), dir)
	cmd.Env = b1.Env()
	cliText, err := cmd.Output()
	if err != nil {
		t.Fatalf("npubroker status --json: %v %s", err, harness.StderrOf(err))
	}
	if err := json.Unmarshal([]byte(apiText), &api); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(cliText, &cli); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(normalize(api), normalize(cli)) {
		t.Errorf("/api/status and npubroker status --json differ (times aside):\n%s\n%s", apiText, cliText)
	}

	// The README's screenshot, where asked for.
	shot := filepath.Join(t.TempDir(), "board.png")
	if os.Getenv("NPURUN_UPDATE_SCREENSHOT") == "1" {
		shot = filepath.Join(harness.Root(), "docs", "board.png")
	}
	harness.Browse(t, url1, "--screenshot="+shot, "--window-size=1280,1500", "--hide-scrollbars")
	if data, err := os.ReadFile(shot); err != nil || len(data) < 1000 || string(data[1:4]) != "PNG" {
		t.Errorf("screenshot %s: %d bytes, %v", shot, len(data), err)
	}
}

// TestBoardNotRoot: npuboard refuses to serve as root; with --user it
// serves as that user, every id of it (real, effective, saved, file
// system; no supplementary group), and the broker sees that user.
func TestBoardNotRoot(t *testing.T) {
	harness.NeedRoot(t)
	b := harness.StartBroker(t, harness.FakeConfig(1))
	cmd := exec.Command(harness.Npuboard(t), "--socket", b.Socket, "--listen", harness.FreePort(t), "--config", "/dev/null")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "npuboard: refusing to serve as root") {
		t.Errorf("npuboard as root: %v\n%s", err, out)
	}
	u := harness.NewUser(t)
	conf := filepath.Join(t.TempDir(), "npurun.conf")
	if err := os.WriteFile(conf, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	addr := harness.FreePort(t)
	p := harness.StartBoard(t, b, conf, addr, "box", u.Name)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	ids := fmt.Sprintf("%d\t%d\t%d\t%d", u.UID, u.UID, u.UID, u.UID)
	gids := fmt.Sprintf("%d\t%d\t%d\t%d", u.GID, u.GID, u.GID, u.GID)
	for _, want := range []string{"\nUid:\t" + ids + "\n", "\nGid:\t" + gids + "\n", "\nGroups:\t \n"} {
		if !strings.Contains(string(status), want) {
			t.Errorf("npuboard --user %s: /proc status lacks %q:\n%s", u.Name, want, status)
		}
	}
	// The broker answers it as that user: the history, which any user
	// may ask for.
	body, _, _ := get(t, "http://"+addr+"/api/history?since=1h")
	if !strings.Contains(body, `"entries": []`) {
		t.Errorf("/api/history as %s: %s", u.Name, body)
	}
	for _, bad := range []string{"since=8d", "since=-1h", "since=soon"} {
		resp, err := http.Get("http://" + addr + "/api/history?" + bad)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("/api/history?%s: %s, want 400", bad, resp.Status)
		}
	}
}
