package journal

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/npurun/npurun/internal/testfs"
	"github.com/npurun/npurun/wire"
)

// openJournal opens a journal in dir for appending, with what replay
// found.
func openJournal(t *testing.T, dir string) (*journal, []*Record, *replayed) {
	t.Helper()
	var got []*Record
	res, err := replay(filepath.Join(dir, journalName), func(r *Record) error {
		got = append(got, r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	j := newJournal(dir)
	if err := j.appendTo(res.end); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.close() })
	return j, got, res
}

func appendRecs(j *journal, recs ...*Record) error {
	data, err := encode(recs...)
	if err != nil {
		return err
	}
	tk, err := j.enqueue(data, len(recs))
	if err != nil {
		return err
	}
	defer j.release(tk)
	return j.wait(tk)
}

// TestJournalConcurrentAppends: every acknowledged record is there after a
// reopen, exactly once.
func TestJournalConcurrentAppends(t *testing.T) {
	dir := t.TempDir()
	j, _, _ := openJournal(t, dir)
	const n = 500
	var wg sync.WaitGroup
	for i := 1; i <= n; i++ {
		wg.Go(func() {
			if err := appendRecs(j, &Record{Op: opEnd, ID: uint64(i), State: Done}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	j.close()
	_, got, _ := openJournal(t, dir)
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

// TestJournalDamage: a last line without its newline was never
// acknowledged and is dropped; a damaged line in the middle is reported and
// skipped, the records around it kept; a record glued onto a torn one is
// kept; an overlong line is skipped without reading it whole.
func TestJournalDamage(t *testing.T) {
	good := func(id int) string { return fmt.Sprintf(`{"op":"end","id":%d,"state":"done"}`, id) + "\n" }
	for _, c := range []struct {
		name    string
		text    string
		ids     []uint64
		damaged []int // line numbers reported
	}{
		{"torn last line", good(1) + good(2) + `{"op":"end","id":3,"sta`, []uint64{1, 2}, nil},
		{"garbage in the middle", good(1) + "not json\n" + good(3), []uint64{1, 3}, []int{2}},
		{"record glued onto a torn one", good(1) + `{"op":"end","id":2,"sta` + good(3) + good(4), []uint64{1, 3, 4}, []int{2}},
		{"overlong line", good(1) + `{"op":"probe","x":"` + strings.Repeat("x", maxRecord+10) + "\"}\n" + good(3), []uint64{1, 3}, []int{2}},
		{"unknown op", good(1) + `{"op":"frobnicate"}` + "\n" + good(3), []uint64{1, 3}, []int{2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), journalName)
			if err := os.WriteFile(path, []byte(c.text), 0o600); err != nil {
				t.Fatal(err)
			}
			var ids []uint64
			res, err := replay(path, func(r *Record) error {
				if r.Op != opEnd && r.Op != opProbe {
					return fmt.Errorf("unknown record %q", r.Op)
				}
				ids = append(ids, r.ID)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(ids) != fmt.Sprint(c.ids) {
				t.Errorf("replayed %v, want %v", ids, c.ids)
			}
			var lines []int
			for _, d := range res.damaged {
				lines = append(lines, d.line)
			}
			if fmt.Sprint(lines) != fmt.Sprint(c.damaged) {
				t.Errorf("damaged lines %v, want %v (%v)", lines, c.damaged, res.damaged)
			}
		})
	}
}

// TestOpenKeepsDamagedJournal: a journal with a damaged line is kept
// aside before the rewrite replaces it, and the damage is logged.
func TestOpenKeepsDamagedJournal(t *testing.T) {
	dir := t.TempDir()
	text := `{"op":"ids","id":9}` + "\nnot json\n"
	if err := os.WriteFile(filepath.Join(dir, journalName), []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	tb := openTable(t, dir, 10, 10)
	if !strings.Contains(tb.logs.String(), "journal:2:") {
		t.Errorf("damage not reported; log:\n%s", tb.logs)
	}
	kept, _ := filepath.Glob(filepath.Join(dir, journalName+".damaged.*"))
	if len(kept) != 1 {
		t.Fatalf("damaged journal kept as %v, want one file", kept)
	}
	if data, _ := os.ReadFile(kept[0]); string(data) != text {
		t.Errorf("kept %q, want the journal as it was", data)
	}
	if tb.nextID != 9 {
		t.Errorf("next id %d, want 9 from the record before the damage", tb.nextID)
	}
}

// TestCompactCarriesAppends: records made durable while a rewrite is
// being written, and records durable but not yet applied when its
// snapshot was taken, are in the rewritten journal.
func TestCompactCarriesAppends(t *testing.T) {
	dir := t.TempDir()
	tb := openTable(t, dir, 100, 100)
	x := tb.submit(1)
	// A record durable, not yet applied: as a transition between its
	// write and its apply.
	data := mustEncode(t, &Record{Op: opEnd, ID: x.ID, State: Cancelled, Time: 1})
	tk, err := tb.j.enqueue(data, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.j.wait(tk); err != nil {
		t.Fatal(err)
	}
	var during *Task
	tb.j.beforeSwap = func() {
		// The broker's lock is free while the rewrite is written.
		tb.mu.Lock()
		during = tb.submit(2)
		tb.mu.Unlock()
	}
	if err := tb.compact(); err != nil {
		t.Fatal(err)
	}
	tb.j.beforeSwap = nil
	tb.j.release(tk)
	tb.Close()
	re := openTable(t, dir, 100, 100)
	if y := re.Get(x.ID); y == nil || y.State != Cancelled {
		t.Errorf("the record durable at the snapshot is lost: task %d is %+v", x.ID, y)
	}
	if y := re.Get(during.ID); y == nil || y.State != Pending {
		t.Errorf("the submission made during the rewrite is lost: task %d is %+v", during.ID, y)
	}
}

// needRoot skips a test that needs root, except in CI (CI=true), where a
// skip would hide a gap and so is a failure.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("this test needs root, and CI=true: run CI as root")
	}
	t.Skip("needs root to mount a small tmpfs (run as root, or in CI)")
}

// smallFS mounts a tmpfs of size bytes on a new directory for the test.
func smallFS(t *testing.T, size int) string {
	t.Helper()
	needRoot(t)
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", size), "npurun-test", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// TestFullDisk: on a full filesystem a write fails and is cut off, and the
// next one after space came back does not glue onto it; a rewrite fails
// and leaves the journal as it was; Recover says when the journal can be
// written again.
func TestFullDisk(t *testing.T) {
	dir := filepath.Join(smallFS(t, 256<<10), "spool")
	tb := openTable(t, dir, 1000, 1000)
	var kept []*Task
	for range 20 {
		kept = append(kept, tb.submit(1))
	}
	free := testfs.Fill(t, dir)
	// The journal's last page may have room left: take it with records
	// that change nothing, until one does not fit.
	for i := 0; tb.write(&Record{Op: opProbe}) == nil; i++ {
		if i > 100000 {
			t.Fatal("the journal can still be written on a full filesystem")
		}
	}
	before, err := os.ReadFile(filepath.Join(dir, journalName))
	if err != nil {
		t.Fatal(err)
	}
	// A large record cannot fit: its write fails.
	big := &Task{UID: 1, Slot: -1, Sub: wire.Submission{Shell: strings.Repeat("x", 64<<10), Cwd: "/"}}
	big.ID = tb.NewID()
	if err := tb.Submit(big); err == nil {
		t.Fatal("a submission was recorded on a full filesystem")
	}
	if tb.Get(big.ID) != nil {
		t.Error("a submission that was not recorded is in the table")
	}
	if err := tb.End(kept[0], Cancelled, nil, "by test"); err == nil {
		t.Fatal("a cancel was recorded on a full filesystem")
	}
	if kept[0].State != Pending {
		t.Errorf("a cancel that was not recorded left the task %s", kept[0].State)
	}
	if err := tb.compact(); err == nil {
		t.Error("a rewrite succeeded on a full filesystem")
	}
	after, _ := os.ReadFile(filepath.Join(dir, journalName))
	if !bytes.Equal(before, after) {
		t.Errorf("the failed writes changed the journal:\nbefore %q\nafter  %q", before, after)
	}
	if err := tb.Recover(); err == nil {
		t.Error("Recover says the journal can be written on a full filesystem")
	}
	free()
	if err := tb.Recover(); err != nil {
		t.Fatalf("Recover with space again: %v", err)
	}
	if err := tb.End(kept[0], Cancelled, nil, "by test"); err != nil {
		t.Fatal(err)
	}
	tb.Close()
	re := openTable(t, dir, 1000, 1000)
	if strings.Contains(re.logs.String(), "damaged") {
		t.Errorf("the journal is damaged after the failed writes:\n%s", re.logs)
	}
	for i, x := range kept {
		y := re.Get(x.ID)
		want := Pending
		if i == 0 {
			want = Cancelled
		}
		if y == nil || y.State != want {
			t.Errorf("task %d after the full disk: %+v, want %s", x.ID, y, want)
		}
	}
}

// TestFullDiskAtOpen: a journal that cannot be rewritten at open (the
// disk is full) is kept as it is, its torn last line cut off, and the
// table carries on with it; nothing acknowledged is lost across two such
// opens.
func TestFullDiskAtOpen(t *testing.T) {
	dir := filepath.Join(smallFS(t, 256<<10), "spool")
	tb := openTable(t, dir, 1000, 1000)
	var ids []uint64
	for range 30 {
		ids = append(ids, tb.submit(1).ID)
	}
	tb.Close()
	f, err := os.OpenFile(filepath.Join(dir, journalName), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"op":"end","id":1,"sta`) // a torn last line
	f.Close()
	free := testfs.Fill(t, dir)
	for round := range 2 {
		re := openTable(t, dir, 1000, 1000)
		if !strings.Contains(re.logs.String(), "carrying on with the journal as it is") {
			t.Errorf("round %d: the rewrite at open did not fail on a full disk; log:\n%s", round, re.logs)
		}
		for _, id := range ids {
			if x := re.Get(id); x == nil || x.State != Pending {
				t.Fatalf("round %d: task %d is %+v, want pending", round, id, x)
			}
		}
		re.Close()
	}
	free()
	re := openTable(t, dir, 1000, 1000)
	if len(re.tasks) != len(ids) {
		t.Errorf("%d tasks after the disk has room again, want %d", len(re.tasks), len(ids))
	}
	if strings.Contains(re.logs.String(), "damaged") {
		t.Errorf("the torn line was not cut off:\n%s", re.logs)
	}
}
