package procscan

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/npurun/npurun/internal/fileid"
)

// budgetTree is a fake /proc for the budget tests: pid 10, of user 1000,
// with 250 descriptors, none of them the lock file; pid 11 of fdOwner
// (its fd directory's owner) whose status shows uid statusUID, holding
// the lock file. It returns the tree's root and the lock file.
func budgetTree(t *testing.T, fdOwner10, status10 int) (string, fileid.ID) {
	t.Helper()
	needRoot(t, "fd directories of several owners (chown)")
	root, files := t.TempDir(), t.TempDir()
	lock := filepath.Join(files, "npu0.lock")
	if err := os.WriteFile(lock, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	fds := map[int]string{}
	for i := range 250 {
		fds[i] = "/dev/null"
	}
	fakeProc(t, root, 10, 1, status10, "many", fds)
	fakeProc(t, root, 11, 1, 0, "holder", map[int]string{3: lock})
	if err := os.Lchown(filepath.Join(root, "10", "fd"), fdOwner10, fdOwner10); err != nil {
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
	return root, id
}

// TestScanChargesNotDumpable: a process that is not dumpable (its fd
// directory is root's) is charged to the effective uid its status shows,
// not to root: its many descriptors leave root's process, read after it,
// read in the same scan. One whose status cannot be read is charged to
// Unknown, not to root either.
func TestScanChargesNotDumpable(t *testing.T) {
	for _, tc := range []struct {
		name    string
		noState bool
		charged uint32
	}{
		{"status shows its user", false, 1000},
		{"status unreadable", true, Unknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, id := budgetTree(t, 0, 1000)
			if tc.noState {
				if err := os.Remove(filepath.Join(root, "10", "status")); err != nil {
					t.Fatal(err)
				}
			}
			s, err := New(root, 0)
			if err != nil {
				t.Fatal(err)
			}
			s.UserBudget = 100
			r, err := s.Scan(Targets{Files: map[fileid.ID]bool{id: true}})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(r.Files[id], []int{11}) || !r.Looked(11) || r.Deferred(0) {
				t.Errorf("root's holder 11: holders %v, looked at %v, root deferred %v: the process that is not dumpable spent root's budget",
					r.Files[id], r.Looked(11), r.Deferred(0))
			}
			if !r.Deferred(tc.charged) || r.Looked(10) {
				t.Errorf("pid 10 (250 descriptors, budget 100): deferred for %d %v, looked at %v; want deferred, charged to %d",
					tc.charged, r.Deferred(tc.charged), r.Looked(10), tc.charged)
			}
		})
	}
}

// TestSweepIgnoresBudget: a sweep (a lease's end) reads every process to
// its end whatever the budget: a user's process with more descriptors
// than the budget does not hide the holder after it, of the same user,
// and the background scan's cursors are left as they were.
func TestSweepIgnoresBudget(t *testing.T) {
	root, id := budgetTree(t, 1000, 1000)
	if err := os.Lchown(filepath.Join(root, "11", "fd"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	s, err := New(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	s.UserBudget = 100
	targets := Targets{Files: map[fileid.ID]bool{id: true}}
	if r, err := s.Scan(targets); err != nil || r.Looked(11) && len(r.Files[id]) > 0 {
		t.Fatalf("a scan with the budget found %v (%v): the test shows nothing", r.Files[id], err)
	}
	cursor := *s.cursors[1000]
	r, err := s.Sweep(targets)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Files[id], []int{11}) || !r.Looked(10) || !r.Looked(11) || r.AnyDeferred() || r.Procs != 2 {
		t.Errorf("sweep: holders %v, looked at 10 %v, 11 %v, deferred %v, %d processes; want 11, both looked at, nothing deferred",
			r.Files[id], r.Looked(10), r.Looked(11), r.AnyDeferred(), r.Procs)
	}
	if c := s.cursors[1000]; c == nil || c.pid != cursor.pid || c.pos != cursor.pos {
		t.Errorf("the sweep moved the scan's cursor of user 1000 from %+v to %+v", cursor, c)
	}
}
