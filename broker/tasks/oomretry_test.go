package tasks

import "testing"

func TestOOMRaise(t *testing.T) {
	for _, tc := range []struct{ mem, peak, want int64 }{
		{8192, 0, 10240},    // no peak known: 1.25× the declaration
		{8192, 9800, 12288}, // 1.25× the peak, rounded up to 256 MiB: 12250 → 12288
		{8192, 2000, 10240}, // a peak under the declaration raises the declaration
		{1000, 0, 1280},     // 1250 → 1280
	} {
		if got := oomRaise(tc.mem, tc.peak); got != tc.want {
			t.Errorf("oomRaise(%d, %d) = %d, want %d", tc.mem, tc.peak, got, tc.want)
		}
	}
}
