package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/wire"
)

// TestTableUtil: where the broker samples utilization, UTIL says each
// device's now and each lease's held mean ("-" unknown), an idle lease
// is marked with how long, and a board without sampling has no column.
func TestTableUtil(t *testing.T) {
	now := time.Now()
	pct := func(f float64) *float64 { return &f }
	ms := func(d time.Duration) int64 { return now.Add(-d).UnixMilli() }
	b := &wire.Board{
		Time: now.UnixMilli(), Vendor: "ascend", Util: &wire.UtilInfo{IntervalMS: 30000, Below: 5, Last: ms(time.Second)},
		Devices: []wire.DeviceState{
			{ID: 0, Name: "npu0", Pool: "default", State: wire.DeviceLeased, Since: ms(2*time.Hour + 13*time.Minute), Util: pct(97),
				Lease: &wire.LeaseInfo{Kind: wire.KindInline, User: "alice", Util: pct(97), UtilHeld: pct(88.4), Holders: []wire.Holder{{PID: 4121, User: "alice", Command: "python train.py"}}}},
			{ID: 1, Name: "npu1", Pool: "default", State: wire.DeviceLeased, Since: ms(28 * time.Hour), Util: pct(0),
				Lease: &wire.LeaseInfo{Kind: wire.KindInline, User: "bob", Util: pct(0), UtilHeld: pct(3), IdleSince: ms(26 * time.Hour), Holders: []wire.Holder{{PID: 5120, User: "bob", Command: "jupyter-lab"}}}},
			{ID: 2, Name: "npu2", Pool: "default", State: wire.DeviceFree, Util: pct(0)},
			{ID: 3, Name: "npu3", Pool: "default", State: wire.DeviceFree, UtilUnknown: "run npu-smi: exit status 1"},
			{ID: 4, Name: "npu4", Pool: "default", State: wire.DeviceLeased, Since: ms(time.Minute), UtilUnknown: "hung",
				Lease: &wire.LeaseInfo{Kind: wire.KindInline, User: "carol", Holders: []wire.Holder{{PID: 6000, User: "carol", Command: "sleep"}}}},
		},
		Waiting: []wire.Line{{Pool: "default", Waiters: []wire.WaiterInfo{}}},
	}
	got := Table(b, 0, now)
	for _, want := range []string{
		"DEVICE  POOL     STATE   USER   PID   COMMAND          UTIL (now / held)  SINCE\n",
		"npu0    default  leased  alice  4121  python train.py  97% / 88%          2h13m\n",
		"npu1    default  leased  bob    5120  jupyter-lab      0% / 3%            1d4h   idle 1d2h\n",
		"npu2    default  free                                  0%\n",
		"npu3    default  free                                  -\n",
		"npu4    default  leased  carol  6000  sleep            - / -              1m\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	b.Util = nil
	if got := Table(b, 0, now); strings.Contains(got, "UTIL") || strings.Contains(got, "idle") {
		t.Errorf("a board without sampling shows utilization:\n%s", got)
	}
}
