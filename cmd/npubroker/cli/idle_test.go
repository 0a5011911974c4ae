package cli

import (
	"testing"
	"time"

	"github.com/npurun/npurun/wire"
)

// TestIdleMark: the idle mark says what the [idle] policy does about an
// idle lease: nothing more, warned, reclaimed at a time to come, or
// reclaimed (ending).
func TestIdleMark(t *testing.T) {
	now := time.Date(2026, 12, 6, 15, 0, 0, 0, time.Local)
	since := now.Add(-25 * time.Hour).UnixMilli()
	at := time.Date(2026, 12, 6, 16, 0, 0, 0, time.Local).UnixMilli()
	for _, c := range []struct {
		l    wire.LeaseInfo
		want string
	}{
		{wire.LeaseInfo{IdleSince: since, IdleAction: "report"}, "idle 1d1h"},
		{wire.LeaseInfo{IdleSince: since, IdleAction: "warn", Warned: true}, "idle 1d1h, warned"},
		{wire.LeaseInfo{IdleSince: since, IdleAction: "reclaim", Warned: true, IdleEnds: at}, "idle 1d1h, reclaim at 16:00"},
		{wire.LeaseInfo{IdleSince: since, IdleAction: "reclaim", Reclaimed: at}, "idle 1d1h, reclaimed at 16:00"},
		{wire.LeaseInfo{Reclaimed: at}, "idle, reclaimed at 16:00"},
	} {
		if got := idleMark(&c.l, now); got != c.want {
			t.Errorf("idleMark(%+v) = %q, want %q", c.l, got, c.want)
		}
	}
}
