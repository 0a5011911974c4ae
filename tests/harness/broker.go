package harness

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/wire"
	_ "github.com/npurun/npurun/wire/jsoncodec"
)

// Binaries are the commands under test, built once per test run into a
// directory every user can read (tests run commands as other users too).
type Binaries struct {
	Dir, Broker, Npurun, TaskSubmit, Supervisor, Workload, Runtime string
	Slurm                                                          string // npurun-slurm, Slurm's Prolog and Epilog
}

// binDir is the directory BuildOnce built into, for Main to remove.
var binDir atomic.Pointer[string]

// builtDir is the directory of the built binaries, "" where no test built them.
func builtDir() string {
	if d := binDir.Load(); d != nil {
		return *d
	}
	return ""
}

// BuildOnce builds the programs, once per test binary.
var BuildOnce = sync.OnceValues(func() (*Binaries, error) {
	dir, err := os.MkdirTemp("", "npurun-bin-")
	if err != nil {
		return nil, err
	}
	binDir.Store(&dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	cmd := exec.Command("go", "build", "-trimpath", "-o", dir+"/",
		"github.com/npurun/npurun/cmd/npurun",
		"github.com/npurun/npurun/cmd/task-submit",
		"github.com/npurun/npurun/cmd/npurun-supervise", // found by the broker beside it
		"github.com/npurun/npurun/cmd/npurun-slurm",
		"github.com/npurun/npurun/tests/workload")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build: %v\n%s", err, out)
	}
	// The broker as the Makefile builds it, with cgo: its user lookups go
	// through NSS. (Built without, the tests ran another broker than ships.)
	// npurun-runtime-create likewise: it names a container's owner by uid.
	cmd = exec.Command("go", "build", "-trimpath", "-o", dir+"/", "github.com/npurun/npurun/cmd/npubroker", "github.com/npurun/npurun/cmd/npurun-runtime-create")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build: %v\n%s", err, out)
	}
	// npurun-runtime, the engine's runtime, is C (as the Makefile builds it).
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	cmd = exec.Command(cc, "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O2", "-o", filepath.Join(dir, "npurun-runtime"), filepath.Join(Root(), "container", "front", "npurun-runtime.c"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build npurun-runtime: %v\n%s", err, out)
	}
	return &Binaries{
		Dir:        dir,
		Broker:     filepath.Join(dir, "npubroker"),
		Npurun:     filepath.Join(dir, "npurun"),
		TaskSubmit: filepath.Join(dir, "task-submit"),
		Supervisor: filepath.Join(dir, "npurun-supervise"),
		Workload:   filepath.Join(dir, "workload"),
		Slurm:      filepath.Join(dir, "npurun-slurm"),
		Runtime:    filepath.Join(dir, "npurun-runtime"),
	}, nil
})

// Bins returns the built binaries, failing the test if they do not build.
func Bins(t testing.TB) *Binaries {
	t.Helper()
	b, err := BuildOnce()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// NeedRoot skips a test that needs root, except in CI (CI=true), where a
// skip would hide a gap and so is a failure.
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("this test needs root, and CI=true: run CI as root")
	}
	t.Skip("needs root (run as root, or in CI)")
}

// SharedDir makes a temporary directory that other users may enter (a
// t.TempDir's parent is private), removed when the test ends.
func SharedDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "npurun-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// RunTmp makes a directory that other users may enter for a broker's run
// directory, on a tmpfs where the machine has one at /dev/shm: in production
// the run directory is /run, a tmpfs, and a lease's end makes a file there.
func RunTmp(t testing.TB) string {
	t.Helper()
	var fs syscall.Statfs_t
	if syscall.Statfs("/dev/shm", &fs) != nil || fs.Type != 0x01021994 { // TMPFS_MAGIC
		return SharedDir(t)
	}
	dir, err := os.MkdirTemp("/dev/shm", "npurun-run-")
	if err != nil {
		return SharedDir(t)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// FakeConfig is the smallest config: n fake devices 0..n-1.
func FakeConfig(n int) string {
	return fmt.Sprintf("[devices]\nvendor = \"fake\"\nids = \"0-%d\"\n", n-1)
}

// Broker is an npubroker serve process in a directory of the test's own.
type Broker struct {
	T        testing.TB
	Bin      *Binaries
	Dir      string
	Conf     string
	RunDir   string
	StateDir string
	Socket   string
	Cgroup   string // the parent of its tasks' control groups (--cgroup), "" for none
	StartIn  string // a control group to start the broker in, with --cgroup auto; "" for Cgroup

	ExtraEnv []string // added to the broker process's environment

	Mu     sync.Mutex
	Cmd    *exec.Cmd
	log    strings.Builder
	logged chan struct{} // closed and replaced on every log line
	done   chan struct{}
	// sups: pidfds of the supervisors its broker processes started, taken
	// as each stopped, where no control group of the test's ends them at
	// its end (endSupervisors)
	sups []int
}

// StartBroker writes conf to a new directory and starts a broker on it.
func StartBroker(t testing.TB, conf string) *Broker {
	t.Helper()
	b := NewBroker(t, conf)
	b.Start()
	return b
}

// StartBrokerEnv is StartBroker with variables added to the broker
// process's environment (NAME=value).
func StartBrokerEnv(t testing.TB, conf string, env ...string) *Broker {
	t.Helper()
	b := NewBroker(t, conf, env...)
	b.Start()
	return b
}

// NewBroker writes conf to a new directory and prepares a broker on it,
// not started yet; env is added to the broker process's environment.
func NewBroker(t testing.TB, conf string, env ...string) *Broker {
	t.Helper()
	dir := SharedDir(t)
	// Each test's brokers claim their devices in a directory of the
	// test's (never the machine's /run/npurun-devices): the trees of
	// nodes of parallel tests share device numbers. A variable in env
	// comes later and wins.
	env = append([]string{"NPUBROKER_CLAIM_DIR=" + filepath.Join(dir, "claims")}, env...)
	b := &Broker{T: t, Bin: Bins(t), Dir: dir, Conf: filepath.Join(dir, "npurun.conf"), RunDir: filepath.Join(RunTmp(t), "run"), ExtraEnv: env}
	b.Cgroup = OwnCgroupParent(t) // removed after the broker has stopped
	b.Socket = filepath.Join(b.RunDir, "broker.sock")
	b.StateDir = filepath.Join(dir, "spool")
	if err := os.WriteFile(b.Conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	b.logged = make(chan struct{})
	t.Cleanup(func() {
		b.Stop()
		b.endSupervisors()
		if t.Failed() {
			t.Logf("broker log:\n%s", b.Log())
		}
	})
	return b
}

// Start starts the broker process and returns once it serves: when it has
// printed its "serving" line.
func (b *Broker) Start() {
	b.T.Helper()
	cmd := exec.Command(b.Bin.Broker, "serve", "--config", b.Conf, "--run-dir", b.RunDir, "--socket", b.Socket, "--state-dir", b.StateDir)
	switch {
	case b.StartIn != "":
		// Born in that group (CLONE_INTO_CGROUP), as systemd starts
		// the service in its own.
		cmd.Args = append(cmd.Args, "--cgroup", "auto")
		cg, err := os.Open(b.StartIn)
		if err != nil {
			b.T.Fatal(err)
		}
		defer cg.Close()
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	case b.Cgroup != "":
		cmd.Args = append(cmd.Args, "--cgroup", b.Cgroup)
	default:
		cmd.Args = append(cmd.Args, "--cgroup", "off") // never the machine's own groups
	}
	cmd.Env = append(os.Environ(), b.ExtraEnv...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		b.T.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.T.Fatal(err)
	}
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		signalled := false
		for sc.Scan() {
			b.Mu.Lock()
			b.log.WriteString(sc.Text() + "\n")
			close(b.logged)
			b.logged = make(chan struct{})
			b.Mu.Unlock()
			if !signalled && strings.Contains(sc.Text(), "serving") {
				close(ready)
				signalled = true
			}
		}
		io.Copy(io.Discard, stderr)
		cmd.Wait()
		close(done)
	}()
	b.Mu.Lock()
	b.Cmd, b.done = cmd, done
	b.Mu.Unlock()
	select {
	case <-ready:
	case <-done:
		b.T.Fatalf("broker exited before serving:\n%s", b.Log())
	case <-time.After(30 * time.Second):
		b.T.Fatalf("broker did not serve within 30s:\n%s", b.Log())
	}
}

func (b *Broker) Signal(sig syscall.Signal) {
	b.Mu.Lock()
	cmd, done := b.Cmd, b.done
	b.Cmd = nil
	b.Mu.Unlock()
	if cmd == nil {
		return
	}
	// Its idle supervisors (npurun-supervise, one per user whose task
	// started lately) exit once their socket to it closes: wait for them
	// too, so that a test user they run as can be removed. One that looked
	// idle may have been given a task meanwhile, and runs it on: it lets
	// go of the socket on its standard input as its task starts.
	var idle []int
	for _, p := range Supervisors(b.Bin) {
		if p.Idle && p.PPID == cmd.Process.Pid {
			idle = append(idle, p.PID)
		}
		if b.Cgroup == "" && p.PPID == cmd.Process.Pid {
			if fd, err := unix.PidfdOpen(p.PID, 0); err == nil {
				b.Mu.Lock()
				b.sups = append(b.sups, fd)
				b.Mu.Unlock()
			}
		}
	}
	cmd.Process.Signal(sig)
	<-done
	deadline := time.Now().Add(EventTimeout)
	for _, pid := range idle {
		awaitIdleGone(pid, deadline)
	}
}

// awaitIdleGone waits until deadline for the idle supervisor pid to exit,
// or to start a task (its standard input is no longer a socket).
func awaitIdleGone(pid int, deadline time.Time) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // gone already
	}
	defer unix.Close(fd)
	for time.Now().Before(deadline) {
		if fd0, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/0", pid)); !strings.HasPrefix(fd0, "socket:") {
			return
		}
		// Woken by its exit; the standard input is looked at again in a while.
		if n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 10); n > 0 {
			return
		}
	}
}

// endSupervisors ends the supervisors the test's broker processes left
// running, where no control group of the test's kills them as it is
// removed (an ordinary user's run, or no cgroup v2): one whose task runs
// on, or one that retries its report to a broker that is gone, would
// otherwise run on after the test (for a day), and be taken for a later
// test's. Each gets SIGTERM (a cancel of its task, then, reporting to no
// broker, its end) again every second until it is gone, and SIGKILL after
// EventTimeout.
func (b *Broker) endSupervisors() {
	b.Mu.Lock()
	sups := b.sups
	b.sups = nil
	b.Mu.Unlock()
	for _, fd := range sups {
		deadline := time.Now().Add(EventTimeout)
		for {
			sig := unix.SIGTERM
			if time.Now().After(deadline) {
				sig = unix.SIGKILL
			}
			if unix.PidfdSendSignal(fd, sig, nil, 0) != nil {
				break // gone
			}
			if AwaitExit(fd, time.Second) {
				break // exited
			}
		}
		unix.Close(fd)
	}
}

// Kill kills the broker with SIGKILL and waits for it to be gone.
func (b *Broker) Kill() { b.Signal(syscall.SIGKILL) }

// FlushAccounting has the broker write the accounting records it has
// queued: npubroker usage has its writer, the broker's own goroutine,
// write them before it reads. A test that kills the broker with SIGKILL
// and wants the next broker to name a lease's holder from the accounting
// log calls it first: a kill -9 loses what the writer has not written
// (TestShareRestrictedUsers lost a grant's record so in CI).
func (b *Broker) FlushAccounting(t testing.TB) {
	t.Helper()
	cmd := exec.Command(b.Bin.Broker, "usage", "--json")
	cmd.Env = b.Env()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npubroker usage: %v\n%s", err, out)
	}
}

// Stop stops the broker with SIGTERM and waits for it to be gone.
func (b *Broker) Stop() { b.Signal(syscall.SIGTERM) }

// Pid is the broker's process id, 0 when it is not running.
func (b *Broker) Pid() int {
	b.Mu.Lock()
	defer b.Mu.Unlock()
	if b.Cmd == nil {
		return 0
	}
	return b.Cmd.Process.Pid
}

// WaitLog waits for the broker to log a line containing substr after the
// first skip bytes of its log, and returns the log's length after that
// line; it fails the test if none comes within EventTimeout.
func (b *Broker) WaitLog(skip int, substr string) int {
	b.T.Helper()
	return b.WaitLogWithin(skip, substr, EventTimeout)
}

// WaitLogWithin is WaitLog with a time limit of its own, for a line that
// waits on the background scan, which paces itself by its CPU time (more
// processes on a loaded machine: rarer scans).
func (b *Broker) WaitLogWithin(skip int, substr string, within time.Duration) int {
	b.T.Helper()
	deadline := time.After(within)
	for {
		b.Mu.Lock()
		text, ch := b.log.String(), b.logged
		b.Mu.Unlock()
		if i := strings.Index(text[min(skip, len(text)):], substr); i >= 0 {
			at := min(skip, len(text)) + i
			if nl := strings.IndexByte(text[at:], '\n'); nl >= 0 {
				return at + nl + 1
			}
			return len(text)
		}
		select {
		case <-ch:
		case <-deadline:
			b.T.Fatalf("the broker did not log %q within %s; log:\n%s", substr, within, text)
		}
	}
}

// LogLen is the length of the broker's log so far, for WaitLog.
func (b *Broker) LogLen() int {
	b.Mu.Lock()
	defer b.Mu.Unlock()
	return b.log.Len()
}

// Log is what the broker has written to standard error so far.
func (b *Broker) Log() string {
	b.Mu.Lock()
	defer b.Mu.Unlock()
	return b.log.String()
}

// Env is the environment for clients of this broker.
func (b *Broker) Env() []string {
	return append(os.Environ(), "NPURUN_SOCKET="+b.Socket)
}

// Npurun prepares an npurun command against this broker.
func (b *Broker) Npurun(args ...string) *exec.Cmd {
	cmd := exec.Command(b.Bin.Npurun, args...)
	cmd.Env = b.Env()
	return cmd
}

// TaskSubmit prepares a task-submit command against this broker.
func (b *Broker) TaskSubmit(args ...string) *exec.Cmd {
	cmd := exec.Command(b.Bin.TaskSubmit, args...)
	cmd.Env = b.Env()
	return cmd
}

// Dial opens a protocol connection to the broker.
func (b *Broker) Dial() *wire.Conn {
	b.T.Helper()
	c, err := wire.Dial(b.Socket)
	if err != nil {
		b.T.Fatal(err)
	}
	b.T.Cleanup(func() { c.Close() })
	return c
}
