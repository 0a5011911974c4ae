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

// TestUsageTableUtil: where the broker sampled, the usage table has
// BUSY, IDLE-HOURS and RECLAIMED ("-" for a row never sampled).
func TestUsageTableUtil(t *testing.T) {
	pct := func(f float64) *float64 { return &f }
	got := UsageTable(&wire.UsageReport{Since: time.Date(2026, 1, 2, 3, 4, 0, 0, time.Local).UnixMilli(), Sampled: true, Rows: []wire.UsageRow{
		{User: "alice", Kind: "inline", Pool: "default", Leases: 12, DeviceHours: 310.2, Busy: pct(81.2), IdleDeviceHours: 12},
		{User: "bob", Kind: "inline", Pool: "default", Leases: 3, DeviceHours: 96, Busy: pct(6), IdleDeviceHours: 88.5, Reclaimed: 2},
		{User: "carol", Kind: "task", Pool: "default", Leases: 1, DeviceHours: 1},
	}})
	want := "since 2026-01-02 03:04\n" +
		"USER   KIND    POOL     LEASES  DEVICE-HOURS  BUSY  IDLE-HOURS  RECLAIMED\n" +
		"alice  inline  default  12      310.20        81%   12.00       0\n" +
		"bob    inline  default  3       96.00         6%    88.50       2\n" +
		"carol  task    default  1       1.00          -     0.00        0\n" +
		"TOTAL                   16      407.20              100.50      2\n"
	if got != want {
		t.Errorf("usage table:\n%s\nwant\n%s", got, want)
	}
}

// TestUsageTableByDevice: a report summed by device has DEVICE and POOL
// in place of USER, KIND and POOL; the row of the leases that name no
// device shows "-".
func TestUsageTableByDevice(t *testing.T) {
	pct := func(f float64) *float64 { return &f }
	got := UsageTable(&wire.UsageReport{Since: time.Date(2026, 1, 2, 3, 4, 0, 0, time.Local).UnixMilli(), Sampled: true, By: wire.UsageByDevice, Rows: []wire.UsageRow{
		{Device: "npu0", Pool: "default", Leases: 9, DeviceHours: 160, Busy: pct(85), IdleDeviceHours: 4},
		{Device: "npu1", Pool: "default", Leases: 6, DeviceHours: 246.2, Busy: pct(38), IdleDeviceHours: 96.5, Reclaimed: 2},
		{Pool: "default", Leases: 40, DeviceHours: 0.5},
	}})
	want := "since 2026-01-02 03:04\n" +
		"DEVICE  POOL     LEASES  DEVICE-HOURS  BUSY  IDLE-HOURS  RECLAIMED\n" +
		"npu0    default  9       160.00        85%   4.00        0\n" +
		"npu1    default  6       246.20        38%   96.50       2\n" +
		"-       default  40      0.50          -     0.00        0\n" +
		"TOTAL            55      406.70              100.50      2\n"
	if got != want {
		t.Errorf("usage table:\n%s\nwant\n%s", got, want)
	}
}
