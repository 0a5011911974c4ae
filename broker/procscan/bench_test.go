package procscan

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// BenchmarkTreeManyFDs: one look at a process with 4,000 descriptors open,
// half of them a lock file under the scanner's prefix (a readlink and a
// stat each), half /dev/null outside it (a readlink each). Its allocs/op
// tell what the scan allocates per descriptor.
func BenchmarkTreeManyFDs(b *testing.B) {
	const half = 2000
	dir := b.TempDir()
	lock, err := os.Create(filepath.Join(dir, "npu0.lock"))
	if err != nil {
		b.Fatal(err)
	}
	defer lock.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		b.Fatal(err)
	}
	defer null.Close()
	id, err := ID(int(lock.Fd()))
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command("sleep", "600")
	for range half {
		cmd.ExtraFiles = append(cmd.ExtraFiles, lock, null)
	}
	// Start returns once the child has exec'd: its descriptors are in place.
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	s, err := New("/proc", os.Getpid(), dir+"/")
	if err != nil {
		b.Fatal(err)
	}
	targets := Targets{Files: map[FileID]bool{id: true}}
	if r := s.Tree([]int{cmd.Process.Pid}, targets, 10); len(r.Files[id]) != 1 || r.Procs != 1 {
		b.Fatalf("holders %v of %d processes, want the child of 1", r.Files[id], r.Procs)
	}
	b.ReportAllocs()
	for b.Loop() {
		s.Tree([]int{cmd.Process.Pid}, targets, 10)
	}
}
