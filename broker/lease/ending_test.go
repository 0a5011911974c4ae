package lease

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/policy"
)

// lateWatcher holds every watcher once its flock has returned, before it
// records the end (releaseSeen), until the function it returns is called.
func lateWatcher(t *testing.T) (let func()) {
	hold := make(chan struct{})
	orig := releaseSeen
	releaseSeen = func(int) { <-hold }
	t.Cleanup(func() { releaseSeen = orig }) // last: once the table is quiet
	var once sync.Once
	return func() { once.Do(func() { close(hold) }) }
}

// TestEnding: a request that is not to wait finds the end of a lease whose
// holders are gone while the watcher has not recorded it yet (Ending),
// and waits for the watcher's own end: the owner told once, the gate
// closed, the device free. A lease whose lock is held still, by its
// holder or by a descriptor passed on, is not ending, and stays.
func TestEnding(t *testing.T) {
	let := lateWatcher(t)
	g := &gate{closing: make(chan struct{}), entered: make(chan int, 16), revokeOK: true}
	o, _ := newTable(t, 2, g)
	t.Cleanup(let) // before the table's cleanup waits for its devices
	_, ch := o.ask(t, 1, 1, "", []int{0}, policy.Limit{})
	a := got(t, ch, "a")
	w, err := o.tbl.Admit(Request{Holder: Holder{Kind: Inline, UID: 2, User: "u2"}, N: 1, Devices: []int{0}})
	if err != nil {
		t.Fatal(err)
	}
	ending := func(what string, want int) []<-chan struct{} {
		t.Helper()
		ends := o.tbl.Ending(w)
		if len(ends) != want {
			t.Fatalf("%s: %d leases of npu0 ending, want %d", what, len(ends), want)
		}
		return ends
	}
	held := func(what string) {
		t.Helper()
		if !o.tbl.LockHeld(a.l, 0) {
			t.Fatalf("%s: a's lock is not held", what)
		}
		if s := o.tbl.Snapshot().Devices[0]; s.State != Leased {
			t.Fatalf("%s: npu0 in state %d, want leased", what, s.State)
		}
	}

	ending("while a holds npu0", 0)
	held("after Ending, while a holds npu0")
	// A descriptor passed on is the lease passed on.
	passed, err := unix.Dup(a.fds[0])
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(a.fds[0])
	ending("while a descriptor a passed on holds npu0", 0)
	held("after Ending, while a descriptor a passed on holds npu0")

	// The last descriptor goes: the lock is let go, the watcher late.
	unix.Close(passed)
	ends := ending("a's lock let go, the watcher late", 1)
	if s := o.tbl.Snapshot().Devices[0]; s.State != Leased {
		t.Errorf("Ending recorded a's end itself: npu0 in state %d, want leased until the watcher records it", s.State)
	}
	select {
	case <-ends[0]:
		t.Fatal("a's end is over before its watcher went on")
	default:
	}
	// The watcher records the end, and its gate's close blocks: ending
	// still, the device out of service.
	let()
	if e, want := awaitEvent(t, o, "released"), fmt.Sprintf("released %d npu0 last=true", a.l.ID); e != want {
		t.Errorf("owner told %q, want %q", e, want)
	}
	select {
	case <-g.entered:
	case <-time.After(eventWait):
		t.Fatal("the watcher did not close npu0")
	}
	ends = ending("a's end recorded, npu0 not closed yet", 1)
	select {
	case <-ends[0]:
		t.Fatal("a's end is over before npu0 is closed")
	default:
	}
	close(g.closing)
	select {
	case <-ends[0]:
	case <-time.After(eventWait):
		t.Fatal("a's end is not over once npu0 is closed")
	}
	if s := o.tbl.Snapshot().Devices[0]; s.State != Free {
		t.Errorf("npu0 in state %d once a's end is over, want free", s.State)
	}
	ending("npu0 free", 0)
	select {
	case e := <-o.events:
		if e != "freed" {
			t.Errorf("owner told %q after a's end, want freed", e)
		}
	default:
		t.Error("owner not told npu0 is free when a's end was over")
	}
}

// TestEndingShare: Ending finds a share whose holders are gone, as it
// finds a whole lease, and only then; the end is the share's watcher's.
func TestEndingShare(t *testing.T) {
	let := lateWatcher(t)
	o, _ := newShareTable(t, 16<<10)
	t.Cleanup(let)
	a := got(t, o.askShare(t, 1, 4<<10), "share a")
	w, err := o.tbl.Admit(Request{Holder: Holder{Kind: Inline, UID: 2, User: "u2"}, N: 1, Devices: []int{0}})
	if err != nil {
		t.Fatal(err)
	}
	if ends := o.tbl.Ending(w); len(ends) != 0 {
		t.Fatalf("while share a is held: %d ending", len(ends))
	}
	if !o.tbl.LockHeld(a.l, 0) {
		t.Fatal("share a's lock is not held after Ending")
	}
	a.release()
	ends := o.tbl.Ending(w)
	if len(ends) != 1 {
		t.Fatalf("share a's lock let go, its watcher late: %d ending, want 1", len(ends))
	}
	if d := o.tbl.Snapshot().Devices[0]; len(d.Leases) != 1 {
		t.Errorf("Ending recorded share a's end itself: npu0 holds %d leases", len(d.Leases))
	}
	let()
	if e, want := awaitEvent(t, o, "released"), fmt.Sprintf("released %d npu0 last=true", a.l.ID); e != want {
		t.Errorf("owner told %q, want %q", e, want)
	}
	select {
	case <-ends[0]:
	case <-time.After(eventWait):
		t.Fatal("share a's end is not over")
	}
	if d := o.tbl.Snapshot().Devices[0]; d.State != Free || len(d.Leases) != 0 {
		t.Errorf("npu0 once share a's end is over: state %d, %d leases; want free", d.State, len(d.Leases))
	}
	if ends := o.tbl.Ending(w); len(ends) != 0 {
		t.Errorf("npu0 free: %d ending", len(ends))
	}
}
