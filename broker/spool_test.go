package broker

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func openTestSpool(t *testing.T, dir string) (*Spool, []*record) {
	t.Helper()
	var got []*record
	sp, err := OpenSpool(dir, func(r *record) error {
		got = append(got, r)
		return nil
	}, func() []*record { return got })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close() })
	return sp, got
}

// TestSpoolConcurrentAppends: every acknowledged record is there after a
// reopen, exactly once.
func TestSpoolConcurrentAppends(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spool")
	sp, _ := openTestSpool(t, dir)
	const n = 500
	var wg sync.WaitGroup
	for i := 1; i <= n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := sp.Append(&record{Op: "end", ID: uint64(i), State: "done"}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	sp.Close()
	_, got := openTestSpool(t, dir)
	seen := map[uint64]int{}
	for _, r := range got {
		seen[r.ID]++
	}
	for i := uint64(1); i <= n; i++ {
		if seen[i] != 1 {
			t.Errorf("record %d replayed %d times, want once", i, seen[i])
		}
	}
}

// TestSpoolTornLine: a last line without its newline was never
// acknowledged and is dropped; the lines before it stay.
func TestSpoolTornLine(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spool")
	sp, _ := openTestSpool(t, dir)
	if err := sp.Append(&record{Op: "end", ID: 1}, &record{Op: "end", ID: 2}); err != nil {
		t.Fatal(err)
	}
	sp.Close()
	f, err := os.OpenFile(filepath.Join(dir, journalName), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"op":"end","id":3,"sta`)
	f.Close()
	_, got := openTestSpool(t, dir)
	if len(got) != 2 || got[0].ID != 1 || got[1].ID != 2 {
		t.Fatalf("replayed %+v, want records 1 and 2", got)
	}
}

// TestSpoolCorruptLine: garbage in the middle is an error naming the
// line, not silently skipped.
func TestSpoolCorruptLine(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spool")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, journalName), []byte("{\"op\":\"end\",\"id\":1}\nnot json\n"), 0o600)
	_, err := OpenSpool(dir, func(*record) error { return nil }, func() []*record { return nil })
	if err == nil || !contains(err.Error(), "journal:2:") {
		t.Fatalf("OpenSpool = %v, want an error at journal:2", err)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
