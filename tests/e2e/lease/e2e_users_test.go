package lease

import (
	"fmt"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
)

// TestUsersInterleave: one user's six waiting requests do not starve
// another user's single request, which arrives last but is served within
// one turn; identity is the caller's own uid.
func TestUsersInterleave(t *testing.T) {
	alice, bob := harness.NewUser(t), harness.NewUser(t)
	b := harness.StartBroker(t, harness.FakeConfig(1))
	w := harness.NewWorkload(t)
	h := harness.Hold(t, b, "holder")
	var ps []*harness.Proc
	for i := range 6 {
		tag := fmt.Sprintf("a%d", i)
		cmd := alice.As(b.Npurun(append([]string{"-v"}, w.Args(b, tag, time.Millisecond)...)...), b.Dir)
		p := harness.StartProc(t, tag, cmd)
		p.WaitLine("npurun: waiting for")
		ps = append(ps, p)
	}
	p := harness.StartProc(t, "b0", bob.As(b.Npurun(append([]string{"-v"}, w.Args(b, "b0", time.Millisecond)...)...), b.Dir))
	line := p.WaitLine("npurun: waiting for")
	ps = append(ps, p)
	t.Logf("bob: %s", line)
	h.Release()
	for _, p := range ps {
		p.MustSucceed()
	}
	runs := w.Runs(t)
	if len(runs) != 7 {
		t.Fatalf("%d runs, want 7: %v", len(runs), harness.Tags(runs))
	}
	pos := -1
	for i, r := range runs {
		want := alice.UID
		if r.Tag == "b0" {
			want, pos = bob.UID, i
		}
		if r.UID != int(want) {
			t.Errorf("%s ran as uid %d, want %d", r.Tag, r.UID, want)
		}
	}
	if pos > 1 {
		t.Errorf("bob's request was served %d-th, after %d of alice's; want no later than alice's second: %v", pos+1, pos, harness.Tags(runs))
	}
	// Alice's own requests keep their order.
	var order []string
	for _, r := range runs {
		if r.Tag != "b0" {
			order = append(order, r.Tag)
		}
	}
	for i, tag := range order {
		if tag != fmt.Sprintf("a%d", i) {
			t.Errorf("alice's requests served as %v, want a0..a5", order)
			break
		}
	}
}
