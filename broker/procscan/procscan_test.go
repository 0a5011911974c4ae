package procscan

import (
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
	"unicode/utf8"

	"github.com/npurun/npurun/internal/fileid"
	"golang.org/x/sys/unix"
)

// child starts `sh -c SCRIPT sh ARGS...` with file open at descriptor 3
// (and the standard streams on /dev/null), and returns it once the script
// has said "ready" on the pipe at descriptor 4 and every process that had
// the pipe open has closed it: a script closes it in each process it
// starts once that process's descriptors are as the test wants them.
func child(t *testing.T, file *os.File, script string, args ...string) *exec.Cmd {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := exec.Command("sh", append([]string{"-c", script, "sh"}, args...)...)
	cmd.ExtraFiles = []*os.File{file, w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its group is killed at the end, with what it started
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() {
		unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
		cmd.Process.Kill()
		cmd.Wait()
	})
	said, err := io.ReadAll(r) // to the end: no process has the pipe open
	if err != nil || !strings.Contains(string(said), "ready") {
		t.Fatalf("child did not say ready: %q (%v)", said, err)
	}
	return cmd
}

func tempFile(t *testing.T) (*os.File, fileid.ID) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "npu0.lock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	id, err := fileid.Of(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	return f, id
}

// TestScanFindsHolders: a process holding the file at a descriptor is
// found, with its children that inherited it; one that closed it is not;
// the scanner's own process (self) is left out though it has it open too.
func TestScanFindsHolders(t *testing.T) {
	f, id := tempFile(t)
	// The shell holds fd 3; a child inherits it; a second child closes it.
	// The pipe ends only once the second child has closed fd 3: it used to
	// be closed by the shell alone, and the scan could come before the
	// second child had closed fd 3 (1 run in 12 failed so).
	cmd := child(t, f, `sleep 600 4>&- &
{ exec 3<&-; exec sleep 600 4>&-; } &
echo ready >&4; exec 4>&-; wait`)
	s, err := New("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	s.UserBudget = 1 << 30 // the whole machine in one scan: other tests' processes are root's too
	r, err := s.Scan(Targets{Files: map[fileid.ID]bool{id: true}})
	if err != nil {
		t.Fatal(err)
	}
	got := r.Files[id]
	kids := s.Children(cmd.Process.Pid)
	if len(kids) != 2 {
		t.Fatalf("children of the shell: %v, want 2", kids)
	}
	if !slices.Contains(got, cmd.Process.Pid) {
		t.Errorf("holders %v lack the shell %d", got, cmd.Process.Pid)
	}
	if slices.Contains(got, os.Getpid()) {
		t.Errorf("holders %v include the scanner's own process", got)
	}
	if len(got) != 2 {
		t.Errorf("holders %v, want the shell and one child of %v", got, kids)
	}
	if r.Procs < 3 {
		t.Errorf("looked at %d processes", r.Procs)
	}
	sh := r.Info[cmd.Process.Pid]
	if sh == nil || sh.UID != uint32(os.Geteuid()) || sh.PPID != os.Getpid() || sh.Comm != "sh" || len(sh.Cmdline) != 4 || sh.Start == 0 {
		t.Fatalf("info of the shell: %+v", sh)
	}
	if d := time.Since(sh.Started); d < 0 || d > time.Minute {
		t.Errorf("shell started %v ago", d)
	}

	// Tree from the shell finds the same holders without a full scan.
	tr := s.Tree([]int{cmd.Process.Pid}, Targets{Files: map[fileid.ID]bool{id: true}}, 100)
	slices.Sort(got)
	tg := slices.Sorted(slices.Values(tr.Files[id]))
	if !slices.Equal(tg, got) || tr.Procs != 3 {
		t.Errorf("Tree: holders %v of %d processes, want %v of 3", tg, tr.Procs, got)
	}
	if tr := s.Tree([]int{cmd.Process.Pid}, Targets{Files: map[fileid.ID]bool{id: true}}, 1); tr.Procs != 1 {
		t.Errorf("Tree with limit 1 looked at %d processes", tr.Procs)
	}
}

// TestScanFindsNodes: a character device node open at a descriptor is
// found by its device number, whatever the path the process opened it by:
// here a node of its own elsewhere, as a bind mount or a container's /dev
// would show it.
func TestScanFindsNodes(t *testing.T) {
	null, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(null.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	elsewhere := filepath.Join(t.TempDir(), "link-to-null")
	if err := os.Symlink("/dev/null", elsewhere); err != nil {
		t.Fatal(err)
	}
	cmd := child(t, nil, `exec 3<"$1"; echo ready >&4; exec 4>&-; sleep 600`, elsewhere)
	nodes := Targets{Nodes: map[uint64]bool{st.Rdev: true}}

	s, err := New("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	r := s.Tree([]int{cmd.Process.Pid}, nodes, 10)
	if !slices.Contains(r.Nodes[st.Rdev], cmd.Process.Pid) {
		t.Fatalf("node holders %v lack %d", r.Nodes[st.Rdev], cmd.Process.Pid)
	}
	if slices.Contains(r.Mapped[st.Rdev], cmd.Process.Pid) {
		t.Errorf("%d, which has the node open at a descriptor, is said to have it mapped only", cmd.Process.Pid)
	}
	if pi := r.Info[cmd.Process.Pid]; pi == nil || pi.Comm != "sh" || pi.Exe == "" || pi.Cmdline[0] != "sh" {
		t.Errorf("info: %+v", pi)
	}
	if anc := s.Ancestors(r, cmd.Process.Pid); len(anc) == 0 || anc[0] != os.Getpid() {
		t.Errorf("ancestors of %d: %v, want starting with %d", cmd.Process.Pid, anc, os.Getpid())
	}
}

// TestSignalChecksStart: a signal goes only to the process that started
// at the given time.
func TestSignalChecksStart(t *testing.T) {
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer cmd.Process.Kill()
	s, err := New("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	start := s.Start(cmd.Process.Pid)
	if start == 0 {
		t.Fatal("no start time")
	}
	if err := s.Signal(cmd.Process.Pid, start+1, unix.SIGTERM); err != unix.ESRCH {
		t.Fatalf("signal with the wrong start time: %v, want ESRCH", err)
	}
	select {
	case <-done:
		t.Fatal("the process died from a signal meant for another start time")
	default:
	}
	if err := s.Signal(cmd.Process.Pid, start, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != unix.SIGTERM {
			t.Errorf("wait: %v, want killed by SIGTERM", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("SIGTERM did not end the process")
	}
}

// fakeProc writes process pid of a fake /proc tree at root: its stat,
// status and cmdline, its descriptors as links to files, and its children.
func fakeProc(t *testing.T, root string, pid, ppid int, uid int, comm string, fds map[int]string, children ...int) {
	t.Helper()
	dir := filepath.Join(root, strconv.Itoa(pid))
	for _, d := range []string{"fd", filepath.Join("task", strconv.Itoa(pid))} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	stat := fmt.Sprintf("%d (%s) S %d %d %d 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 %d 1000 100 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n", pid, comm, ppid, pid, pid, 1000+pid)
	status := fmt.Sprintf("Name:\t%s\nUid:\t%d\t%d\t%d\t%d\nGid:\t0\t0\t0\t0\n", comm, uid, uid, uid, uid)
	var kids []string
	for _, c := range children {
		kids = append(kids, strconv.Itoa(c))
	}
	for name, data := range map[string]string{"stat": stat, "status": status, "cmdline": comm + "\x00--fake\x00",
		filepath.Join("task", strconv.Itoa(pid), "children"): strings.Join(kids, " ")} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for fd, target := range fds {
		if err := os.Symlink(target, filepath.Join(dir, "fd", strconv.Itoa(fd))); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFakeTree: the scanner reads whatever tree it is given (procfs.NewFS
// of a root, no /proc of its own): holders by the files their descriptor
// links reach, children and ancestors from stat and the children lists,
// and a loop of parents in a damaged tree ends.
func TestFakeTree(t *testing.T) {
	root := t.TempDir()
	files := t.TempDir()
	lock := filepath.Join(files, "npu0.lock")
	if err := os.WriteFile(lock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "uptime"), []byte("1000.50 10.00\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fakeProc(t, root, 10, 1, 1000, "torchrun", map[int]string{3: lock, 4: "/elsewhere"}, 11, 12)
	fakeProc(t, root, 11, 10, 1000, "worker", map[int]string{3: lock}) // inherited
	fakeProc(t, root, 12, 10, 1000, "worker", map[int]string{0: "/dev/null"})
	fakeProc(t, root, 20, 21, 2000, "loop", map[int]string{7: lock}) // passed to, parents in a loop
	fakeProc(t, root, 21, 20, 2000, "loop", nil)
	s, err := New(root, 0)
	if err != nil {
		t.Fatal(err)
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
	targets := Targets{Files: map[fileid.ID]bool{id: true}}
	r, err := s.Scan(targets)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Files[id]; !slices.Equal(sorted(got), []int{10, 11, 20}) || r.Procs != 5 {
		t.Fatalf("holders %v of %d processes, want 10, 11, 20 of 5", got, r.Procs)
	}
	if pi := r.Info[11]; pi == nil || pi.PPID != 10 || pi.UID != 1000 || pi.Comm != "worker" || !slices.Equal(pi.Cmdline, []string{"worker", "--fake"}) || pi.Start != 1011 {
		t.Errorf("process 11: %+v", r.Info[11])
	}
	if anc := s.Ancestors(r, 11); !slices.Equal(anc, []int{10}) {
		t.Errorf("ancestors of 11: %v, want [10]", anc)
	}
	if anc := s.Ancestors(r, 20); len(anc) != 1024 {
		t.Errorf("a loop of parents walked %d steps, want the bound, 1024", len(anc))
	}
	tr := s.Tree([]int{10}, targets, 100)
	if got := tr.Files[id]; !slices.Equal(sorted(got), []int{10, 11}) || tr.Procs != 3 {
		t.Errorf("tree of 10: holders %v of %d processes, want 10, 11 of 3", got, tr.Procs)
	}
	if tr.Cut || !tr.Looked(12) || tr.Looked(20) || !r.Looked(20) {
		t.Errorf("tree of 10: cut %v, looked at 12 %v, at 20 %v; the scan looked at 20 %v", tr.Cut, tr.Looked(12), tr.Looked(20), r.Looked(20))
	}
	if tr := s.Tree([]int{10}, targets, 2); !tr.Cut || !tr.Looked(11) || tr.Looked(12) {
		t.Errorf("tree of 10 cut at 2: cut %v, looked at 11 %v, at 12 %v", tr.Cut, tr.Looked(11), tr.Looked(12))
	}
}

func sorted(s []int) []int {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestCmdlineCapped: a process with a megabyte of arguments costs a scan
// MaxCmdline bytes of them, cut where a whole character ends.
func TestCmdlineCapped(t *testing.T) {
	const script = `echo ready >&4; exec 4>&-; sleep 600`
	head := []string{"sh", "-c", script, "sh"}
	// One argument may be 128 KiB at most (MAX_ARG_STRLEN): sixteen of
	// 64 KiB of "€", three bytes each, after padding that puts the
	// MaxCmdline'th byte inside a "€".
	before := len(strings.Join(head, "\x00")) + 1
	pad := ""
	if (MaxCmdline-before)%3 == 0 {
		pad = "x"
	}
	args := []string{pad + strings.Repeat("€", 64<<10/3)}
	for range 15 {
		args = append(args, strings.Repeat("€", 64<<10/3))
	}
	cmd := child(t, nil, script, args...)
	s, err := New("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	pi, err := s.Proc(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(pi.Cmdline, "\x00")
	if len(all) > MaxCmdline || len(all) < MaxCmdline-utf8.UTFMax || !utf8.ValidString(all) {
		t.Errorf("command line of %d bytes (valid UTF-8: %v), want at most %d, whole characters", len(all), utf8.ValidString(all), MaxCmdline)
	}
	if len(pi.Cmdline) != len(head)+1 || !slices.Equal(pi.Cmdline[:len(head)], head) || !strings.HasPrefix(pi.Cmdline[len(head)], pad+"€€€") {
		t.Errorf("command line starts %q, want %q and the first argument", pi.Cmdline[:min(len(pi.Cmdline), len(head))], head)
	}

	small := child(t, nil, script, "a b", "", "ü")
	if pi, err := s.Proc(small.Process.Pid); err != nil || !slices.Equal(pi.Cmdline, append(slices.Clone(head), "a b", "", "ü")) {
		t.Errorf("small command line: %q (%v)", pi.Cmdline, err)
	}
}
