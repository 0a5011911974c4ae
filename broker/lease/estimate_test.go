package lease

import (
	"testing"
	"time"
)

// TestEstimate: the starts Estimate reckons for a line, against a
// schedule worked out by hand: each waiter takes the candidates that come
// free first, at the time the last of them does, and gives them back its
// limit later; a lease or a waiter without a limit makes what waits for
// its devices unknown, and a blocked waiter takes nothing.
func TestEstimate(t *testing.T) {
	const m = int64(time.Minute)
	now := int64(1_000_000) * m
	all := []int{0, 1, 2, 3}
	w := func(n int, limit time.Duration, cand ...int) *Waiter {
		if cand == nil {
			cand = all
		}
		return &Waiter{Holder: Holder{Limit: limit}, N: n, Cand: cand, Exact: n == len(cand) && len(cand) < len(all)}
	}
	held := &Waiter{Holder: Holder{Limit: time.Minute}, N: 1, Cand: all, Held: true}
	line := []*Waiter{
		w(1, 30*time.Minute), // A: npu3 at +5, frees it at +35
		held,                 // held: unknown, takes nothing
		w(2, 10*time.Minute), // B: npu0 (+10) and npu1 (+20): at +20, frees both at +30
		w(1, 0),              // C: npu0 at +30 (before npu1 by id), keeps it: no limit
		w(1, time.Hour, 2),   // D: npu2 alone, held with no limit: unknown, takes it
		w(3, time.Minute),    // E: npu1 +30, npu3 +35, then none known: unknown
		w(1, time.Minute),    // F: nothing is known to come free: unknown
	}
	free := []int64{now + 10*m, now + 20*m, never, now + 5*m}
	got := Estimate(now, free, line, func(w *Waiter) bool { return w.Held })
	want := []int64{now + 5*m, never, now + 20*m, now + 30*m, never, never, never}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("waiter %d: start %s, want %s", i, rel(got[i], now), rel(want[i], now))
		}
	}
	// A device whose lease is past its limit (its kill under way) comes
	// free now, not in the past.
	got = Estimate(now, []int64{now - 3*m}, []*Waiter{w(1, 0, 0)}, nil)
	if got[0] != now {
		t.Errorf("behind a lease past its limit: start %s, want now", rel(got[0], now))
	}
}

func rel(at, now int64) string {
	if at == never {
		return "unknown"
	}
	return "+" + time.Duration(at-now).String()
}
