package journal

import (
	"testing"
	"time"
)

// TestHoldSurvivesReplay: a held task is never granted, keeps its place
// (its id, pending), and is held again after a replay, of the journal as
// appended and as rewritten; a release is replayed alike, and an end
// ends the hold. A hold disarms an armed task, and a held one is not
// armed.
func TestHoldSurvivesReplay(t *testing.T) {
	dir := t.TempDir()
	tb := openTable(t, dir, 10, 10)
	a, b, c := tb.submit(1), tb.submit(1), tb.submit(1)
	a.ArmBoot = "boot" // as an arm record would
	for _, x := range []*Task{a, b, c} {
		if err := tb.Hold(x, true); err != nil {
			t.Fatal(err)
		}
	}
	if a.ArmBoot != "" {
		t.Errorf("held task %d still armed in %q", a.ID, a.ArmBoot)
	}
	if err := tb.Grant(a, []int{0}, -1, time.Now()); err == nil || a.State != Pending {
		t.Errorf("grant of held task %d: %v, state %s; want refused, pending", a.ID, err, a.State)
	}
	if err := tb.Hold(c, false); err != nil {
		t.Fatal(err)
	}
	if err := tb.End(b, Cancelled, nil, "cancelled by u1"); err != nil {
		t.Fatal(err)
	}
	if b.Held {
		t.Errorf("cancelled task %d is still held", b.ID)
	}
	tb.Close()

	for round := range 2 { // replayed as appended, then as rewritten by the first replay
		tb = openTable(t, dir, 10, 10)
		ra, rb, rc := tb.Get(a.ID), tb.Get(b.ID), tb.Get(c.ID)
		if ra == nil || rb == nil || rc == nil {
			t.Fatalf("round %d: tasks lost in the replay", round)
		}
		if !ra.Held || ra.State != Pending {
			t.Errorf("round %d: task %d after the replay: held %v, %s; want held, pending", round, ra.ID, ra.Held, ra.State)
		}
		if rc.Held || rb.Held {
			t.Errorf("round %d: released task %d held %v, cancelled task %d held %v", round, rc.ID, rc.Held, rb.ID, rb.Held)
		}
		if err := tb.Grant(ra, []int{0}, -1, time.Now()); err == nil {
			t.Errorf("round %d: held task %d granted after the replay", round, ra.ID)
		}
		tb.Close()
	}
	tb = openTable(t, dir, 10, 10)
	ra := tb.Get(a.ID)
	if err := tb.Hold(ra, false); err != nil {
		t.Fatal(err)
	}
	if err := tb.Grant(ra, []int{0}, -1, time.Now()); err != nil {
		t.Errorf("released task %d: %v", ra.ID, err)
	}
}
