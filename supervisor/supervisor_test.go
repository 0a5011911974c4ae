package supervisor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/wire"
)

// The test binary doubles as the supervisor: started with roleVar set, it
// runs Main as `npurun-supervise [ID]` would.
const (
	roleVar      = "NPURUN_SUPERVISOR_TEST_ROLE"
	reportForVar = "NPURUN_SUPERVISOR_TEST_REPORT_FOR"
)

// patience bounds every wait on an event, so that a broken supervisor
// fails the test instead of hanging it.
const patience = 30 * time.Second

func TestMain(m *testing.M) {
	if os.Getenv(roleVar) == "supervisor" {
		if d, err := time.ParseDuration(os.Getenv(reportForVar)); err == nil {
			reportFor = d
		}
		os.Exit(Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func TestEnd(t *testing.T) {
	bin := t.TempDir()
	writeScript(t, filepath.Join(bin, "hello"), 0o755, `echo "FOO=$FOO"; pwd; echo "lease=${NPURUN_LEASE-unset}"`)
	writeScript(t, filepath.Join(bin, "plain"), 0o644, `echo never`)
	cwd, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		argv       []string
		env        []string
		cwd        string
		idle       bool
		wantExit   int // -1: no exit code
		wantSignal string
		wantReason string // substring
		wantLog    []string
	}{
		{
			name:     "exit code",
			argv:     []string{"sh", "-c", "echo out; echo err >&2; exit 3"},
			wantExit: 3,
			wantLog:  []string{"npurun: task 7 started with no device at ", "out\n", "err\n", "npurun: task 7 ended: exit 3\n"},
		},
		{
			name:       "signal",
			argv:       []string{"sh", "-c", "kill -KILL $$"},
			wantExit:   -1,
			wantSignal: "SIGKILL",
			wantLog:    []string{"npurun: task 7 ended: killed by SIGKILL\n"},
		},
		{
			name:     "env, cwd and the task's PATH",
			argv:     []string{"hello"},
			env:      []string{"PATH=" + bin + ":/usr/bin:/bin", "FOO=bar", "NPURUN_LEASE=0:3"},
			cwd:      cwd,
			wantExit: 0,
			wantLog:  []string{"FOO=bar\n", cwd + "\n", "lease=unset\n", "ended: exit 0\n"},
		},
		{
			name:     "relative path",
			argv:     []string{"./hello"},
			cwd:      bin,
			wantExit: 0,
			wantLog:  []string{bin + "\n"},
		},
		{
			name:       "not found",
			argv:       []string{"hello"},
			wantExit:   127,
			wantReason: "start: look up hello: not found",
			wantLog:    []string{"npurun: task 7 did not start: start: look up hello"},
		},
		{
			name:       "not executable",
			argv:       []string{"./plain"},
			cwd:        bin,
			wantExit:   126,
			wantReason: "plain in " + bin + ": permission denied",
		},
		{
			name:     "idle",
			argv:     []string{"sh", "-c", `set -- $(cat /proc/$$/stat); echo "nice=${19}"; ionice -p $$`},
			idle:     true,
			wantExit: 0,
			wantLog:  []string{"nice=19\n", "idle\n"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := newSpec(t, tc.argv...)
			if tc.env != nil {
				spec.Env = tc.env
			}
			if tc.cwd != "" {
				spec.Cwd = tc.cwd
			}
			spec.Idle = tc.idle
			b := listen(t, spec.Socket)
			s := startSupervisor(t, spec, nil)
			st := b.awaitReport(t)
			if code := s.wait(t); code != 0 {
				t.Fatalf("supervisor exit %d, want 0; stderr:\n%s", code, s.stderr)
			}
			checkStatus(t, st, tc.wantExit, tc.wantSignal, tc.wantReason)
			log := readLog(t, spec.Log)
			for _, want := range tc.wantLog {
				if !strings.Contains(log, want) {
					t.Errorf("log lacks %q; log:\n%s", want, log)
				}
			}
			checkMode(t, spec.Log, 0o600)
			checkMode(t, filepath.Dir(spec.Log), 0o700|os.ModeDir)
		})
	}
}

// deviceEnv is the go-ahead's variables for devices, as the broker sends
// them for the fake vendor.
func deviceEnv(devices []int) []string {
	if len(devices) == 0 {
		return nil
	}
	ids := make([]string, len(devices))
	for i, d := range devices {
		ids[i] = strconv.Itoa(d)
	}
	return []string{"ASCEND_RT_VISIBLE_DEVICES=" + strings.Join(ids, ",")}
}

// TestLease: the command holds the lease's lock files at 20, 21, … as
// NPURUN_LEASE says, where a login bash leaves them open for what it
// starts (it marks 3 to 19 close-on-exec), and sees the go-ahead's device
// variables alone, not the stale ones its submitter's environment held (a
// C getenv takes the first of a name set twice).
func TestLease(t *testing.T) {
	spec := newSpec(t, "bash", "--login", "-i", "-c", `
		echo "lease=$NPURUN_LEASE"
		echo "visible=$(tr '\0' '\n' < /proc/$$/environ | grep -c '^ASCEND_RT_VISIBLE_DEVICES=') $ASCEND_RT_VISIBLE_DEVICES"
		for p in $(echo "$NPURUN_LEASE" | tr , ' '); do
			fd=${p#*:}
			echo "fd $fd: $(readlink /proc/self/fd/$fd) $(grep -c 'FLOCK.*WRITE' /proc/self/fdinfo/$fd)"
		done
		read x < "$GATE1"
		for p in $(echo "$NPURUN_LEASE" | tr , ' '); do
			eval "exec ${p#*:}<&-"
		done
		read x < "$GATE2"
		exit 0`)
	gate1, gate2 := makeFifo(t, "gate1"), makeFifo(t, "gate2")
	spec.Env = append(spec.Env, "HOME="+t.TempDir(), "GATE1="+gate1, "ASCEND_RT_VISIBLE_DEVICES=9", "NPURUN_LEASE=9:3", "GATE2="+gate2)
	spec.Devices = []int{0, 5}
	dir := t.TempDir()
	locks := lockFiles(t, dir, spec.Devices)
	b := listen(t, spec.Socket)
	hold := b.holdReplies(t)
	s := startSupervisor(t, spec, locks)

	release := openGate(t, gate1) // the command runs and has looked at its descriptors
	for _, dev := range spec.Devices {
		if err := tryLock(dir, dev); !errors.Is(err, unix.EWOULDBLOCK) {
			t.Errorf("npu%d while the command holds the lease: flock = %v, want EWOULDBLOCK; log:\n%s", dev, err, readLog(t, spec.Log))
		}
	}
	release()
	release = openGate(t, gate2) // the command has closed its copies and still runs
	for _, dev := range spec.Devices {
		if err := tryLock(dir, dev); err != nil {
			t.Errorf("npu%d once the command closed its copies: %v; the supervisor still holds it", dev, err)
		}
	}
	release()
	st := b.awaitReport(t)
	for _, dev := range spec.Devices {
		if err := tryLock(dir, dev); err != nil {
			t.Errorf("npu%d while the supervisor reports: %v", dev, err)
		}
	}
	hold()
	if code := s.wait(t); code != 0 {
		t.Fatalf("supervisor exit %d, want 0; stderr:\n%s", code, s.stderr)
	}
	checkStatus(t, st, 0, "", "")
	log := readLog(t, spec.Log)
	for _, want := range []string{
		"npurun: task 7 started on npu 0,5 at ",
		fmt.Sprintf("lease=0:%d,5:%d\n", wire.FirstLeaseFD, wire.FirstLeaseFD+1),
		"visible=1 0,5\n",
		fmt.Sprintf("fd %d: %s 1\n", wire.FirstLeaseFD, filepath.Join(dir, "npu0.lock")),
		fmt.Sprintf("fd %d: %s 1\n", wire.FirstLeaseFD+1, filepath.Join(dir, "npu5.lock")),
	} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q; log:\n%s", want, log)
		}
	}
}

func TestTimeLimit(t *testing.T) {
	tests := []struct {
		name       string
		script     string
		wantSignal string
	}{
		{
			name:       "leader ends on SIGTERM, the rest is killed",
			script:     `(trap '' TERM; exec sleep 1000) & echo $! > "$PIDS"; wait`,
			wantSignal: "SIGTERM",
		},
		{
			name:       "SIGKILL after the grace period",
			script:     `trap '' TERM; sleep 1000 & echo $! > "$PIDS"; wait`,
			wantSignal: "SIGKILL",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := newSpec(t, "sh", "-c", tc.script)
			pids := makeFifo(t, "pids")
			spec.Env = append(spec.Env, "PIDS="+pids)
			spec.TimeSec, spec.GraceSec = 1, 1
			b := listen(t, spec.Socket)
			s := startSupervisor(t, spec, nil)
			grandchild := openProcess(t, firstLine(t, pids))
			st := b.awaitReport(t)
			if code := s.wait(t); code != 0 {
				t.Fatalf("supervisor exit %d, want 0; stderr:\n%s", code, s.stderr)
			}
			checkStatus(t, st, -1, tc.wantSignal, "time limit 1s reached")
			awaitExit(t, grandchild)
			want := "npurun: task 7 ended: killed by " + tc.wantSignal + " (time limit 1s reached)\n"
			if log := readLog(t, spec.Log); !strings.Contains(log, want) {
				t.Errorf("log lacks %q; log:\n%s", want, log)
			}
		})
	}
}

func TestCancel(t *testing.T) {
	spec := newSpec(t, "sh", "-c", `echo ready > "$READY"; exec sleep 1000`)
	ready := makeFifo(t, "ready")
	spec.Env = append(spec.Env, "READY="+ready)
	b := listen(t, spec.Socket)
	s := startSupervisor(t, spec, nil)
	firstLine(t, ready)
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	st := b.awaitReport(t)
	if code := s.wait(t); code != 0 {
		t.Fatalf("supervisor exit %d, want 0; stderr:\n%s", code, s.stderr)
	}
	checkStatus(t, st, -1, "SIGTERM", "cancelled")
	want := "npurun: task 7 ended: killed by SIGTERM (cancelled)\n"
	if log := readLog(t, spec.Log); !strings.Contains(log, want) {
		t.Errorf("log lacks %q; log:\n%s", want, log)
	}
}

// TestReportRetried starts the broker only once the task has ended, so the
// supervisor's first attempts find no one.
func TestReportRetried(t *testing.T) {
	spec := newSpec(t, "sh", "-c", "exit 4")
	spec.Log = makeFifo(t, "log")
	lines := readLines(t, spec.Log)
	s := startSupervisor(t, spec, nil)
	awaitLine(t, lines, "npurun: task 7 started ")
	awaitLine(t, lines, "npurun: task 7 ended: exit 4")
	b := listen(t, spec.Socket)
	st := b.awaitReport(t)
	if code := s.wait(t); code != 0 {
		t.Fatalf("supervisor exit %d, want 0; stderr:\n%s", code, s.stderr)
	}
	checkStatus(t, st, 4, "", "")
}

// TestReportRetriedAcrossBrokerStop: a broker that stops while a report
// is in flight hangs up without an answer (EOF), and leaves its socket
// with no one listening (connection refused); neither is an answer, and
// the supervisor goes on trying until the next broker takes the report.
// (Only a broker's refusal is final: a stopping broker sends none.)
func TestReportRetriedAcrossBrokerStop(t *testing.T) {
	spec := newSpec(t, "sh", "-c", "exit 4")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: spec.Socket, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false) // as a killed broker leaves it
	s := startSupervisor(t, spec, nil)
	ln.SetDeadline(time.Now().Add(patience))
	c, err := ln.AcceptUnix()
	if err != nil {
		t.Fatalf("no report: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(patience))
	buf := make([]byte, wire.MaxMessage)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("no report: %v", err)
	}
	var req wire.Request
	if err := json.Unmarshal(buf[:n], &req); err != nil || req.Op != wire.OpTaskDone {
		t.Fatalf("not a task-done: %q (%v)", buf[:n], err)
	}
	c.Close() // the broker stops: no answer
	ln.Close()
	// Its next tries, from minBackoff on, find the socket refusing.
	select {
	case <-s.exited:
		t.Fatalf("supervisor exited (%d) while no broker was there to take its report; stderr:\n%s", s.cmd.ProcessState.ExitCode(), s.stderr)
	case <-time.After(5 * minBackoff):
	}
	if err := os.Remove(spec.Socket); err != nil {
		t.Fatal(err)
	}
	b := listen(t, spec.Socket) // the next broker
	st := b.awaitReport(t)
	if code := s.wait(t); code != 0 {
		t.Fatalf("supervisor exit %d, want 0; stderr:\n%s", code, s.stderr)
	}
	checkStatus(t, st, 4, "", "")
}

// TestReportAfterLateCancel: a SIGTERM that comes once the command's
// leader has exited (the broker's cancel of a task that was ending) is
// done with when the task's end is known: the report that follows is not
// given up at the first broker that cannot take it. The supervisor kept
// that SIGTERM queued, as no more cancel was awaited, and its report,
// which gives up at SIGTERM, gave up after the first try: the task's end
// was never recorded. Here the leader exits leaving a process that traps
// SIGTERM, so the supervisor is past the leader's end (it sent that
// process SIGTERM) when it gets its own; the broker answers the first
// report "busy", as one that cannot take it now.
func TestReportAfterLateCancel(t *testing.T) {
	spec := newSpec(t, "sh", "-c", `sh -c 'trap "echo termed" TERM; echo "left $$"; while :; do sleep 1; done' & exit 0`)
	spec.GraceSec = 600 // the leftover goes when the test kills it
	spec.Log = makeFifo(t, "log")
	lines := readLines(t, spec.Log)
	b := listen(t, spec.Socket)
	b.mu.Lock()
	b.refuse = []string{wire.CodeBusy}
	b.mu.Unlock()
	s := startSupervisor(t, spec, nil)
	left := ""
	for left == "" {
		select {
		case line := <-lines:
			if pid, ok := strings.CutPrefix(line, "left "); ok {
				left = pid
			}
		case <-time.After(patience):
			t.Fatalf("no leftover within %s", patience)
		}
	}
	pid, err := strconv.Atoi(left)
	if err != nil {
		t.Fatalf("leftover pid %q: %v", left, err)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // gone already, unless the test failed first
		unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
		unix.Close(pidfd)
	})
	awaitLine(t, lines, "termed") // the supervisor saw the leader's end
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0); err != nil {
		t.Fatal(err)
	}
	b.awaitReport(t) // refused: busy
	st := b.awaitReport(t)
	if code := s.wait(t); code != 0 {
		t.Fatalf("supervisor exit %d, want 0 (its report taken at the second try); stderr:\n%s", code, s.stderr)
	}
	checkStatus(t, st, 0, "", "")
}

// TestReportRetriedOverCap: a broker that refuses a report for a cap on
// connections or requests ("too-many", as it does when a restarted
// broker is flooded) is asked again, as one that is busy is: the cap
// passes. The supervisor took it for a final answer and gave up, and the
// task was lost (issue 27.10).
func TestReportRetriedOverCap(t *testing.T) {
	spec := newSpec(t, "sh", "-c", "exit 4")
	b := listen(t, spec.Socket)
	b.mu.Lock()
	b.refuse = []string{wire.CodeTooMany, wire.CodeTooMany}
	b.mu.Unlock()
	s := startSupervisor(t, spec, nil)
	for range 3 {
		b.awaitReport(t)
	}
	if code := s.wait(t); code != 0 {
		t.Fatalf("supervisor exit %d, want 0; stderr:\n%s", code, s.stderr)
	}
}

func TestReportGivesUp(t *testing.T) {
	spec := newSpec(t, "true")
	s := startSupervisor(t, spec, nil, reportForVar+"=300ms")
	if code := s.wait(t); code != 1 {
		t.Fatalf("supervisor exit %d, want 1; stderr:\n%s", code, s.stderr)
	}
	if !strings.Contains(s.stderr.String(), "gave up") {
		t.Errorf("stderr does not say it gave up:\n%s", s.stderr)
	}
}

func TestBadLog(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) string // returns the log path
	}{
		{"a directory where the file should be", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "task.log")
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
			return p
		}},
		{"a file where the directory should be", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "logs")
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(p, "task.log")
		}},
		{"a symbolic link", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "task.log")
			if err := os.Symlink(filepath.Join(dir, "elsewhere"), p); err != nil {
				t.Fatal(err)
			}
			return p
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := newSpec(t, "sh", "-c", "echo should not run")
			dir := t.TempDir()
			spec.Log = tc.setup(t, dir)
			spec.Devices = []int{2}
			locks := lockFiles(t, dir, spec.Devices)
			b := listen(t, spec.Socket)
			hold := b.holdReplies(t)
			s := startSupervisor(t, spec, locks)
			st := b.awaitReport(t)
			if err := tryLock(dir, 2); err != nil {
				t.Errorf("npu2 while the supervisor reports: %v; the lease was not released", err)
			}
			hold()
			if code := s.wait(t); code != 0 {
				t.Fatalf("supervisor exit %d, want 0; stderr:\n%s", code, s.stderr)
			}
			checkStatus(t, st, -1, "", "open log "+spec.Log+": ")
		})
	}
}

func TestBadSpec(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	spec := newSpec(t, "touch", marker)
	good, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	spec.UID++
	otherUser, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		args  []string
		stdin []byte
	}{
		{"garbage", []string{"7"}, []byte("not json")},
		{"another task's spec", []string{"8"}, good},
		{"another user's spec", []string{"7"}, otherUser},
		{"an idle supervisor, another user's spec", nil, otherUser},
		{"two ids", []string{"7", "7"}, good},
		{"id not a number", []string{"seven"}, good},
		{"id 0", []string{"0"}, good},
		{"too large", []string{"7"}, append(bytes.Repeat([]byte(" "), maxSpec+1), good...)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(testBinary(t), tc.args...)
			cmd.Env = []string{roleVar + "=supervisor", "PATH=/usr/bin:/bin"}
			sock := brokerSocket(t, cmd)
			if err := wire.SendMsg(int(sock.Fd()), tc.stdin, nil, 0); err != nil {
				t.Fatal(err)
			}
			sock.Close()
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("supervisor: %v, want exit 2; output:\n%s", err, out)
			}
			if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the command ran (%s exists: %v)", marker, err)
			}
		})
	}
}

// brokerSocket gives cmd, as its standard input, one end of a socket
// pair standing in for the broker's, and returns the other end.
func brokerSocket(t *testing.T, cmd *exec.Cmd) *os.File {
	t.Helper()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	child := os.NewFile(uintptr(pair[1]), "supervisor")
	t.Cleanup(func() { child.Close() })
	cmd.Stdin = child
	return os.NewFile(uintptr(pair[0]), "broker")
}

// newSpec is a Spec for task 7 with its own directory, log and socket.
func newSpec(t *testing.T, argv ...string) *wire.Spec {
	dir := t.TempDir()
	return &wire.Spec{
		ID:       7,
		UID:      uint32(os.Getuid()),
		Argv:     argv,
		Cwd:      dir,
		Env:      []string{"PATH=/usr/bin:/bin"},
		Log:      filepath.Join(dir, "logs", "task.log"),
		GraceSec: 1,
		Socket:   filepath.Join(dir, "broker.sock"),
	}
}

func testBinary(t *testing.T) string {
	t.Helper()
	p, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// supervisor is a running `npurun-supervise`.
type supervisor struct {
	cmd     *exec.Cmd
	stderr  *bytes.Buffer
	exited  chan struct{}
	started chan *wire.Started // its word that the command started; closed at the socket's end
}

// startSupervisor starts the supervisor as the broker does: the Spec on
// stdin, the locks at 3, 4, …, a session of its own. The test's copies of
// the locks are closed, as the broker closes its own.
func startSupervisor(t *testing.T, spec *wire.Spec, locks []*os.File, env ...string) *supervisor {
	t.Helper()
	return startWith(t, []string{strconv.FormatUint(spec.ID, 10)}, spec, locks, env...)
}

// startWith is startSupervisor with the supervisor's arguments: the task's
// id, or none for an idle one.
func startWith(t *testing.T, args []string, spec *wire.Spec, locks []*os.File, env ...string) *supervisor {
	t.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	s := &supervisor{stderr: new(bytes.Buffer), exited: make(chan struct{}), started: make(chan *wire.Started, 1)}
	s.cmd = exec.Command(testBinary(t), args...)
	s.cmd.Env = append([]string{roleVar + "=supervisor", "PATH=/usr/bin:/bin", "GORACE=atexit_sleep_ms=0"}, env...) // GORACE: no 1 s pause at exit
	s.cmd.Dir = "/"
	sock := brokerSocket(t, s.cmd)
	s.cmd.Stderr = s.stderr
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The broker's two messages: the Spec, then the go-ahead with the locks.
	fds := make([]int, len(locks))
	for i, f := range locks {
		fds[i] = int(f.Fd())
	}
	goAhead, err := json.Marshal(&wire.Spec{ID: spec.ID, Devices: spec.Devices, Env: deviceEnv(spec.Devices)})
	if err != nil {
		t.Fatal(err)
	}
	if err := wire.SendMsg(int(sock.Fd()), b, nil, 0); err != nil {
		t.Fatal(err)
	}
	if err := wire.SendMsg(int(sock.Fd()), goAhead, fds, 0); err != nil {
		t.Fatal(err)
	}
	for _, f := range locks {
		f.Close()
	}
	// Then its word that the command started, or the socket's end.
	go func() {
		defer sock.Close()
		defer close(s.started)
		buf := make([]byte, wire.MaxMessage)
		msg, _, err := wire.RecvMsg(int(sock.Fd()), buf, nil, 0)
		if err != nil {
			return
		}
		var st wire.Started
		if err := json.Unmarshal(msg, &st); err != nil {
			t.Errorf("the supervisor's word %q: %v", msg, err)
			return
		}
		s.started <- &st
	}()
	go func() {
		s.cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-s.exited:
		default:
			s.cmd.Process.Kill()
			<-s.exited
		}
	})
	return s
}

// wait returns the supervisor's exit status.
func (s *supervisor) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-s.exited:
		return s.cmd.ProcessState.ExitCode()
	case <-time.After(patience):
		t.Fatalf("supervisor still running after %s", patience)
		return -1
	}
}

// broker stands in for npubroker: it answers task-done with ok.
type broker struct {
	ln      *net.UnixListener
	reports chan *wire.Request
	mu      sync.Mutex
	hold    chan struct{} // when set, replies wait until it is closed
	refuse  []string      // error codes to answer with first, one request each
	done    chan struct{}
	stop    chan struct{} // closed when the test ends
}

func listen(t *testing.T, path string) *broker {
	t.Helper()
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	b := &broker{ln: ln, reports: make(chan *wire.Request, 16), done: make(chan struct{}), stop: make(chan struct{})}
	go b.serve(t)
	t.Cleanup(func() {
		close(b.stop) // a report no test reads any more does not hold serve
		ln.Close()
		<-b.done
	})
	return b
}

// holdReplies makes the broker hold its replies until the returned
// function is called (at the latest when the test ends).
func (b *broker) holdReplies(t *testing.T) func() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.hold = make(chan struct{})
	release := sync.OnceFunc(func() { close(b.hold) })
	t.Cleanup(release)
	return release
}

func (b *broker) serve(t *testing.T) {
	defer close(b.done)
	for {
		c, err := b.ln.AcceptUnix()
		if err != nil {
			return
		}
		if err := b.answer(c); err != nil {
			t.Errorf("broker: %v", err)
		}
		c.Close()
	}
}

// answer reads one task-done request, records it and replies ok.
func (b *broker) answer(c *net.UnixConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	buf := make([]byte, wire.MaxMessage)
	var msg []byte
	var recvErr error
	err = rc.Read(func(fd uintptr) bool {
		msg, _, recvErr = wire.RecvMsg(int(fd), buf, nil, 0)
		return !errors.Is(recvErr, unix.EAGAIN)
	})
	if err == nil {
		err = recvErr
	}
	if err != nil {
		return fmt.Errorf("receive: %w", err)
	}
	var req wire.Request
	if err := json.Unmarshal(msg, &req); err != nil {
		return fmt.Errorf("decode %q: %w", msg, err)
	}
	select {
	case b.reports <- &req:
	case <-b.stop:
		return nil
	}
	b.mu.Lock()
	hold := b.hold
	b.mu.Unlock()
	if hold != nil {
		<-hold
	}
	b.mu.Lock()
	reply := `{"v":1,"type":"ok"}`
	if len(b.refuse) > 0 {
		reply = fmt.Sprintf(`{"v":1,"type":"error","code":%q,"message":"refused"}`, b.refuse[0])
		b.refuse = b.refuse[1:]
	}
	b.mu.Unlock()
	_, err = c.Write([]byte(reply))
	return err
}

// awaitReport returns the status of the next task-done request.
func (b *broker) awaitReport(t *testing.T) *wire.Status {
	t.Helper()
	select {
	case req := <-b.reports:
		if req.V != wire.Version || req.Op != wire.OpTaskDone || req.ID != 7 || req.Status == nil {
			t.Fatalf("request %+v, want task-done of task 7 with a status", req)
		}
		return req.Status
	case <-time.After(patience):
		t.Fatalf("no task-done request within %s", patience)
		return nil
	}
}

// checkStatus compares a reported status; wantExit -1 means no exit code.
func checkStatus(t *testing.T, st *wire.Status, wantExit int, wantSignal, wantReason string) {
	t.Helper()
	exit := -1
	if st.Exit != nil {
		exit = *st.Exit
	}
	if exit != wantExit || st.Signal != wantSignal || !strings.Contains(st.Reason, wantReason) || (wantReason == "" && st.Reason != "") {
		t.Errorf("status = exit %d, signal %q, reason %q; want exit %d, signal %q, reason containing %q",
			exit, st.Signal, st.Reason, wantExit, wantSignal, wantReason)
	}
}

func writeScript(t *testing.T, path string, mode os.FileMode, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), mode); err != nil {
		t.Fatal(err)
	}
}

func readLog(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func checkMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode() != want {
		t.Errorf("%s: mode %v, want %v", path, fi.Mode(), want)
	}
}

// lockFiles creates npuN.lock in dir for each device and locks it, as the
// broker does before it starts a supervisor.
func lockFiles(t *testing.T, dir string, devices []int) []*os.File {
	t.Helper()
	var files []*os.File
	for _, dev := range devices {
		f, err := os.OpenFile(lockPath(dir, dev), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

func lockPath(dir string, dev int) string {
	return filepath.Join(dir, "npu"+strconv.Itoa(dev)+".lock")
}

// tryLock takes and drops device dev's lock through a new open file.
func tryLock(dir string, dev int) error {
	f, err := os.Open(lockPath(dir, dev))
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
}

func makeFifo(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := unix.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// openGate waits until the command opens the FIFO to read from it, and
// returns what lets the command go on.
func openGate(t *testing.T, path string) (release func()) {
	t.Helper()
	opened := make(chan *os.File, 1)
	go func() {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			t.Error(err)
		}
		opened <- f
	}()
	select {
	case f := <-opened:
		if f == nil {
			t.FailNow()
		}
		release = sync.OnceFunc(func() { f.Close() })
		t.Cleanup(release)
		return release
	case <-time.After(patience):
		t.Fatalf("command did not reach %s within %s", path, patience)
		return nil
	}
}

// readLines streams the lines written to a FIFO until its writers close it.
func readLines(t *testing.T, path string) <-chan string {
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		f, err := os.Open(path)
		if err != nil {
			return
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	t.Cleanup(func() { // unblock the open if no writer ever came
		if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
	return lines
}

func awaitLine(t *testing.T, lines <-chan string, prefix string) {
	t.Helper()
	timeout := time.After(patience)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("log closed without a line starting %q", prefix)
			}
			if strings.HasPrefix(line, prefix) {
				return
			}
		case <-timeout:
			t.Fatalf("no log line starting %q within %s", prefix, patience)
		}
	}
}

// firstLine reads the first line the command writes to a FIFO.
func firstLine(t *testing.T, path string) string {
	t.Helper()
	lines := readLines(t, path)
	select {
	case line, ok := <-lines:
		if !ok {
			t.Fatalf("%s closed without a line", path)
		}
		return line
	case <-time.After(patience):
		t.Fatalf("nothing written to %s within %s", path, patience)
		return ""
	}
}

// openProcess opens a pidfd, which becomes readable when the process ends
// (a zombie nobody reaps still answers kill(pid, 0), so that is no test).
func openProcess(t *testing.T, pid string) int {
	t.Helper()
	n, err := strconv.Atoi(pid)
	if err != nil {
		t.Fatalf("pid %q: %v", pid, err)
	}
	fd, err := unix.PidfdOpen(n, 0)
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", n, err)
	}
	t.Cleanup(func() {
		unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) // a failed test leaves no sleep behind
		unix.Close(fd)
	})
	return fd
}

func awaitExit(t *testing.T, pidfd int) {
	t.Helper()
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(patience/time.Millisecond))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatalf("grandchild still alive %s after the task ended", patience)
		}
		return
	}
}

// TestNoGoAhead: a supervisor that gets no go-ahead exits having run
// nothing: one the broker drops (the task cancelled while it waited), one
// given a go-ahead whose descriptors do not match its devices, and one
// whose broker goes away without a word (dead, maybe after it recorded the
// start), which first tells the next broker that its task never started.
func TestNoGoAhead(t *testing.T) {
	tests := []struct {
		name    string
		goAhead func(t *testing.T, sock *os.File, spec *wire.Spec)
		tells   bool // it tells a broker that the task never started
	}{
		{"socket closed", func(*testing.T, *os.File, *wire.Spec) {}, true},
		{"dropped", func(t *testing.T, sock *os.File, spec *wire.Spec) {
			b, err := json.Marshal(&wire.Spec{ID: spec.ID, Drop: true})
			if err != nil {
				t.Fatal(err)
			}
			if err := wire.SendMsg(int(sock.Fd()), b, nil, 0); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"descriptors missing", func(t *testing.T, sock *os.File, spec *wire.Spec) {
			b, err := json.Marshal(&wire.Spec{ID: spec.ID, Devices: []int{0, 1}})
			if err != nil {
				t.Fatal(err)
			}
			if err := wire.SendMsg(int(sock.Fd()), b, nil, 0); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"another task's go-ahead", func(t *testing.T, sock *os.File, spec *wire.Spec) {
			b, err := json.Marshal(&wire.Spec{ID: spec.ID + 1})
			if err != nil {
				t.Fatal(err)
			}
			if err := wire.SendMsg(int(sock.Fd()), b, nil, 0); err != nil {
				t.Fatal(err)
			}
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			marker := filepath.Join(t.TempDir(), "ran")
			spec := newSpec(t, "sh", "-c", "touch "+marker)
			b, err := json.Marshal(spec)
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(testBinary(t), strconv.FormatUint(spec.ID, 10))
			cmd.Env = []string{roleVar + "=supervisor", "PATH=/usr/bin:/bin", "GORACE=atexit_sleep_ms=0"}
			sock := brokerSocket(t, cmd)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if err := wire.SendMsg(int(sock.Fd()), b, nil, 0); err != nil {
				t.Fatal(err)
			}
			var b2 *broker
			if tc.tells {
				b2 = listen(t, spec.Socket)
			}
			tc.goAhead(t, sock, spec)
			sock.Close()
			if err := cmd.Wait(); err != nil {
				t.Fatalf("supervisor: %v, want exit 0; stderr:\n%s", err, &stderr)
			}
			if b2 != nil {
				select {
				case req := <-b2.reports:
					if req.Op != wire.OpNotStarted || req.ID != spec.ID {
						t.Errorf("request %+v, want %s of task %d", req, wire.OpNotStarted, spec.ID)
					}
				default:
					t.Errorf("the supervisor exited without telling a broker that task %d never started", spec.ID)
				}
			}
			if !strings.Contains(stderr.String(), "not started") {
				t.Errorf("stderr does not say the task was not started:\n%s", &stderr)
			}
			if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the command ran (%s exists: %v)", marker, err)
			}
		})
	}
}

// TestLeftovers: whatever a task started ends with it, even a process that
// left the leader's process group or session and was orphaned, and it is
// gone (its hold on the lease with it) before the end is reported.
func TestLeftovers(t *testing.T) {
	tests := []struct {
		name       string
		script     string
		timeSec    int64
		wantExit   int
		wantSignal string
		wantReason string
		wantLog    string
	}{
		{
			name:     "background job, leader exits 0",
			script:   `sleep 1000 & echo $! > "$PIDS"; read x < "$GATE"; exit 0`,
			wantExit: 0,
			wantLog:  "its command exited leaving 1 process running; it was ended",
		},
		{
			name:     "own session, orphaned, ignores SIGTERM",
			script:   `setsid -f sh -c 'trap "" TERM; echo $$ > "$PIDS"; exec sleep 1000'; read x < "$GATE"; exit 0`,
			wantExit: 0,
			wantLog:  "its command exited leaving 1 process running; it was ended",
		},
		{
			name:       "own process group, time limit",
			script:     `setsid -f sh -c 'echo $$ > "$PIDS"; exec sleep 1000'; read x < "$GATE"; exec sleep 1000`,
			timeSec:    1,
			wantExit:   -1,
			wantSignal: "SIGTERM",
			wantReason: "time limit 1s reached",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := newSpec(t, "sh", "-c", tc.script)
			// The command ends (by itself, or by its limit) only once the
			// test holds a pidfd of the process it leaves: the
			// supervisor ends that one at once.
			pids, gate := makeFifo(t, "pids"), makeFifo(t, "gate")
			spec.Env = append(spec.Env, "PIDS="+pids, "GATE="+gate)
			spec.TimeSec = tc.timeSec
			spec.Devices = []int{3}
			dir := t.TempDir()
			locks := lockFiles(t, dir, spec.Devices)
			b := listen(t, spec.Socket)
			s := startSupervisor(t, spec, locks)
			left := openProcess(t, firstLine(t, pids))
			openGate(t, gate)()
			st := b.awaitReport(t)
			// Reported only once nothing of the task is left.
			if n, err := unix.Poll([]unix.PollFd{{Fd: int32(left), Events: unix.POLLIN}}, 0); err != nil || n != 1 {
				t.Errorf("the process the task left was still running when its end was reported")
			}
			if err := tryLock(dir, 3); err != nil {
				t.Errorf("npu3 when the end was reported: %v; the lease outlived the task", err)
			}
			if code := s.wait(t); code != 0 {
				t.Fatalf("supervisor exit %d, want 0; stderr:\n%s", code, s.stderr)
			}
			checkStatus(t, st, tc.wantExit, tc.wantSignal, tc.wantReason)
			if log := readLog(t, spec.Log); !strings.Contains(log, tc.wantLog) {
				t.Errorf("log lacks %q; log:\n%s", tc.wantLog, log)
			}
		})
	}
}

// TestIdle: a supervisor started with no task id is idle: given a Spec
// (any task of its uid) it runs it as one started for it would; let go
// (its socket closed with nothing sent) it exits 0 having run nothing.
func TestIdle(t *testing.T) {
	t.Run("given a task", func(t *testing.T) {
		spec := newSpec(t, "sh", "-c", "echo ran as idle")
		b := listen(t, spec.Socket)
		s := startWith(t, nil, spec, nil)
		st := b.awaitReport(t)
		if code := s.wait(t); code != 0 {
			t.Fatalf("supervisor exit %d, want 0; stderr:\n%s", code, s.stderr)
		}
		checkStatus(t, st, 0, "", "")
		if log := readLog(t, spec.Log); !strings.Contains(log, "ran as idle\n") {
			t.Errorf("log lacks the command's output:\n%s", log)
		}
	})
	t.Run("let go", func(t *testing.T) {
		cmd := exec.Command(testBinary(t))
		cmd.Env = []string{roleVar + "=supervisor", "PATH=/usr/bin:/bin", "GORACE=atexit_sleep_ms=0"}
		sock := brokerSocket(t, cmd)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sock.Close()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("idle supervisor let go: %v, want exit 0; stderr:\n%s", err, &stderr)
		}
		if stderr.Len() > 0 {
			t.Errorf("idle supervisor let go said:\n%s", &stderr)
		}
	})
}

// TestStarted: the supervisor tells the broker, on the socket its Spec
// came on, once the command has started (while it still runs, not at its
// end), or that it could not start.
func TestStarted(t *testing.T) {
	t.Run("started", func(t *testing.T) {
		spec := newSpec(t, "sh", "-c", `read x < "$GATE"`)
		gate := makeFifo(t, "gate")
		spec.Env = append(spec.Env, "GATE="+gate)
		b := listen(t, spec.Socket)
		s := startSupervisor(t, spec, nil)
		release := openGate(t, gate) // the command runs, and waits for us
		select {
		case st, ok := <-s.started:
			if !ok || st.ID != spec.ID || !st.Started {
				t.Errorf("the supervisor's word: %+v (socket open: %v), want task %d started", st, ok, spec.ID)
			}
		case <-time.After(patience):
			t.Fatalf("no word that the command started within %s, while it runs", patience)
		}
		release()
		b.awaitReport(t)
		if code := s.wait(t); code != 0 {
			t.Fatalf("supervisor exit %d, want 0; stderr:\n%s", code, s.stderr)
		}
	})
	t.Run("not found", func(t *testing.T) {
		spec := newSpec(t, "no-such-command-npurun")
		b := listen(t, spec.Socket)
		s := startSupervisor(t, spec, nil)
		select {
		case st, ok := <-s.started:
			if !ok || st.ID != spec.ID || st.Started {
				t.Errorf("the supervisor's word: %+v (socket open: %v), want task %d not started", st, ok, spec.ID)
			}
		case <-time.After(patience):
			t.Fatalf("no word within %s", patience)
		}
		checkStatus(t, b.awaitReport(t), 127, "", "not found")
		s.wait(t)
	})
}
