package procscan

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// child starts `sh -c SCRIPT` with file open at descriptor 3 (and the
// standard streams on /dev/null), and returns it once the script has said
// "ready" on the pipe at descriptor 4.
func child(t *testing.T, file *os.File, script string) *exec.Cmd {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := exec.Command("sh", "-c", script)
	cmd.ExtraFiles = []*os.File{file, w}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() {
		unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
		cmd.Process.Kill()
		cmd.Wait()
	})
	buf := make([]byte, 64)
	n, _ := r.Read(buf)
	if !strings.Contains(string(buf[:n]), "ready") {
		t.Fatalf("child did not say ready: %q", buf[:n])
	}
	return cmd
}

func tempFile(t *testing.T) (*os.File, FileID) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "npu0.lock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	id, err := ID(int(f.Fd()))
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
	cmd := child(t, f, `sleep 600 & sleep 600 3<&- & echo "ready $! " >&4; exec 4>&-; wait`)
	s, err := New("/proc", os.Getpid(), filepath.Dir(f.Name())+"/")
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Scan(Targets{Files: map[FileID]bool{id: true}})
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
	if sh == nil || sh.UID != uint32(os.Geteuid()) || sh.PPID != os.Getpid() || sh.Comm != "sh" || len(sh.Cmdline) != 3 || sh.Start == 0 {
		t.Fatalf("info of the shell: %+v", sh)
	}
	if d := time.Since(sh.Started); d < 0 || d > time.Minute {
		t.Errorf("shell started %v ago", d)
	}

	// Tree from the shell finds the same holders without a full scan.
	tr := s.Tree([]int{cmd.Process.Pid}, Targets{Files: map[FileID]bool{id: true}}, 100)
	slices.Sort(got)
	tg := slices.Sorted(slices.Values(tr.Files[id]))
	if !slices.Equal(tg, got) || tr.Procs != 3 {
		t.Errorf("Tree: holders %v of %d processes, want %v of 3", tg, tr.Procs, got)
	}
	if tr := s.Tree([]int{cmd.Process.Pid}, Targets{Files: map[FileID]bool{id: true}}, 1); tr.Procs != 1 {
		t.Errorf("Tree with limit 1 looked at %d processes", tr.Procs)
	}
}

// TestScanFindsNodes: a character device node open at a descriptor is
// found by its rdev, with the path prefixes deciding what is looked at.
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
	cmd := child(t, null, `echo ready >&4; exec 4>&-; sleep 600`)
	nodes := Targets{Nodes: map[uint64]bool{st.Rdev: true}}

	s, err := New("/proc", os.Getpid(), "/dev/")
	if err != nil {
		t.Fatal(err)
	}
	r := s.Tree([]int{cmd.Process.Pid}, nodes, 10)
	if !slices.Contains(r.Nodes[st.Rdev], cmd.Process.Pid) {
		t.Fatalf("node holders %v lack %d", r.Nodes[st.Rdev], cmd.Process.Pid)
	}
	if pi := r.Info[cmd.Process.Pid]; pi == nil || pi.Comm != "sh" || pi.Exe == "" || pi.Cmdline[0] != "sh" {
		t.Errorf("info: %+v", pi)
	}
	if anc := s.Ancestors(r, cmd.Process.Pid); len(anc) == 0 || anc[0] != os.Getpid() {
		t.Errorf("ancestors of %d: %v, want starting with %d", cmd.Process.Pid, anc, os.Getpid())
	}

	other, err := New("/proc", os.Getpid(), "/elsewhere/")
	if err != nil {
		t.Fatal(err)
	}
	if r := other.Tree([]int{cmd.Process.Pid}, nodes, 10); len(r.Nodes) != 0 {
		t.Errorf("a node outside the prefixes was looked at: %v", r.Nodes)
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
