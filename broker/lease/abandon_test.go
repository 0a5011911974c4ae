package lease

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/testfd"
	"github.com/npurun/npurun/policy"
)

// TestAbandonInFlight: a lease whose only descriptor is in a socket's
// queue keeps its lock; the owner, its holders gone, ends it (Abandon):
// the end goes the way of any (released, freed, a fresh lock file), the
// device is granted again while the descriptor is still in flight, and
// once received it holds the old file, not the device's. Its old file's
// wait ends when that descriptor closes.
func TestAbandonInFlight(t *testing.T) {
	for _, share := range []bool{false, true} {
		name := "whole"
		if share {
			name = "share"
		}
		t.Run(name, func(t *testing.T) {
			var o *owner
			var dir string
			var mem int64
			if share {
				o, dir = newShareTable(t, 1000)
				mem = 100
			} else {
				o, dir = newTable(t, 1, nil)
			}
			_, ch := o.request(t, Request{Holder: Holder{Kind: Inline, UID: 1, User: "u1"}, N: 1, Mem: mem})
			a := got(t, ch, "a")
			sock := testfd.InFlight(t, a.fds[0])
			if !o.tbl.LockHeld(a.l, 0) {
				t.Fatal("LockHeld says no while a's descriptor is in flight")
			}
			_, chb := o.ask(t, 2, 1, "", []int{0}, policy.Limit{})
			none(t, o, chb, "b while a's lock is held in flight")
			if err := o.tbl.Abandon(a.l, 0); err != nil {
				t.Fatal(err)
			}
			awaitEvent(t, o, "released")
			b := got(t, chb, "b, once a's lease was abandoned")
			if o.tbl.Holds(a.l, 0) || o.tbl.LockHeld(a.l, 0) {
				t.Error("a's lease holds npu 0 still after Abandon")
			}
			fb := fdFile(t, b.fds[0])
			if fb == a.l.Files[0] || fb != pathFile(t, LockPath(dir, 0)) {
				t.Errorf("b's lock file %v: a's was %v, the device's is %v", fb, a.l.Files[0], pathFile(t, LockPath(dir, 0)))
			}
			o.tbl.mu.Lock()
			stale := o.tbl.stale
			o.tbl.mu.Unlock()
			if stale != 1 {
				t.Errorf("%d lock files waited on after their lease, want 1", stale)
			}
			late := testfd.Receive(t, sock)
			if f := fdFile(t, late); f != a.l.Files[0] {
				t.Errorf("the descriptor received late is on %v, want a's old file %v", f, a.l.Files[0])
			}
			unix.Close(late)
			deadline := time.Now().Add(eventWait)
			for {
				o.tbl.mu.Lock()
				stale = o.tbl.stale
				o.tbl.mu.Unlock()
				if stale == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the old file's wait did not end with its last descriptor")
				}
				time.Sleep(10 * time.Millisecond)
			}
			b.release()
			awaitEvent(t, o, "freed")
		})
	}
}
