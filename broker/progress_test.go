package broker

import (
	"testing"
	"time"
)

// TestTellAfter: a waiter is told at once when it becomes next or its
// reason changes; a move of less than a tenth is not told; a larger one is
// told once a second in the first thousand places, and further back once
// per millisecond of its place, up to progressMax.
func TestTellAfter(t *testing.T) {
	now := time.Unix(1000, 0)
	tests := []struct {
		name     string
		pos      int           // last told
		why      string        // last told
		ago      time.Duration // told that long ago
		newPos   int
		newWhy   string
		want     time.Duration // the wait, where wantSign > 0
		wantSign int           // 0: told now; > 0: after want; < 0: not for this move
	}{
		{"first report", 0, "", 0, 7, "", 0, 0},
		{"becomes next", 3, "", 0, 1, "", 0, 0},
		{"reason changes", 50, "", 0, 50, "at max_devices", 0, 0},
		{"no move", 50, "", time.Hour, 50, "", 0, -1},
		{"moved less than a tenth", 50, "", time.Hour, 46, "", 0, -1},
		{"near the front, told 2s ago", 500, "", 2 * time.Second, 400, "", 0, 0},
		{"near the front, told 0.4s ago", 500, "", 400 * time.Millisecond, 400, "", 600 * time.Millisecond, 1},
		{"5,000th, told 2s ago", 6000, "", 2 * time.Second, 5000, "", 3 * time.Second, 1},
		{"5,000th, told 6s ago", 6000, "", 6 * time.Second, 5000, "", 0, 0},
		{"50,000th, told 9s ago", 60000, "", 9 * time.Second, 50000, "", time.Second, 1},
	}
	for _, tc := range tests {
		last := &told{pos: tc.pos, why: tc.why, at: now.Add(-tc.ago)}
		got := tellAfter(last, tc.newPos, tc.newWhy, now)
		switch {
		case tc.wantSign < 0 && got >= 0, tc.wantSign == 0 && got != 0, tc.wantSign > 0 && got != tc.want:
			t.Errorf("%s: tellAfter = %v, want %v (sign %d)", tc.name, got, tc.want, tc.wantSign)
		}
	}
}
