package cli

import (
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/npurun/npurun/internal/exitcode"
	"github.com/npurun/npurun/wire"
)

// A stand-in for npubroker that speaks the protocol of package wire:
// handle gets each request and the connection to answer it on.
type fakeBroker struct {
	path string
	mu   sync.Mutex
	reqs []wire.Request
}

func startBroker(t *testing.T, handle func(req wire.Request, c *net.UnixConn)) *fakeBroker {
	t.Helper()
	dir, err := os.MkdirTemp("", "ts") // short: socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	b := &fakeBroker{path: filepath.Join(dir, "broker.sock")}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: b.path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				buf := make([]byte, wire.MaxMessage)
				for {
					n, err := c.Read(buf)
					if err != nil || n == 0 {
						return
					}
					var req wire.Request
					if err := json.Unmarshal(buf[:n], &req); err != nil {
						t.Errorf("broker: bad request %q: %v", buf[:n], err)
						return
					}
					if req.Op == wire.OpPing {
						// As the real broker: a client pings to see that it
						// is served while its real answer may take long.
						reply(t, c, wire.Reply{Type: wire.TypePong})
						continue
					}
					b.mu.Lock()
					b.reqs = append(b.reqs, req)
					b.mu.Unlock()
					handle(req, c)
				}
			})
		}
	})
	return b
}

func (b *fakeBroker) requests() []wire.Request {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]wire.Request(nil), b.reqs...)
}

func reply(t *testing.T, c *net.UnixConn, r wire.Reply) {
	r.V = wire.Version
	p, err := json.Marshal(r)
	if err != nil {
		t.Error(err)
		return
	}
	c.Write(p) // the client may be gone
}

// runCmd runs a command line against the broker and returns its exit
// status and standard output.
func runCmd(t *testing.T, b *fakeBroker, args ...string) (int, string) {
	t.Helper()
	o, err := parse(append([]string{"--socket", b.path}, args...), io.Discard)
	if err != nil {
		t.Fatalf("parse(%q): %v", args, err)
	}
	var out strings.Builder
	stdout = &out
	defer func() { stdout = os.Stdout }()
	code := run(o)
	return code, out.String()
}

func TestSubmitRequest(t *testing.T) {
	b := startBroker(t, func(req wire.Request, c *net.UnixConn) {
		reply(t, c, wire.Reply{Type: wire.TypeSubmitted, ID: 118, Position: 4, Pool: "queue"})
	})
	code, out := runCmd(t, b, "-n", "2", "--time", "90m", "--log", "out.log", "--after", "7", "--run", "python train.py")
	if code != 0 || out != "task 118 queued (4th in line in pool \"queue\")\n" {
		t.Errorf("submit = %d, %q", code, out)
	}
	cwd, _ := os.Getwd()
	reqs := b.requests()
	if len(reqs) != 1 {
		t.Fatalf("broker got %d requests, want 1", len(reqs))
	}
	got := reqs[0]
	if got.V != wire.Version || got.Op != wire.OpSubmit || got.Task == nil {
		t.Fatalf("request %+v, want a submit", got)
	}
	s := *got.Task
	if !reflect.DeepEqual(s.Env, os.Environ()) {
		t.Errorf("env not the submitter's")
	}
	s.Env = nil
	mask := uint32(syscall.Umask(0o022))
	syscall.Umask(int(mask))
	if s.Umask == nil || *s.Umask != mask {
		t.Errorf("umask %v, want the submitter's, %04o", s.Umask, mask)
	}
	s.Umask = nil
	if len(s.Token) != 32 || strings.Trim(s.Token, "0123456789abcdef") != "" {
		t.Errorf("token %q, want 32 random hexadecimal digits", s.Token)
	}
	s.Token = ""
	want := wire.Submission{Shell: "python train.py", Cwd: cwd, N: 2, TimeSec: 5400, After: []uint64{7}, Log: filepath.Join(cwd, "out.log")}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("submission %+v, want %+v", s, want)
	}

	code, out = runCmd(t, b, "--json", "--token", "run-7", "--", "true")
	if code != 0 || out != `{"id":118,"position":4,"pool":"queue","token":"run-7"}`+"\n" {
		t.Errorf("submit --json = %d, %q", code, out)
	}
	if reqs := b.requests(); reqs[len(reqs)-1].Task.Token != "run-7" {
		t.Errorf("--token run-7 sent token %q", reqs[len(reqs)-1].Task.Token)
	}
}

func TestBrokerErrors(t *testing.T) {
	tests := []struct {
		code string
		args []string
		want int
	}{
		{wire.CodeNoSuchTask, []string{"show", "118"}, 1},
		{wire.CodeNoSuchTask, []string{"wait", "118"}, 1},
		{wire.CodeDenied, []string{"-n", "64", "--run", "x"}, 77},
		{wire.CodeTooMany, []string{"--run", "x"}, 75},
		{wire.CodeBusy, []string{"--run", "x"}, 75},
		{wire.CodeSpool, []string{"--run", "x"}, 75},
		{wire.CodeSpool, []string{"cancel", "118"}, 75},
		{wire.CodeBadRequest, []string{"list"}, 2},
		{wire.CodeNoSuchPool, []string{"-p", "nope", "--run", "x"}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.code+" "+strings.Join(tt.args, " "), func(t *testing.T) {
			b := startBroker(t, func(req wire.Request, c *net.UnixConn) {
				reply(t, c, wire.Reply{Type: wire.TypeError, Code: tt.code, Message: "no"})
			})
			if code, out := runCmd(t, b, tt.args...); code != tt.want || out != "" {
				t.Errorf("exit %d, stdout %q; want %d and nothing", code, out, tt.want)
			}
		})
	}
}

func TestNoBroker(t *testing.T) {
	b := &fakeBroker{path: filepath.Join(t.TempDir(), "none.sock")}
	for _, args := range [][]string{{"list"}, {"wait", "1"}, {"--run", "x"}} {
		if code, _ := runCmd(t, b, args...); code != 69 {
			t.Errorf("%q without a broker: exit %d, want 69", args, code)
		}
	}
}

func TestListEmpty(t *testing.T) {
	b := startBroker(t, func(req wire.Request, c *net.UnixConn) {
		reply(t, c, wire.Reply{Type: wire.TypeTasks})
	})
	if code, out := runCmd(t, b, "list", "--all"); code != 0 || out != "" {
		t.Errorf("list of nothing = %d, %q; want 0 and nothing", code, out)
	}
	if code, out := runCmd(t, b, "list", "--json"); code != 0 || out != "[]\n" {
		t.Errorf("list --json of nothing = %d, %q; want 0 and []", code, out)
	}
	if reqs := b.requests(); !reqs[0].All || reqs[1].All || reqs[0].Op != wire.OpList {
		t.Errorf("requests %+v", reqs)
	}
}

// TestListPages: list asks for each next page with the last page's "next",
// once it has read that page, until a page says no more (an empty page
// with more is a page of others' tasks skipped).
func TestListPages(t *testing.T) {
	b := startBroker(t, func(req wire.Request, c *net.UnixConn) {
		switch req.After {
		case 0:
			reply(t, c, wire.Reply{Type: wire.TypeTasks, More: true, Next: 1, Tasks: []wire.TaskInfo{{ID: 1, State: wire.StateDone}}})
		case 1:
			reply(t, c, wire.Reply{Type: wire.TypeTasks, More: true, Next: 4096})
		case 4096:
			reply(t, c, wire.Reply{Type: wire.TypeTasks, Tasks: []wire.TaskInfo{{ID: 5000, State: wire.StateRunning}}})
		default:
			reply(t, c, wire.Reply{Type: wire.TypeError, Code: wire.CodeBadRequest, Message: "no such page"})
		}
	})
	code, out := runCmd(t, b, "list", "--json")
	var ts []wire.TaskInfo
	if err := json.Unmarshal([]byte(out), &ts); code != 0 || err != nil || len(ts) != 2 || ts[0].ID != 1 || ts[1].ID != 5000 {
		t.Errorf("list --json = %d, %q (%v); want tasks 1 and 5000", code, out, err)
	}
	var after []uint64
	for _, r := range b.requests() {
		after = append(after, r.After)
	}
	if !reflect.DeepEqual(after, []uint64{0, 1, 4096}) {
		t.Errorf("list asked for pages after %v, want [0 1 4096]", after)
	}
}

// TestListNoProgress: a broker whose page does not move on is an error,
// not a loop.
func TestListNoProgress(t *testing.T) {
	b := startBroker(t, func(req wire.Request, c *net.UnixConn) {
		reply(t, c, wire.Reply{Type: wire.TypeTasks, More: true, Next: req.After})
	})
	if code, _ := runCmd(t, b, "list"); code != 1 {
		t.Errorf("list from a broker stuck on a page: exit %d, want 1", code)
	}
}

// wait outlives a broker restart: the connection closed, it asks again.
func TestWaitAcrossRestart(t *testing.T) {
	var mu sync.Mutex
	n := 0
	b := startBroker(t, func(req wire.Request, c *net.UnixConn) {
		mu.Lock()
		n++
		first := n == 1
		mu.Unlock()
		if first {
			c.Close()
			return
		}
		reply(t, c, wire.Reply{Type: wire.TypeQueued, Position: 1})
		reply(t, c, wire.Reply{Type: wire.TypeTasks, Tasks: []wire.TaskInfo{{ID: 118, State: wire.StateFailed, Exit: exit(3)}}})
	})
	if code, out := runCmd(t, b, "wait", "118"); code != 3 || out != "" {
		t.Errorf("wait = %d, %q; want 3 and nothing", code, out)
	}
	for _, r := range b.requests() {
		if r.Op != wire.OpWait || r.ID != 118 {
			t.Errorf("request %+v, want wait 118", r)
		}
	}
	if len(b.requests()) != 2 {
		t.Errorf("%d requests, want 2", len(b.requests()))
	}
}

func TestCancel(t *testing.T) {
	b := startBroker(t, func(req wire.Request, c *net.UnixConn) {
		reply(t, c, wire.Reply{Type: wire.TypeTasks, Tasks: []wire.TaskInfo{{ID: req.ID, State: wire.StateRunning, Started: 1}}})
	})
	if code, out := runCmd(t, b, "cancel", "118"); code != 0 || out != "task 118: SIGTERM sent; SIGKILL follows after the grace period\n" {
		t.Errorf("cancel = %d, %q", code, out)
	}
	if r := b.requests()[0]; r.Op != wire.OpCancel || r.ID != 118 {
		t.Errorf("request %+v, want cancel 118", r)
	}
}

// syncWriter lets the test read what logs -f has written so far.
type syncWriter struct {
	mu      sync.Mutex
	b       strings.Builder
	changed chan struct{}
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Write(p)
	select {
	case w.changed <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

func TestLogsFollow(t *testing.T) {
	log := filepath.Join(t.TempDir(), "118.log")
	appendFile(t, log, "a\n")
	end := make(chan struct{})
	b := startBroker(t, func(req wire.Request, c *net.UnixConn) {
		task := wire.TaskInfo{ID: 118, UID: uint32(os.Getuid()), State: wire.StateRunning, Started: 1, Log: log}
		if req.Op == wire.OpWait {
			<-end
			task.State, task.Ended, task.Exit = wire.StateFailed, 2, exit(1)
		}
		reply(t, c, wire.Reply{Type: wire.TypeTasks, Tasks: []wire.TaskInfo{task}})
	})
	o, err := parse([]string{"--socket", b.path, "logs", "-f", "118"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	out := &syncWriter{changed: make(chan struct{}, 1)}
	stdout = out
	defer func() { stdout = os.Stdout }()
	done := make(chan int, 1)
	go func() { done <- run(o) }()

	waitFor := func(want string) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for out.String() != want {
			select {
			case <-out.changed:
			case <-deadline: // a follow that misses the change writes nothing more
				t.Fatalf("logs -f wrote %q, want %q", out.String(), want)
			}
		}
	}
	waitFor("a\n")
	appendFile(t, log, "b\n")
	waitFor("a\nb\n")
	appendFile(t, log, "c\n")
	close(end)
	if code := <-done; code != 0 {
		t.Errorf("logs -f = %d, want 0", code)
	}
	if got := out.String(); got != "a\nb\nc\n" {
		t.Errorf("logs -f wrote %q, want %q", got, "a\nb\nc\n")
	}
}

func TestLogsNotStarted(t *testing.T) {
	b := startBroker(t, func(req wire.Request, c *net.UnixConn) {
		reply(t, c, wire.Reply{Type: wire.TypeTasks, Tasks: []wire.TaskInfo{{ID: 118, UID: uint32(os.Getuid()), State: wire.StatePending, Log: "/x/118.log"}}})
	})
	if code, out := runCmd(t, b, "logs", "118"); code != 1 || out != "" {
		t.Errorf("logs of a pending task = %d, %q; want 1 and nothing", code, out)
	}
}

// TestSubmitFailedAtOnce: a task the broker recorded as failed already
// (--after a task that did not succeed) is not reported as started: its
// id is printed, and task-submit exits 1.
func TestSubmitFailedAtOnce(t *testing.T) {
	b := startBroker(t, func(req wire.Request, c *net.UnixConn) {
		reply(t, c, wire.Reply{Type: wire.TypeSubmitted, ID: 9, State: wire.StateFailed, Reason: "failed: dependency 8 failed with exit status 3"})
	})
	code, out := runCmd(t, b, "--after", "8", "--", "true")
	if code != 1 || !strings.Contains(out, "task 9 submitted: failed: dependency 8") {
		t.Errorf("submit of a task failed at once = %d, %q; want 1 and its line", code, out)
	}
	code, out = runCmd(t, b, "--json", "--token", "t9", "--after", "8", "--", "true")
	if code != 1 || out != `{"id":9,"state":"failed","token":"t9"}`+"\n" {
		t.Errorf("submit --json of a task failed at once = %d, %q", code, out)
	}
}

// TestSubmitAnswerLost: a submission whose answer is lost after it was
// sent (the broker closed the connection: it may have recorded it) is sent
// again with the same token, and what the repeat is told decides: the
// task the first made (exit 0, its id), or a refusal (not submitted: its
// exit status); a broker that never answers leaves it unknown (exit 3, and
// how to find out).
func TestSubmitAnswerLost(t *testing.T) {
	defer func(d time.Duration) { resolveFor = d }(resolveFor)
	resolveFor = time.Second
	tests := []struct {
		name     string
		repeat   *wire.Reply // the answer to the repeat; nil: the connection closed again
		wantCode int
		wantOut  string
		wantErr  string
	}{
		{"recorded", &wire.Reply{Type: wire.TypeSubmitted, ID: 12, Existing: true, Position: 1, Pool: "default"}, 0,
			"task 12 queued (1st in line in pool \"default\")\n", "the broker had recorded it before its answer was lost"},
		{"refused", &wire.Reply{Type: wire.TypeError, Code: wire.CodeDenied, Message: "pool \"x\" is not open to alice"}, 77,
			"", "the task was not submitted"},
		{"no answer", nil, exitcode.Unknown, "", "cannot tell whether the task was submitted"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			n := 0
			b := startBroker(t, func(req wire.Request, c *net.UnixConn) {
				mu.Lock()
				n++
				first := n == 1
				mu.Unlock()
				if first || tc.repeat == nil {
					c.Close() // recorded or not: the client cannot tell
					return
				}
				reply(t, c, *tc.repeat)
			})
			errOut := captureStderr(t)
			code, out := runCmd(t, b, "--", "true")
			stderr := errOut()
			if code != tc.wantCode || out != tc.wantOut || !strings.Contains(stderr, tc.wantErr) {
				t.Errorf("exit %d, stdout %q, stderr:\n%s\nwant exit %d, stdout %q, stderr saying %q", code, out, stderr, tc.wantCode, tc.wantOut, tc.wantErr)
			}
			reqs := b.requests()
			if len(reqs) < 2 {
				t.Fatalf("%d submissions sent, want the first and a repeat", len(reqs))
			}
			for _, r := range reqs[1:] {
				if r.Task == nil || r.Task.Token == "" || r.Task.Token != reqs[0].Task.Token {
					t.Errorf("a repeat's token %q, the first's %q: want the same", r.Task.Token, reqs[0].Task.Token)
				}
			}
			if tc.wantCode == exitcode.Unknown && !strings.Contains(stderr, "--token "+reqs[0].Task.Token) {
				t.Errorf("stderr does not name the token to look for:\n%s", stderr)
			}
		})
	}
}

// TestCheckLog: what the supervisor could not write as the submitter is
// refused before anything is submitted.
func TestCheckLog(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file.log")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.log")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, path, want string // want: "" for no error, else a part of it
	}{
		{"existing file", file, ""},
		{"new file", filepath.Join(dir, "new.log"), ""},
		{"new directories", filepath.Join(dir, "a", "b", "c.log"), ""},
		{"symbolic link", link, "symbolic link"},
		{"directory", dir, "is a directory"},
		{"under a file", filepath.Join(file, "x", "y.log"), "not a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkLog(tt.path)
			if (err == nil) != (tt.want == "") || (err != nil && !strings.Contains(err.Error(), tt.want)) {
				t.Errorf("checkLog(%s) = %v, want %q", tt.path, err, tt.want)
			}
		})
	}
	b := startBroker(t, func(req wire.Request, c *net.UnixConn) {
		t.Errorf("a submission with a bad log reached the broker: %+v", req)
	})
	if code, _ := runCmd(t, b, "--log", link, "--", "true"); code != 1 {
		t.Errorf("submit with a symbolic link for its log: exit %d, want 1", code)
	}
}

// captureStderr sends what task-submit writes to standard error to a file
// until the function returned is called, which returns it.
func captureStderr(t *testing.T) func() string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = f
	done := false
	restore := func() string {
		if !done {
			os.Stderr, done = old, true
		}
		data, _ := os.ReadFile(f.Name())
		return string(data)
	}
	t.Cleanup(func() { restore(); f.Close() })
	return restore
}
