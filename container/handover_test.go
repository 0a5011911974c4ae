package container

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// lockedFile opens a fresh file under dir and takes an exclusive flock on
// it, as the broker does for a lease; it returns the descriptor and the
// path.
func lockedFile(t *testing.T, dir, name string) (int, string) {
	t.Helper()
	p := filepath.Join(dir, name)
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	return fd, p
}

// free tells whether the flock on path can be taken now (by another open
// file, as the next lease's would be).
func free(t *testing.T, path string) bool {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return false
	}
	return true
}

func sameFile(t *testing.T, a, b int) bool {
	t.Helper()
	var sa, sb unix.Stat_t
	if unix.Fstat(a, &sa) != nil || unix.Fstat(b, &sb) != nil {
		t.Fatal("fstat")
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// TestHandoverOnce: the runtime takes the lease once, as the same open
// files (their flocks with them); npurun's copies are gone then, so the
// lease is the taker's alone; a second take finds nobody.
func TestHandoverOnce(t *testing.T) {
	dir := t.TempDir()
	fd3, p3 := lockedFile(t, dir, "npu3.lock")
	fd5, p5 := lockedFile(t, dir, "npu5.lock")
	h, err := NewHandover("ascend", []int{3, 5}, []int{fd3, fd5})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if !strings.HasPrefix(h.Env(), "NPURUN_HANDOVER=@npurun-handover/") {
		t.Fatalf("Env = %q", h.Env())
	}
	// The caller's own descriptors go: the hand-over holds copies.
	unix.Close(fd3)
	unix.Close(fd5)
	if free(t, p3) || free(t, p5) {
		t.Fatal("the hand-over's copies do not hold the lease")
	}
	served := make(chan error, 1)
	go func() { served <- h.Serve(-1) }()
	r, err := Take(h.Addr, "c0ffee", -1)
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if h.Taken() != "c0ffee" {
		t.Errorf("Taken = %q", h.Taken())
	}
	if r.Vendor != "ascend" || len(r.Devices) != 2 || r.Devices[0] != 3 || r.Devices[1] != 5 || len(r.FDs) != 2 {
		t.Fatalf("received %+v", r)
	}
	if r.UID != uint32(os.Getuid()) || r.PID != os.Getpid() {
		t.Errorf("owner %d (pid %d), want %d (pid %d): from the socket", r.UID, r.PID, os.Getuid(), os.Getpid())
	}
	if free(t, p3) || free(t, p5) {
		t.Fatal("the lease is free while the runtime holds what it took")
	}
	check, _ := lockedFileNoLock(t, p3)
	defer unix.Close(check)
	if !sameFile(t, r.FDs[0], check) {
		t.Error("npu 3's descriptor is another file")
	}
	unix.Close(r.FDs[0])
	unix.Close(r.FDs[1])
	if !free(t, p3) || !free(t, p5) {
		t.Error("npurun still holds a copy of the lease after handing it over")
	}
	if _, err := Take(h.Addr, "again", -1); !errors.Is(err, ErrGone) {
		t.Errorf("a second take: %v, want ErrGone", err)
	}
}

func lockedFileNoLock(t *testing.T, p string) (int, error) {
	t.Helper()
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return fd, nil
}

// TestHandoverStop: Stop ends Serve with nothing taken, and Close lets the
// lease go.
func TestHandoverStop(t *testing.T) {
	dir := t.TempDir()
	fd, p := lockedFile(t, dir, "npu0.lock")
	h, err := NewHandover("fake", []int{0}, []int{fd})
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	served := make(chan error, 1)
	go func() { served <- h.Serve(-1) }()
	h.Stop()
	if err := <-served; err != nil || h.Taken() != "" {
		t.Fatalf("Serve after Stop: %v, taken %q", err, h.Taken())
	}
	if free(t, p) {
		t.Fatal("free before Close")
	}
	h.Close()
	if !free(t, p) {
		t.Fatal("Close did not let the lease go")
	}
	if _, err := Take(h.Addr, "late", -1); !errors.Is(err, ErrGone) {
		t.Errorf("take after Close: %v, want ErrGone", err)
	}
}

// TestHandoverWatch: Serve returns when the watched pidfd says the
// engine's process has ended.
func TestHandoverWatch(t *testing.T) {
	dir := t.TempDir()
	fd, _ := lockedFile(t, dir, "npu0.lock")
	defer unix.Close(fd)
	h, err := NewHandover("fake", []int{0}, []int{fd})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Skipf("pidfd_open: %v", err)
	}
	defer unix.Close(pidfd)
	defer cmd.Wait()
	if err := h.Serve(pidfd); err != nil || h.Taken() != "" {
		t.Fatalf("Serve: %v, taken %q", err, h.Taken())
	}
}

func TestTakeChecksAddress(t *testing.T) {
	for _, addr := range []string{"", "/run/npurun/broker.sock", "@npurun-handover/xyz", "@other/0123456789abcdef0123456789abcdef"} {
		if _, err := Take(addr, "c", -1); err == nil || errors.Is(err, ErrGone) {
			t.Errorf("Take(%q) = %v, want a refusal of the address", addr, err)
		}
	}
}

func TestParseLease(t *testing.T) {
	if _, err := parseLease("refused uid 5 may not", nil); err == nil || !strings.Contains(err.Error(), "uid 5") {
		t.Errorf("refusal: %v", err)
	}
	for _, msg := range []string{"lease 2 ascend 1", "lease 1 ascend", "lease 1 ascend 1,x", "lease 1 ascend 1,2"} {
		if _, err := parseLease(msg, []int{-1}); err == nil {
			t.Errorf("parseLease(%q) accepted", msg)
		}
	}
}

// TestHandoverRefusesOthers: a runtime of another uid than root's or
// npurun's own gets a refusal, and the lease stays to be taken.
func TestHandoverRefusesOthers(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root, to run a taker as another uid")
	}
	dir := t.TempDir()
	fd, _ := lockedFile(t, dir, "npu0.lock")
	defer unix.Close(fd)
	h, err := NewHandover("fake", []int{0}, []int{fd})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	h.uid = 4242 // npurun's own uid, as if it were an ordinary user's
	served := make(chan error, 1)
	go func() { served <- h.Serve(-1) }()
	// The test binary's directory is its builder's alone: a copy where
	// the other uid may run it.
	open, err := os.MkdirTemp("", "npurun-taker")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(open) })
	if err := os.Chmod(open, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(open, "taker")
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	// A peer of that uid that connects and says nothing first: it keeps
	// the hand-over a moment only.
	silent := exec.Command(bin)
	silent.Env = append(os.Environ(), "NPURUN_TEST_SILENT="+h.Addr)
	silent.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	pipe, err := silent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := silent.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { silent.Process.Kill(); silent.Wait() }()
	line, _ := bufio.NewReader(pipe).ReadString('\n')
	if line != "connected <nil>\n" {
		t.Fatalf("silent peer: %q", line)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "NPURUN_TEST_TAKE="+h.Addr)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "npurun refused: uid 65534 may not take this lease") {
		t.Errorf("helper said %q, want a refusal naming its uid", out)
	}
	start := time.Now()
	r, err := Take(h.Addr, "root", -1)
	if err != nil {
		t.Fatalf("root after the refusal: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("root's take took %s after a silent peer of another uid", took)
	}
	closeFDs(r.FDs)
	<-served
}

// TestMain runs the tests, or, with NPURUN_TEST_TAKE set, is
// TestHandoverRefusesOthers's taker, run as another uid.
func TestMain(m *testing.M) {
	if addr := os.Getenv("NPURUN_TEST_SILENT"); addr != "" {
		// Connects, says nothing, and stays until killed.
		c, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
		if err == nil {
			err = unix.Connect(c, &unix.SockaddrUnix{Name: addr})
		}
		os.Stdout.WriteString(fmt.Sprint("connected ", err) + "\n")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	if addr := os.Getenv("NPURUN_TEST_TAKE"); addr != "" {
		_, err := Take(addr, "other", -1)
		os.Stdout.WriteString(fmt.Sprint(err) + "\n")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestTakeOnlyFromOwner (issue 27.5): a hand-over answered by another uid
// than the container's owner is no hand-over (ErrGone, saying who
// answered), and nothing is taken from it; the owner's is taken.
func TestTakeOnlyFromOwner(t *testing.T) {
	dir := t.TempDir()
	fd, _ := lockedFile(t, dir, "npu0.lock")
	defer unix.Close(fd)
	h, err := NewHandover("fake", []int{0}, []int{fd})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	served := make(chan error, 1)
	go func() { served <- h.Serve(-1) }()
	me := os.Getuid()
	_, err = Take(h.Addr, "squatted", me+1)
	if !errors.Is(err, ErrGone) || !strings.Contains(err.Error(), fmt.Sprintf("of uid %d, not by the container's owner, uid %d", me, me+1)) {
		t.Fatalf("Take from uid %d for owner %d: %v, want ErrGone naming both", me, me+1, err)
	}
	r, err := Take(h.Addr, "owned", me)
	if err != nil {
		t.Fatalf("Take for its owner after another's try: %v", err)
	}
	closeFDs(r.FDs)
	if err := <-served; err != nil || h.Taken() != "owned" {
		t.Errorf("Serve: %v, taken by %q, want by the owner's take", err, h.Taken())
	}
}

// TestTakeBounded (issue 27.5): a peer at the address that never answers
// (one that listens and does not accept, one that accepts and says
// nothing) keeps Take for handoverTimeout in all, no longer.
func TestTakeBounded(t *testing.T) {
	defer func(d time.Duration) { handoverTimeout = d }(handoverTimeout)
	handoverTimeout = 300 * time.Millisecond
	ln, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ln)
	addr := handoverPrefix + "0123456789abcdef0123456789abcdef"
	if err := unix.Bind(ln, &unix.SockaddrUnix{Name: addr}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(ln, 1); err != nil {
		t.Fatal(err)
	}
	for range 3 { // the first fills the backlog; the next ones wait to connect
		start := time.Now()
		_, err := Take(addr, "c", -1)
		if took := time.Since(start); err == nil || errors.Is(err, ErrGone) || took > handoverTimeout+time.Second {
			t.Errorf("Take from a silent peer: %v after %s, want an error within %s", err, took, handoverTimeout)
		}
	}
}
