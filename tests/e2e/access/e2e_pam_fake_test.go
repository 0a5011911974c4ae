package access

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/tests/harness"
)

// fakeBroker listens where a broker would and answers every connection
// with answer(n) for the n-th connection (from 0): the bytes of one
// packet, whether to send descriptors with it, and whether to send
// nothing at all (and keep the connection open until the test ends).
type fakeBroker struct {
	Dir, Socket string

	mu       sync.Mutex
	requests []string // what the module sent, one request a connection
}

// Requests returns the requests received so far.
func (fb *fakeBroker) Requests() []string {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	return append([]string(nil), fb.requests...)
}

type fakeAnswer struct {
	data    []byte
	fds     int  // descriptors (of /dev/null) sent with it
	silent  bool // send nothing, keep the connection
	hangup  bool // close at once
	queued  int  // "queued" packets sent before data
	waitFor int  // wait_ms of the first queued packet
	// requeue: after the queued packets, another queued packet with
	// wait_ms waitFor every requeue, until the module hangs up
	requeue time.Duration
}

func startFakeBroker(t *testing.T, answer func(n int) fakeAnswer) *fakeBroker {
	t.Helper()
	dir := harness.SharedDir(t)
	fb := &fakeBroker{Dir: dir, Socket: filepath.Join(dir, "broker.sock")}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: fb.Socket, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		held []*net.UnixConn
	)
	keep := func(c *net.UnixConn) {
		mu.Lock()
		held = append(held, c)
		mu.Unlock()
	}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	null, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	nullFD := int(null.Fd())
	done := make(chan struct{})
	t.Cleanup(func() {
		ln.Close()
		<-done // the server's last send is over
		null.Close()
	})
	go func() {
		defer close(done)
		for n := 0; ; n++ {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			buf := make([]byte, 65536)
			c.SetReadDeadline(time.Now().Add(harness.EventTimeout))
			k, err := c.Read(buf)
			if err != nil {
				c.Close()
				continue
			}
			fb.mu.Lock()
			fb.requests = append(fb.requests, string(buf[:k]))
			fb.mu.Unlock()
			a := answer(n)
			switch {
			case a.silent:
				keep(c)
				continue
			case a.hangup:
				c.Close()
				continue
			}
			for i := range a.queued {
				q := `{"v":1,"type":"queued","pool":"p","position":2}`
				if i == 0 && a.waitFor > 0 {
					// As the broker sends it: with the estimated
					// start, where one is known.
					q = fmt.Sprintf(`{"v":1,"type":"queued","pool":"p","position":2,"start":1795693438084,"wait_ms":%d}`, a.waitFor)
				}
				c.Write([]byte(q))
			}
			var oob []byte
			if a.fds > 0 {
				fds := make([]int, a.fds)
				for i := range fds {
					fds[i] = nullFD
				}
				oob = unix.UnixRights(fds...)
			}
			if a.data != nil || oob != nil {
				c.WriteMsgUnix(a.data, oob, nil)
			}
			if a.requeue > 0 {
				keep(c)
				go func() {
					tick := time.NewTicker(a.requeue)
					defer tick.Stop()
					q := fmt.Sprintf(`{"v":1,"type":"queued","pool":"p","position":2,"wait_ms":%d}`, a.waitFor)
					for range tick.C {
						if _, err := c.Write([]byte(q)); err != nil {
							return // the module hung up, or the test ended
						}
					}
				}()
				continue
			}
			if a.queued > 0 && a.data == nil {
				keep(c)
				continue
			}
			c.Close()
		}
	}()
	return fb
}

// writePolicy writes a session-policy file beside the fake broker's socket.
func (fb *fakeBroker) writePolicy(t *testing.T, user, down string) {
	t.Helper()
	data := fmt.Sprintf("on_broker_down %s\nuser %s -\n", down, user)
	if err := os.WriteFile(filepath.Join(fb.Dir, "session-policy"), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPAMBadBroker: a broker socket answering garbage, a huge reply, a
// truncated one, nothing at all, or replies of the wrong shape: the module
// neither crashes nor hangs its host past timeout=, and the session goes
// as on_broker_down says (here deny: refused) — except for the answers
// that are well formed.
func TestPAMBadBroker(t *testing.T) {
	student := harness.NewUser(t)
	huge := `{"v":1,"type":"hide","message":"` + strings.Repeat("x", 200<<10) + `"}`
	long := `{"v":1,"type":"hide","message":"` + strings.Repeat("y", 5000) + `"}`
	deep := strings.Repeat("[", 100000)
	const refused, opened = "refused", "opened"
	cases := []struct {
		name string
		a    fakeAnswer
		want string
		env  string // a variable the session must have, NAME=VALUE
		line string // a line the helper must print
	}{
		{"nothing", fakeAnswer{silent: true}, refused, "", ""},
		{"hang up", fakeAnswer{hangup: true}, refused, "", ""},
		{"garbage", fakeAnswer{data: []byte("hello, world")}, refused, "", ""},
		{"empty packet", fakeAnswer{data: []byte{}}, refused, "", ""},
		{"huge", fakeAnswer{data: []byte(huge)}, refused, "", ""},
		{"too long a string", fakeAnswer{data: []byte(long)}, refused, "", ""},
		{"truncated", fakeAnswer{data: []byte(`{"v":1,"type":"hi`)}, refused, "", ""},
		{"nested object", fakeAnswer{data: []byte(`{"v":1,"type":"hide","env":[{"A":"1"}]}`)}, refused, "", ""},
		{"deep arrays", fakeAnswer{data: []byte(`{"v":1,"type":"hide","env":` + deep + `}`)}, refused, "", ""},
		{"raw NUL", fakeAnswer{data: []byte("{\"v\":1,\"type\":\"hide\",\"message\":\"a\x00b\"}")}, refused, "", ""},
		{"escaped NUL", fakeAnswer{data: []byte(`{"v":1,"type":"hide","env":["A=\u0000"]}`)}, refused, "", ""},
		{"bad UTF-8", fakeAnswer{data: []byte("{\"v\":1,\"type\":\"hide\",\"message\":\"\xff\xfe\"}")}, refused, "", ""},
		{"lone surrogate", fakeAnswer{data: []byte(`{"v":1,"type":"hide","message":"\ud800"}`)}, refused, "", ""},
		{"version as string", fakeAnswer{data: []byte(`{"v":"1","type":"hide"}`)}, refused, "", ""},
		{"type as array", fakeAnswer{data: []byte(`{"v":1,"type":["hide"]}`)}, refused, "", ""},
		{"env as string", fakeAnswer{data: []byte(`{"v":1,"type":"hide","env":"A=1"}`)}, refused, "", ""},
		{"float", fakeAnswer{data: []byte(`{"v":1.0,"type":"hide"}`)}, refused, "", ""},
		{"unknown key", fakeAnswer{data: []byte(`{"v":1,"type":"hide","extra":1}`)}, refused, "", ""},
		{"repeated key", fakeAnswer{data: []byte(`{"v":1,"type":"hide","type":"ignore"}`)}, refused, "", ""},
		{"other version", fakeAnswer{data: []byte(`{"v":2,"type":"ignore"}`)}, refused, "", ""},
		{"no version", fakeAnswer{data: []byte(`{"type":"ignore"}`)}, refused, "", ""},
		{"trailing bytes", fakeAnswer{data: []byte(`{"v":1,"type":"ignore"} {}`)}, refused, "", ""},
		{"bad variable", fakeAnswer{data: []byte(`{"v":1,"type":"hide","env":["PATH;rm=1"]}`)}, refused, "", ""},
		{"variable not the broker's", fakeAnswer{data: []byte(`{"v":1,"type":"hide","env":["NPURUN_DEVICES=","LD_PRELOAD=/tmp/evil.so"]}`)}, refused, "", ""},
		{"value not a device list", fakeAnswer{data: []byte(`{"v":1,"type":"hide","env":["NPURUN_DEVICES=0\nLD_PRELOAD=/tmp/evil.so"]}`)}, refused, "", ""},
		{"lease variable from the broker", fakeAnswer{data: []byte(`{"v":1,"type":"hide","env":["NPURUN_LEASE=0:0"]}`)}, refused, "", ""},
		{"too many variables", fakeAnswer{data: []byte(`{"v":1,"type":"hide","env":[` + strings.TrimSuffix(strings.Repeat(`"A=1",`, 17), ",") + `]}`)}, refused, "", ""},
		{"grant without descriptors", fakeAnswer{data: []byte(`{"v":1,"type":"grant","devices":[0],"env":["NPURUN_DEVICES=0"]}`)}, refused, "", ""},
		{"grant, descriptors short", fakeAnswer{data: []byte(`{"v":1,"type":"grant","devices":[0,1],"env":["NPURUN_DEVICES=0,1"]}`), fds: 1}, refused, "", ""},
		{"unknown type", fakeAnswer{data: []byte(`{"v":1,"type":"surprise"}`)}, refused, "", ""},
		{"queued, then nothing", fakeAnswer{queued: 1}, refused, "", ""},
		{"wait too long", fakeAnswer{data: []byte(`{"v":1,"type":"queued","wait_ms":99999999}`)}, refused, "", ""},
		{"error reply", fakeAnswer{data: []byte(`{"v":1,"type":"error","code":"denied","message":"not you\u001b[2J"}`)}, refused, "", "error npurun: not you?[2J"},
		{"C1 control", fakeAnswer{data: []byte(`{"v":1,"type":"error","code":"denied","message":"not you\u009b2J"}`)}, refused, "", "error npurun: not you?2J"},
		{"queued again and again", fakeAnswer{queued: 1, waitFor: 300, requeue: 150 * time.Millisecond}, refused, "", ""},
		{"hide with descriptors", fakeAnswer{data: []byte(`{"v":1,"type":"hide","env":["NPURUN_DEVICES="],"message":"in without a device"}`), fds: 2}, opened, "NPURUN_DEVICES=", ""},
		{"hide, unicode", fakeAnswer{data: []byte(`{"v":1,"type":"hide","env":["NPURUN_DEVICES="],"message":"\u00e9\ud83d\ude00 \u00e9"}`)}, opened, "NPURUN_DEVICES=", "info npurun: é😀 é"},
		{"grant", fakeAnswer{data: []byte(`{"v":1,"type":"grant","devices":[3],"vendor":"ascend","env":["NPURUN_DEVICES=3","ASCEND_RT_VISIBLE_DEVICES=3"],"waited_ms":0,"message":"npu 3 is yours"}`), fds: 1}, opened, "NPURUN_DEVICES=3", ""},
		{"queued, then grant", fakeAnswer{queued: 3, waitFor: 1500, data: []byte(`{"v":1,"type":"grant","devices":[3],"env":["NPURUN_DEVICES=3"]}`), fds: 1}, opened, "NPURUN_DEVICES=3", ""},
		{"ignore", fakeAnswer{data: []byte(`{"v":1,"type":"ignore"}`)}, opened, "", ""},
	}
	const timeout = 500 * time.Millisecond
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fb := startFakeBroker(t, func(int) fakeAnswer { return tc.a })
			fb.writePolicy(t, student.Name, "deny")
			conf := harness.PAMService(t, "npurun-fake", "required", fmt.Sprintf("socket=%s timeout=%g lease", fb.Socket, timeout.Seconds()))
			out, took := harness.RunPAM(t, conf, "npurun-fake", student.Name, "-fds")
			switch tc.want {
			case refused:
				if strings.Contains(out, "open ok") {
					t.Errorf("session opened; want it refused:\n%s", out)
				}
			case opened:
				if !strings.Contains(out, "open ok") {
					t.Errorf("session refused; want it opened:\n%s", out)
				}
			}
			if tc.env != "" && !strings.Contains(out, "env "+tc.env+"\n") {
				t.Errorf("want %s in the session's environment:\n%s", tc.env, out)
			}
			if tc.line != "" && !strings.Contains(out, tc.line+"\n") {
				t.Errorf("want the line %q:\n%s", tc.line, out)
			}
			if strings.ContainsAny(out, "\x1b\u009b") {
				t.Errorf("a control character reached the user:\n%q", out)
			}
			for _, v := range []string{"LD_PRELOAD", "NPURUN_LEASE=0:0"} {
				if strings.Contains(out, v) {
					t.Errorf("%s from the broker's answer reached the session:\n%s", v, out)
				}
			}
			limit := timeout + 2*time.Second
			if tc.a.waitFor > 0 {
				limit += time.Duration(tc.a.waitFor) * time.Millisecond
			}
			if took > limit {
				t.Errorf("the session took %s, more than timeout= allows", took)
			}
		})
	}
}

// TestPAMFuzz: 300 sessions against a broker answering random mutations
// of well-formed replies, with descriptors: the host survives every one,
// in bounded time, and keeps no descriptor from a session it closed.
func TestPAMFuzz(t *testing.T) {
	student := harness.NewUser(t)
	seeds := []string{
		`{"v":1,"type":"hide","env":["NPURUN_DEVICES=","CUDA_VISIBLE_DEVICES="],"message":"no device free"}`,
		`{"v":1,"type":"grant","devices":[3],"vendor":"ascend","env":["NPURUN_DEVICES=3"],"waited_ms":12,"message":"npu 3 is yours \u00e9"}`,
		`{"v":1,"type":"queued","pool":"interactive","position":2,"ahead":["bob"],"reason":"","wait_ms":1000}`,
		`{"v":1,"type":"error","code":"busy","message":"refused","hint":"later"}`,
		`{"v":1,"type":"ignore"}`,
	}
	rng := rand.New(rand.NewPCG(7, 11))
	mutate := func(s string) []byte {
		b := []byte(s)
		for range 1 + rng.IntN(4) {
			switch i := rng.IntN(len(b)); rng.IntN(4) {
			case 0:
				b[i] = byte(rng.IntN(256))
			case 1:
				b = append(b[:i], b[i+1:]...)
			case 2:
				const punct = "{}[]\",:\\u0"
				b = append(b[:i], append([]byte{punct[rng.IntN(len(punct))]}, b[i:]...)...)
			case 3:
				b = b[:i]
			}
			if len(b) == 0 {
				b = []byte{'{'}
			}
		}
		return b
	}
	const sessions = 300
	fb := startFakeBroker(t, func(n int) fakeAnswer {
		s := seeds[n%len(seeds)]
		return fakeAnswer{data: mutate(s), fds: rng.IntN(3)}
	})
	fb.writePolicy(t, student.Name, "hide")
	conf := harness.PAMService(t, "npurun-fuzz", "required", "socket="+fb.Socket+" timeout=0.3 lease")
	start := time.Now()
	out, _ := harness.RunPAM(t, conf, "npurun-fuzz", student.Name, "-repeat", strconv.Itoa(sessions), "-quiet", "-fds")
	if took := time.Since(start); took > sessions*400*time.Millisecond {
		t.Errorf("%d sessions took %s", sessions, took)
	}
	var fds int
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "fds "); ok {
			fds, _ = strconv.Atoi(v)
		}
	}
	if fds == 0 || fds > 10 {
		t.Errorf("after %d sessions the host has %d descriptors open (want a handful: none kept from closed sessions)", sessions, fds)
	}
}

// TestPAMSocketNotRoot: a socket= path that someone other than root
// serves (one in a directory a user can write) is no broker: the module
// takes nothing from it, neither a verdict nor a variable, and goes by
// on_broker_down (deny here: the restricted user's session is refused).
func TestPAMSocketNotRoot(t *testing.T) {
	mallory, student := harness.NewUser(t), harness.NewUser(t)
	dir := filepath.Join(harness.SharedDir(t), "run")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, int(mallory.UID), int(mallory.GID)); err != nil {
		t.Fatal(err)
	}
	policy := fmt.Sprintf("on_broker_down deny\nuser %s -\n", student.Name)
	if err := os.WriteFile(filepath.Join(dir, "session-policy"), []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, reply := range []string{
		`{"v":1,"type":"ignore"}`,
		`{"v":1,"type":"hide","env":["NPURUN_DEVICES=","LD_PRELOAD=/tmp/evil.so"]}`,
	} {
		t.Run(reply, func(t *testing.T) {
			sock := filepath.Join(dir, fmt.Sprintf("broker%d.sock", i))
			fake := harness.StartProc(t, "fake broker of "+mallory.Name, mallory.As(exec.Command(harness.PAMBins(t).Helper, "-serve", sock, "-reply", reply), dir))
			fake.WaitLine("listening")
			conf := harness.PAMService(t, "npurun-notroot", "required", "socket="+sock+" timeout=1")
			out, _ := harness.RunPAM(t, conf, "npurun-notroot", student.Name)
			if strings.Contains(out, "open ok") || strings.Contains(out, "LD_PRELOAD") {
				t.Errorf("a socket served by uid %d decided the session:\n%s", mallory.UID, out)
			}
			if !strings.Contains(out, "error npurun: the device broker does not answer") {
				t.Errorf("want the session refused as on_broker_down says:\n%s", out)
			}
		})
	}
}

// TestPAMUserNameWhole: the module sends the user's name as it is or not
// at all. A name too long for the request, or not UTF-8, is neither cut
// nor mended (either would name another account); a plain one is sent
// whole.
func TestPAMUserNameWhole(t *testing.T) {
	harness.NeedRoot(t)
	for _, tc := range []struct {
		name string
		sent int // requests the broker must see
	}{
		{"npurun-t" + strings.Repeat("x", 300), 0},
		{"npurun-t\xffroot", 0},
		{"npurun-tplain", 1},
	} {
		t.Run(fmt.Sprintf("%.20q", tc.name), func(t *testing.T) {
			fb := startFakeBroker(t, func(int) fakeAnswer { return fakeAnswer{data: []byte(`{"v":1,"type":"ignore"}`)} })
			conf := harness.PAMService(t, "npurun-name", "required", "socket="+fb.Socket+" timeout=1")
			harness.RunPAM(t, conf, "npurun-name", tc.name)
			reqs := fb.Requests()
			for _, req := range reqs {
				var r struct {
					User string `json:"user"`
				}
				if err := json.Unmarshal([]byte(req), &r); err != nil {
					t.Fatalf("request %q: %v", req, err)
				}
				if r.User != tc.name {
					t.Errorf("the module asked for user %q (%d bytes), not %q (%d bytes)", r.User, len(r.User), tc.name, len(tc.name))
				}
			}
			if len(reqs) != tc.sent {
				t.Errorf("%d requests, want %d", len(reqs), tc.sent)
			}
		})
	}
}

// TestPAMFullListenQueue: a broker whose listen queue is full (a burst of
// logins) is waited for within timeout=, not taken for one that is down.
func TestPAMFullListenQueue(t *testing.T) {
	student := harness.NewUser(t)
	sock := filepath.Join(harness.SharedDir(t), "broker.sock")
	ln, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ln)
	if err := unix.Bind(ln, &unix.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(ln, 0); err != nil {
		t.Fatal(err)
	}
	// Fill the queue: connections that the "broker" does not accept yet.
	var fillers []int
	defer func() {
		for _, fd := range fillers {
			unix.Close(fd)
		}
	}()
	for {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		err = unix.Connect(fd, &unix.SockaddrUnix{Name: sock})
		if err == unix.EAGAIN {
			unix.Close(fd)
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if fillers = append(fillers, fd); len(fillers) > 100 {
			t.Fatal("the listen queue does not fill")
		}
	}
	conf := harness.PAMService(t, "npurun-queue", "required", "socket="+sock+" timeout=10")
	p := harness.StartPAM(t, conf, "npurun-queue", student.Name)
	// The module waits in connect(2) for room in the queue; then there is.
	waitInSyscall(t, p, unix.SYS_CONNECT)
	accept := func() int {
		fds := []unix.PollFd{{Fd: int32(ln), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, int(harness.EventTimeout.Milliseconds())); n != 1 || err != nil {
			t.Fatalf("no connection to accept (%v); the module's output:\n%s", err, p.Output())
		}
		fd, _, err := unix.Accept4(ln, unix.SOCK_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	for range fillers {
		unix.Close(accept())
	}
	c := accept()
	defer unix.Close(c)
	buf := make([]byte, 65536)
	if n, err := unix.Read(c, buf); err != nil || !strings.Contains(string(buf[:n]), `"op":"session"`) {
		t.Fatalf("read the module's request: %v %q", err, buf[:max(n, 0)])
	}
	if _, err := unix.Write(c, []byte(`{"v":1,"type":"hide","env":["NPURUN_DEVICES="],"message":"served"}`)); err != nil {
		t.Fatal(err)
	}
	p.MustSucceed()
	<-p.OutDone // its output, read to the end
	if out := p.Output(); !strings.Contains(out, "open ok") || !strings.Contains(out, "info npurun: served") {
		t.Errorf("want the session opened by the broker's answer:\n%s", out)
	}
}

// waitInSyscall returns once one of p's threads is blocked in system call
// nr (/proc/PID/task/TID/syscall). The state is polled: a blocked call
// sends no event. It fails the test if p exits first.
func waitInSyscall(t *testing.T, p *harness.Proc, nr int) {
	t.Helper()
	want := strconv.Itoa(nr) + " "
	deadline := time.Now().Add(harness.EventTimeout)
	for time.Now().Before(deadline) {
		if p.Exited() {
			t.Fatalf("%s exited before it waited in system call %d; output:\n%s", p.Name, nr, p.Output())
		}
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/syscall", p.Cmd.Process.Pid))
		for _, f := range tasks {
			if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(b), want) {
				return
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("%s did not wait in system call %d within %s", p.Name, nr, harness.EventTimeout)
}

// TestPAMBrokerVariables: every variable the broker puts in a session (a
// grant's, for each vendor, and the hidden ones) is one the module takes:
// its list of the broker's variables is kept with npu's.
func TestPAMBrokerVariables(t *testing.T) {
	student := harness.NewUser(t)
	sets := map[string][]string{"hidden": npu.HiddenEnv()}
	for _, v := range []npu.Vendor{npu.Ascend, npu.NVIDIA, npu.Fake} {
		inv := &npu.Inventory{Vendor: v, Logical: map[int]int{3: 0, 12: 1}}
		sets[string(v)] = inv.Env([]int{12, 3})
	}
	for name, env := range sets {
		t.Run(name, func(t *testing.T) {
			data, err := json.Marshal(map[string]any{"v": 1, "type": "grant", "devices": []int{3, 12}, "env": env})
			if err != nil {
				t.Fatal(err)
			}
			fb := startFakeBroker(t, func(int) fakeAnswer { return fakeAnswer{data: data, fds: 2} })
			conf := harness.PAMService(t, "npurun-vars", "required", "socket="+fb.Socket+" timeout=1 lease")
			out, _ := harness.RunPAM(t, conf, "npurun-vars", student.Name)
			got := envOf(out)
			for _, kv := range env {
				k, v, _ := strings.Cut(kv, "=")
				if val, ok := got[k]; !ok || val != v {
					t.Errorf("%s: want %s in the session:\n%s", name, kv, out)
				}
			}
		})
	}
}
