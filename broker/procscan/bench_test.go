package procscan

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/npurun/npurun/internal/fileid"
)

// BenchmarkTreeManyFDs: one look at a process with 4,000 descriptors open,
// half of them a lock file, half /dev/null: a stat each. Its allocs/op
// tell what the scan allocates per descriptor (none: the 4,000 cost no
// more than one).
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
	id, err := fileid.Of(int(lock.Fd()))
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
	s, err := New("/proc", os.Getpid())
	if err != nil {
		b.Fatal(err)
	}
	s.UserBudget = 1 << 20
	targets := Targets{Files: map[fileid.ID]bool{id: true}}
	if r := s.Tree([]int{cmd.Process.Pid}, targets, 10); len(r.Files[id]) != 1 || r.Procs != 1 {
		b.Fatalf("holders %v of %d processes, want the child of 1", r.Files[id], r.Procs)
	}
	b.ReportAllocs()
	for b.Loop() {
		s.Tree([]int{cmd.Process.Pid}, targets, 10)
	}
}

// BenchmarkMaps: reading the maps of a process with 2,000 mappings of a
// file (a line each), looking for a lock file and a device node. Its
// allocs/op tell what a scan allocates per mapping.
func BenchmarkMaps(b *testing.B) {
	dir := b.TempDir()
	lock, err := os.Create(filepath.Join(dir, "npu0.lock"))
	if err != nil {
		b.Fatal(err)
	}
	defer lock.Close()
	if err := lock.Truncate(4096); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$", filepath.Join(dir, "npu0.lock"))
	cmd.Env = append(os.Environ(), "PROCSCAN_HELPER=maps")
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { in.Close(); cmd.Process.Kill(); cmd.Wait() }()
	if line, err := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		b.Fatalf("helper: %q, %v", line, err)
	}
	s, err := New("/proc", os.Getpid())
	if err != nil {
		b.Fatal(err)
	}
	lk := &look{s: s, t: Targets{Files: map[fileid.ID]bool{{Dev: 1, Ino: 1}: true}, Nodes: map[uint64]bool{7: true}},
		r: s.result(), b: new(buffers), maps: true, left: 1 << 30, kinds: map[fileid.ID]uint64{}}
	lk.mappings(cmd.Process.Pid)
	if lk.lines < 2000 {
		b.Fatalf("%d lines of maps read, want 2,000 and more", lk.lines)
	}
	b.ReportAllocs()
	for b.Loop() {
		lk.mappings(cmd.Process.Pid)
	}
}
