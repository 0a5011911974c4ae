package lease

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestQueuePositions: Queue.Positions, which counts the places once and
// keeps them until the queue changes, gives each waiter the place a walk
// of the whole queue counting every pool gives it, across users, pools,
// removals and additions after places were counted, and leaves a waiter
// that is not in the queue alone.
func TestQueuePositions(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pools := []string{"", "a", "b"}
	for round := range 50 {
		q := NewQueue()
		var in []*Waiter
		for range 200 {
			w := &Waiter{Holder: Holder{UID: uint32(rng.IntN(4))}, N: 1, Pool: pools[rng.IntN(len(pools))]}
			q.Add(w)
			in = append(in, w)
		}
		check := func(when string) {
			t.Helper()
			truth := map[*Waiter]int{}
			n := map[string]int{}
			for _, w := range q.Waiters() {
				n[w.Pool]++
				truth[w] = n[w.Pool]
			}
			want := map[*Waiter]int{}
			for range 1 + rng.IntN(40) {
				want[in[rng.IntN(len(in))]] = 0
			}
			other := NewQueue() // a waiter of another queue: not in this one
			stranger := &Waiter{N: 1, Pool: "a"}
			other.Add(stranger)
			want[stranger] = 0
			q.Positions(want)
			for w, pos := range want {
				if pos != truth[w] {
					t.Fatalf("round %d, %s: waiter seq %d in pool %q: position %d, want %d", round, when, w.seq, w.Pool, pos, truth[w])
				}
			}
		}
		check("first") // places counted: the changes below must undo them
		for range 60 { // some leave, served or not
			i := rng.IntN(len(in))
			gone := in[i]
			q.Remove(gone, rng.IntN(2) == 0)
			in = append(in[:i], in[i+1:]...)
			check("after a removal")
			in = append(in, gone) // asked about, not in the queue
			check("after a removal, asking about it")
			in = in[:len(in)-1]
		}
		for range 20 {
			w := &Waiter{Holder: Holder{UID: uint32(rng.IntN(4))}, N: 1, Pool: pools[rng.IntN(len(pools))]}
			q.Add(w)
			in = append(in, w)
			check("after an addition")
		}
		gone := in[rng.IntN(len(in))] // taken out to be granted, then put back
		q.Remove(gone, false)
		check("taken out")
		q.Readd(gone)
		check("put back")
	}
}

// TestEstimatePrefix: a waiter's start depends on the waiters ahead of it
// alone, so Table.Starts may reckon the line only as far as the last
// waiter it is asked about.
func TestEstimatePrefix(t *testing.T) {
	const m = int64(60e9)
	now := int64(1_000_000) * m
	rng := rand.New(rand.NewPCG(3, 4))
	var line []*Waiter
	for range 100 {
		cand := []int{0, 1, 2, 3}[:1+rng.IntN(4)]
		line = append(line, &Waiter{Holder: Holder{Limit: time.Duration(rng.IntN(3)) * 10 * time.Minute}, N: 1 + rng.IntN(len(cand)), Cand: cand, Held: rng.IntN(10) == 0})
	}
	free := func() []int64 { return []int64{now + 10*m, now + 20*m, never, now + 5*m} }
	blocked := func(w *Waiter) bool { return w.Held }
	whole := Estimate(now, free(), line, blocked)
	for n := 0; n <= len(line); n += 7 {
		part := Estimate(now, free(), line[:n], blocked)
		for i := range part {
			if part[i] != whole[i] {
				t.Fatalf("waiter %d reckoned in the first %d: start %s, in the whole line %s", i, n, rel(part[i], now), rel(whole[i], now))
			}
		}
	}
}
