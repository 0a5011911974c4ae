package procscan

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/npurun/npurun/internal/fileid"
	"golang.org/x/sys/unix"
)

// TestMain lets the test binary play a helper process: PROCSCAN_HELPER
// names what it does before it says "ready" and waits for its standard
// input to close.
//
//	mmap FILE   map FILE (private, read only) and close its descriptor
//	euid UID    take UID as its effective uid, real and saved ones staying root's
//	uid UID     become UID: real, effective and saved uid
//	maps FILE   map FILE 2,000 times, each page apart from the others
func TestMain(m *testing.M) {
	what := os.Getenv("PROCSCAN_HELPER")
	if what == "" {
		os.Exit(m.Run())
	}
	if err := helper(what, os.Args[len(os.Args)-1]); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

func helper(what, arg string) error {
	switch what {
	case "mmap":
		fd, err := unix.Open(arg, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		if _, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ, unix.MAP_PRIVATE); err != nil {
			return err
		}
		return unix.Close(fd)
	case "maps":
		fd, err := unix.Open(arg, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		for i := range 2000 {
			// Every other page read-only: neighbours never merge.
			prot := unix.PROT_READ
			if i%2 == 1 {
				prot |= unix.PROT_EXEC
			}
			if _, err := unix.Mmap(fd, 0, 4096, prot, unix.MAP_PRIVATE); err != nil {
				return err
			}
		}
		return unix.Close(fd)
	case "euid", "uid":
		uid, err := strconv.Atoi(arg)
		if err != nil {
			return err
		}
		if what == "uid" {
			return syscall.Setresuid(uid, uid, uid)
		}
		return syscall.Setresuid(0, uid, 0)
	}
	return fmt.Errorf("no helper %q", what)
}

// startHelper runs the test binary as helper what with arg, and returns
// it once it is ready.
func startHelper(t *testing.T, what, arg string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", arg)
	cmd.Env = append(os.Environ(), "PROCSCAN_HELPER="+what)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if line != "ready\n" {
		t.Fatalf("helper %s %s: %q, %v", what, arg, line, err)
	}
	return cmd
}

func needRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("this test needs root, and CI=true: run CI as root")
	}
	t.Skip("needs root: " + why)
}

// TestScanFindsMapped: a process that mapped a file and closed its
// descriptor still has it open: a lock file is found by the device and
// inode its maps show, a device node (/dev/zero, whose private mappings
// keep the node) through /proc/PID/map_files, which root alone may read.
func TestScanFindsMapped(t *testing.T) {
	lock, id := tempFile(t)
	if err := lock.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat("/dev/zero", &st); err != nil {
		t.Fatal(err)
	}
	s, err := New("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	s.UserBudget = 1 << 30 // the whole machine in one scan: other tests' processes are root's too
	file := startHelper(t, "mmap", lock.Name())
	r, err := s.Scan(Targets{Files: map[fileid.ID]bool{id: true}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(r.Files[id], file.Process.Pid) || !r.Looked(file.Process.Pid) {
		t.Errorf("holders of the mapped file %v lack %d", r.Files[id], file.Process.Pid)
	}

	needRoot(t, "/proc/PID/map_files")
	node := startHelper(t, "mmap", "/dev/zero")
	nodes := Targets{Nodes: map[uint64]bool{st.Rdev: true}}
	r, err = s.Scan(nodes)
	if err != nil {
		t.Fatal(err)
	}
	pid := node.Process.Pid
	if !slices.Contains(r.Nodes[st.Rdev], pid) || !slices.Contains(r.Mapped[st.Rdev], pid) || r.Info[pid] == nil {
		t.Errorf("users of /dev/zero %v (mapped only: %v) lack %d, which has it mapped", r.Nodes[st.Rdev], r.Mapped[st.Rdev], pid)
	}
	if tr := s.Tree([]int{pid}, nodes, 10); len(tr.Nodes) != 0 || !tr.Looked(pid) {
		t.Errorf("Tree, which reads descriptors only, found %v", tr.Nodes)
	}
}

// TestScanUserBudget: a user whose processes are more work than the
// budget are read over several scans, each going on where the last
// stopped, in the middle of a process; the finds along the way count, and
// the process counts as looked at once read to its end. Another user's
// process is read in every scan. (A fake tree: its descriptor links are
// symbolic links to files.)
func TestScanUserBudget(t *testing.T) {
	needRoot(t, "processes of two users (chown)")
	root, files := t.TempDir(), t.TempDir()
	if err := os.Chmod(files, 0o755); err != nil {
		t.Fatal(err)
	}
	lock := filepath.Join(files, "npu0.lock")
	if err := os.WriteFile(lock, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// User 1000: pid 10 with 250 descriptors, the lock file at 3 and 249,
	// and pid 11 with 120 and the lock file at 100; user 2000: pid 20,
	// holding it at 5.
	fds := func(n int, lockAt ...int) map[int]string {
		m := map[int]string{}
		for i := range n {
			m[i] = "/dev/null"
			if slices.Contains(lockAt, i) {
				m[i] = lock
			}
		}
		return m
	}
	fakeProc(t, root, 10, 1, 1000, "many", fds(250, 3, 249))
	fakeProc(t, root, 11, 1, 1000, "more", fds(120, 100))
	fakeProc(t, root, 20, 1, 2000, "other", fds(6, 5))
	for pid, uid := range map[int]int{10: 1000, 11: 1000, 20: 2000} {
		if err := os.Lchown(filepath.Join(root, strconv.Itoa(pid), "fd"), uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(lock)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	id, err := fileid.Of(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	s.UserBudget = 100
	targets := Targets{Files: map[fileid.ID]bool{id: true}}
	// 370 descriptors of user 1000 at 100 a scan, in pid order: 10 is
	// read over three scans (100, 100, 50) and 11 begun in the third (50
	// of it) and read to its end in the fourth, which goes on with 10
	// (30 of it), round to the first. 10 counts as looked at in the third
	// scan, with what the scans before found in it; 11 in the fourth.
	// User 2000's process is read in every scan.
	for i, looked := range [][]int{nil, nil, {10}, {11}, nil} {
		r, err := s.Scan(targets)
		if err != nil {
			t.Fatal(err)
		}
		got := sorted(r.Files[id])
		var seen []int
		for _, pid := range []int{10, 11} {
			if r.Looked(pid) {
				seen = append(seen, pid)
			}
		}
		if !slices.Equal(seen, looked) || !r.Looked(20) || r.Deferred(2000) || !r.Deferred(1000) {
			t.Errorf("scan %d: looked at %v of 10 and 11, at 20 %v, deferred 1000 %v, 2000 %v; want %v, 20, deferred 1000 only",
				i+1, seen, r.Looked(20), r.Deferred(1000), r.Deferred(2000), looked)
		}
		if !slices.Contains(got, 20) || !isSubset(looked, got) {
			t.Errorf("scan %d: holders %v, want 20 and %v", i+1, got, looked)
		}
	}
}

// TestTreeBudget: a look between scans (status's) reads at most the
// budget of descriptors: a process it did not read to the end is not
// looked at, and the processes it did not reach make it cut.
func TestTreeBudget(t *testing.T) {
	root, files := t.TempDir(), t.TempDir()
	lock := filepath.Join(files, "npu0.lock")
	if err := os.WriteFile(lock, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	fds := map[int]string{}
	for i := range 250 {
		fds[i] = "/dev/null"
	}
	fakeProc(t, root, 10, 1, 1000, "many", fds, 11)
	fakeProc(t, root, 11, 10, 1000, "child", map[int]string{3: lock})
	f, err := os.Open(lock)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	id, err := fileid.Of(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	targets := Targets{Files: map[fileid.ID]bool{id: true}}
	if r := s.Tree([]int{10}, targets, 100); !r.Looked(10) || !r.Looked(11) || r.Cut || !slices.Equal(r.Files[id], []int{11}) {
		t.Fatalf("a look with the default budget: looked at 10 %v, 11 %v, cut %v, holders %v", r.Looked(10), r.Looked(11), r.Cut, r.Files[id])
	}
	s.UserBudget = 100
	if r := s.Tree([]int{10}, targets, 100); r.Looked(10) || r.Looked(11) || !r.Cut || r.Procs != 1 {
		t.Errorf("a look over its budget: looked at 10 %v, 11 %v, cut %v, %d processes; want neither looked at, cut, 1 process", r.Looked(10), r.Looked(11), r.Cut, r.Procs)
	}
}

func isSubset(a, b []int) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// TestSignalAs: a signal goes to a process as its user could send it: not
// to one whose effective uid is no longer that user's, nor to one the
// user may not signal (its real and saved uids are root's), and to one
// that is the user's.
func TestSignalAs(t *testing.T) {
	needRoot(t, "processes of other users")
	const uid = 65534
	s, err := New("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	owned := startHelper(t, "uid", strconv.Itoa(uid))
	if err := s.SignalAs(owned.Process.Pid, s.Start(owned.Process.Pid), uid-1, unix.SIGTERM); !errors.Is(err, ErrNotTheirs) {
		t.Errorf("signal as another user: %v, want ErrNotTheirs", err)
	}
	setuid := startHelper(t, "euid", strconv.Itoa(uid))
	if err := s.SignalAs(setuid.Process.Pid, s.Start(setuid.Process.Pid), uid, unix.SIGTERM); !errors.Is(err, unix.EPERM) {
		t.Errorf("signal as uid %d to a process whose real and saved uids are root's: %v, want EPERM", uid, err)
	}
	if err := s.SignalAs(owned.Process.Pid, s.Start(owned.Process.Pid), uid, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- owned.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != unix.SIGTERM {
			t.Errorf("wait: %v, want killed by SIGTERM", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("SIGTERM did not end the process")
	}
	if setuid.ProcessState != nil {
		t.Error("the process of root's real uid ended")
	}
	if r, e, sv := unix.Getresuid(); r != 0 || e != 0 || sv != 0 {
		t.Errorf("this thread's uids after: %d %d %d", r, e, sv)
	}
}

// vforkSource is a program that opens its argument, then starts a child
// that shares its memory (clone with CLONE_VM, as a vfork does) and has a
// copy of its descriptors, as a child of the broker has between its fork
// and its exec; it says the child's pid, and the child waits for standard
// input to close.
const vforkSource = `#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static char stack[1 << 16];

static int child(void *arg) {
	char c;
	while (read(0, &c, 1) > 0) {
	}
	_exit(0);
}

int main(int argc, char **argv) {
	if (argc != 2 || open(argv[1], O_RDONLY | O_CLOEXEC) < 0)
		return 1;
	int pid = clone(child, stack + sizeof stack, CLONE_VM | SIGCHLD, 0);
	if (pid < 0)
		return 1;
	printf("%d\n", pid);
	fflush(stdout);
	return waitpid(pid, 0, 0) == pid ? 0 : 1;
}
`

// TestScanLeavesOutForks: a child that shares the memory of the scanner's
// own process (as the broker's child does between its fork and its exec,
// with a copy of every descriptor the broker holds: the lock files its
// watchers wait on) is the scanner's own process for what it holds, and
// is left out as that is; a child running a program of its own with the
// file open is found. The end of a task's lease used to find the broker's
// child so, at a task's launch, and signal it; status showed it as a
// holder. To a scanner of another process, the child is a holder.
func TestScanLeavesOutForks(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("gcc not found, and CI=true")
		}
		t.Skip("needs gcc")
	}
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "vfork.c"), filepath.Join(dir, "vfork")
	if err := os.WriteFile(src, []byte(vforkSource), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-Wall", "-Werror", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	f, id := tempFile(t)
	cmd := exec.Command(bin, f.Name())
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close() // the child ends, then its parent
		if err := cmd.Wait(); err != nil {
			t.Errorf("%s: %v", bin, err)
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	fork, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil {
		t.Fatalf("%s said %q: %v", bin, line, err)
	}
	other := child(t, f, `echo ready >&4; exec 4>&-; exec sleep 600`)
	targets := Targets{Files: map[fileid.ID]bool{id: true}}

	s, err := New("/proc", cmd.Process.Pid) // the program is self
	if err != nil {
		t.Fatal(err)
	}
	s.UserBudget = 1 << 30 // the whole machine in one scan: other tests' processes are root's too
	r, err := s.Scan(targets)
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Sorted(slices.Values([]int{os.Getpid(), other.Process.Pid})) // the test has it open too
	if got := slices.Sorted(slices.Values(r.Files[id])); !slices.Equal(got, want) || r.Info[fork] != nil {
		t.Errorf("holders %v, want %v (the test, sleep): not %d (self) nor %d (self between fork and exec)", got, want, cmd.Process.Pid, fork)
	}
	tr := s.Tree([]int{fork, other.Process.Pid}, targets, 10)
	if got := tr.Files[id]; !slices.Equal(got, []int{other.Process.Pid}) {
		t.Errorf("Tree: holders %v, want only %d (sleep)", got, other.Process.Pid)
	}

	theirs, err := New("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	theirs.UserBudget = 1 << 30
	if r, err = theirs.Scan(targets); err != nil {
		t.Fatal(err)
	}
	if got := r.Files[id]; !slices.Contains(got, fork) || !slices.Contains(got, cmd.Process.Pid) {
		t.Errorf("a scanner of the test's own process: holders %v, want %d and %d among them", got, fork, cmd.Process.Pid)
	}
}
