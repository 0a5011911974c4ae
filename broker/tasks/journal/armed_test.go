package journal

import (
	"bytes"
	"io"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/testfs"
	"github.com/npurun/npurun/wire"
)

// openBoot opens the table in dir as a broker in boot would. Closing it
// without Stop is a broker killed: what it wrote is in the file, synced or
// not, as the kernel keeps it.
func openBoot(t *testing.T, dir, boot string) *table {
	t.Helper()
	tb := &table{t: t, dir: dir, mu: &sync.Mutex{}, logs: &bytes.Buffer{}}
	l, err := Open(dir, Options{Lock: tb.mu, Keep: 10, KeepPerUser: 10, Boot: boot,
		Log: log.New(io.MultiWriter(tb.logs, testWriter{t}), "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	tb.Life = l
	tb.mu.Lock()
	closed := false
	t.Cleanup(func() {
		if !closed {
			tb.Close()
			tb.mu.Unlock()
		}
	})
	tb.killed = func() {
		closed = true
		tb.Close()
		tb.mu.Unlock()
	}
	return tb
}

func (tb *table) arm(x *Task) {
	tb.t.Helper()
	if err := tb.Arm(x); err != nil {
		tb.t.Fatal(err)
	}
	if !tb.Armed(x) {
		tb.t.Fatalf("task %d is not armed after Arm (arm boot %q)", x.ID, x.ArmBoot)
	}
}

// TestArmedInAnotherBoot: a task armed, then the machine crashes: the
// next boot cannot tell whether its start was written and lost, so it
// fails, never to run twice; a task not armed stays pending. The failure
// is on disk: a later restart finds it failed too.
func TestArmedInAnotherBoot(t *testing.T) {
	dir := t.TempDir()
	tb := openBoot(t, dir, "boot-1")
	x, y := tb.submit(1), tb.submit(2)
	tb.arm(x)
	tb.killed()
	for _, boot := range []string{"boot-2", "boot-3"} {
		re := openBoot(t, dir, boot)
		if got := re.Get(x.ID); got == nil || got.State != Failed || got.Reason != reasonArmed {
			t.Errorf("%s: armed task replayed as %+v, want failed: %s", boot, got, reasonArmed)
		}
		if got := re.Get(y.ID); got == nil || got.State != Pending {
			t.Errorf("%s: task never armed replayed as %+v, want pending", boot, got)
		}
		re.killed()
	}
}

// TestArmedInTheSameBoot: a broker killed and started again in the same
// boot knows that an armed task without a start record did not start (the
// kernel kept whatever was written): it stays pending and is disarmed, on
// disk too, so that a later crash of the machine does not fail it.
func TestArmedInTheSameBoot(t *testing.T) {
	dir := t.TempDir()
	tb := openBoot(t, dir, "boot-1")
	x := tb.submit(1)
	tb.arm(x)
	tb.killed()
	re := openBoot(t, dir, "boot-1")
	got := re.Get(x.ID)
	if got == nil || got.State != Pending || got.ArmBoot != "" {
		t.Fatalf("replayed in the same boot as %+v, want pending and disarmed", got)
	}
	re.killed()
	if got := openBoot(t, dir, "boot-2").Get(x.ID); got == nil || got.State != Pending {
		t.Errorf("after a restart in the same boot, then a crash: %+v, want pending", got)
	}
}

// TestStopDisarms: a broker that stops cleanly disarms its tasks on disk,
// and starts nothing unsynced after; a machine restarted then keeps them.
func TestStopDisarms(t *testing.T) {
	dir := t.TempDir()
	tb := openBoot(t, dir, "boot-1")
	x := tb.submit(1)
	tb.arm(x)
	tb.Stop()
	if tb.Armed(x) {
		t.Error("a task is still armed after Stop")
	}
	if err := tb.Arm(x); err != nil || x.ArmBoot != "" {
		t.Errorf("Arm after Stop: %v, arm boot %q; want nothing done", err, x.ArmBoot)
	}
	tb.killed()
	if got := openBoot(t, dir, "boot-2").Get(x.ID); got == nil || got.State != Pending {
		t.Errorf("after a clean stop and a restart of the machine: %+v, want pending", got)
	}
}

// TestArmedStart: an armed task's start record, written without waiting
// for the disk, is in the journal for a broker started after this one is
// killed; the task is running there and no longer armed.
func TestArmedStart(t *testing.T) {
	dir := t.TempDir()
	tb := openBoot(t, dir, "boot-1")
	x := tb.submit(1)
	tb.arm(x)
	if err := tb.Grant(x, []int{2}, -1, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := tb.Start(x, 4242, 99, "boot-1", 1000); err != nil {
		t.Fatal(err)
	}
	if x.State != Running || x.ArmBoot != "" {
		t.Errorf("after its start: %s, arm boot %q; want running, disarmed", x.State, x.ArmBoot)
	}
	tb.killed()
	got := openBoot(t, dir, "boot-1").Get(x.ID)
	if got == nil || got.State != Running || got.PID != 4242 || len(got.Devices) != 1 || got.Devices[0] != 2 {
		t.Errorf("replayed as %+v, want running on device 2 under pid 4242", got)
	}
}

// TestArmCarriedByRewrite: a rewrite of the journal keeps a task armed.
func TestArmCarriedByRewrite(t *testing.T) {
	dir := t.TempDir()
	tb := openBoot(t, dir, "boot-1")
	x := tb.submit(1)
	tb.arm(x)
	if err := tb.compact(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, journalName))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte(`"op":"arm"`)) {
		t.Fatalf("the rewrite still holds the arm record, not the task's state:\n%s", data)
	}
	tb.killed()
	if got := openBoot(t, dir, "boot-2").Get(x.ID); got == nil || got.State != Failed {
		t.Errorf("armed before a rewrite, then a crash: %+v, want failed", got)
	}
}

// TestArmUnknownBoot: where the boot is unknown nothing is armed, and
// starts wait for the disk.
func TestArmUnknownBoot(t *testing.T) {
	tb := openBoot(t, t.TempDir(), "")
	x := tb.submit(1)
	if err := tb.Arm(x); err != nil || x.ArmBoot != "" || tb.Armed(x) {
		t.Errorf("Arm with no boot id: %v, arm boot %q, armed %v; want nothing done", err, x.ArmBoot, tb.Armed(x))
	}
}

// TestArmedFullDiskAtOpen: where the journal cannot be rewritten at open
// (a full disk), a task armed in another boot fails all the same, at every
// open until the disk has room again; a task never armed stays pending.
func TestArmedFullDiskAtOpen(t *testing.T) {
	dir := filepath.Join(smallFS(t, 256<<10), "spool")
	tb := openBoot(t, dir, "boot-1")
	x, y := tb.submit(1), tb.submit(2)
	tb.arm(x)
	tb.killed()
	free := testfs.Fill(t, dir)
	for round := range 2 {
		re := openBoot(t, dir, "boot-2")
		if !strings.Contains(re.logs.String(), "carrying on with the journal as it is") {
			t.Errorf("round %d: the rewrite at open did not fail on a full disk; log:\n%s", round, re.logs)
		}
		if got := re.Get(x.ID); got == nil || got.State != Failed {
			t.Errorf("round %d, full disk: armed task %+v, want failed", round, got)
		}
		if got := re.Get(y.ID); got == nil || got.State != Pending {
			t.Errorf("round %d, full disk: task never armed %+v, want pending", round, got)
		}
		re.killed()
	}
	free()
	if got := openBoot(t, dir, "boot-3").Get(x.ID); got == nil || got.State != Failed {
		t.Errorf("once the disk has room: armed task %+v, want failed", got)
	}
}

// TestSubmitArmed: a task submitted armed is armed in its own record, and
// fails after a crash of the machine as one armed later does; one with
// --after is submitted unarmed.
func TestSubmitArmed(t *testing.T) {
	dir := t.TempDir()
	tb := openBoot(t, dir, "boot-1")
	dep := tb.submit(1)
	x := &Task{UID: 1, User: "u1", Slot: -1, Submitted: time.Now().UnixMilli(),
		Sub: wire.Submission{Argv: []string{"true"}, Cwd: "/"}}
	y := &Task{UID: 1, User: "u1", Slot: -1, Submitted: time.Now().UnixMilli(),
		Sub: wire.Submission{Argv: []string{"true"}, Cwd: "/", After: []uint64{dep.ID}}}
	for _, task := range []*Task{x, y} {
		task.ID = tb.NewID()
		if err := tb.SubmitArmed(task); err != nil {
			t.Fatal(err)
		}
	}
	if !tb.Armed(x) || tb.Armed(y) {
		t.Fatalf("armed: %v, and with --after %v; want true, false", tb.Armed(x), tb.Armed(y))
	}
	data, err := os.ReadFile(filepath.Join(dir, journalName))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte(`"op":"arm"`)) || !bytes.Contains(data, []byte(`"arm_boot":"boot-1"`)) {
		t.Errorf("want the arm in the task's record, not a record of its own:\n%s", data)
	}
	tb.killed()
	re := openBoot(t, dir, "boot-2")
	if got := re.Get(x.ID); got == nil || got.State != Failed {
		t.Errorf("submitted armed, then a crash: %+v, want failed", got)
	}
	if got := re.Get(y.ID); got == nil || got.State != Pending {
		t.Errorf("submitted with --after, then a crash: %+v, want pending", got)
	}
}

// TestStopDuringArm: Stop comes while a task's arm is being written (the
// lock is let go for the write), so it finds the task not yet armed; the
// arm lands on disk after it. The clean stop must still leave the task
// disarmed: a machine restarted then keeps it pending. It was failed.
func TestStopDuringArm(t *testing.T) {
	for _, how := range []string{"Arm", "SubmitArmed"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			tb := openBoot(t, dir, "boot-1")
			var x *Task
			if how == "Arm" {
				x = tb.submit(1)
			} else {
				x = &Task{UID: 1, User: "u1", Slot: -1, Submitted: time.Now().UnixMilli(),
					Sub: wire.Submission{Argv: []string{"true"}, Cwd: "/"}}
				x.ID = tb.NewID()
			}
			inWrite, goOn := make(chan struct{}), make(chan struct{})
			var once sync.Once
			tb.j.beforeWrite = func() { once.Do(func() { close(inWrite); <-goOn }) }
			done := make(chan error, 1)
			go func() { // holds the table's lock, as this goroutine did, but while it writes
				if how == "Arm" {
					done <- tb.Arm(x)
				} else {
					done <- tb.SubmitArmed(x)
				}
			}()
			<-inWrite
			tb.mu.Lock()
			tb.Stop()
			tb.mu.Unlock()
			close(goOn)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			tb.killed()
			got := openBoot(t, dir, "boot-2").Get(x.ID)
			if got == nil {
				t.Fatal("task lost")
			}
			if got.State != Pending {
				t.Errorf("stopped cleanly while it was armed, then a restart of the machine: %s (%s), want pending", got.State, got.Reason)
			}
		})
	}
}

// TestRewriteFailsAfterFailedSync: a batch whose sync fails while a rewrite
// captures is in neither the snapshot nor the capture, though a start in
// it may have been applied (it waited only for its write): the rewrite
// fails rather than drop it, and the journal stays broken until the next.
func TestRewriteFailsAfterFailedSync(t *testing.T) {
	tb := openBoot(t, t.TempDir(), "boot-1")
	x := tb.submit(1)
	tb.arm(x)
	if err := tb.Grant(x, []int{0}, -1, time.Now()); err != nil {
		t.Fatal(err)
	}
	recs := tb.snapshot() // taken before the start is applied
	tb.j.beginCapture()
	tb.j.syncFails = func() error { return unix.EIO }
	if err := tb.Start(x, 4242, 99, "boot-1", 1000); err != nil {
		t.Fatal(err) // it waited for its write only
	}
	tb.mu.Unlock()
	_, err := tb.j.rewrite(encoder(recs), len(recs))
	tb.mu.Lock()
	if err == nil || !strings.Contains(err.Error(), "a write failed meanwhile") {
		t.Errorf("rewrite after a failed sync during its capture: %v, want it failed", err)
	}
	if tb.Writable() == nil {
		t.Error("the journal counts as writable after a failed sync")
	}
}
