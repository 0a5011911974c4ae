package board

import (
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/npurun/npurun/wire"
)

// benchBoxes are n boxes of 16 devices, each with 1,000 waiting and
// 10,000 leases of history.
func benchBoxes(n int, now time.Time) []*Box {
	var boxes []*Box
	for i := range n {
		st := &wire.Board{Time: now.UnixMilli(), Vendor: "fake"}
		for d := range 16 {
			st.Devices = append(st.Devices, wire.DeviceState{ID: d, Name: fmt.Sprintf("npu%d", d), Pool: "default", State: wire.DeviceLeased,
				Lease: &wire.LeaseInfo{ID: uint64(d + 1), User: "root", Kind: wire.KindInline, Devices: []int{d}, Since: now.Add(-time.Hour).UnixMilli(),
					Holders: []wire.Holder{{PID: 100 + d, User: "root", Command: "python train.py --epochs 100"}}}})
		}
		ln := wire.Line{Pool: "default", Count: 1000}
		for w := range 1000 {
			ln.Waiters = append(ln.Waiters, wire.WaiterInfo{Position: w + 1, Kind: wire.KindInline, User: fmt.Sprintf("user%d", w%23), N: 1, Since: now.UnixMilli()})
		}
		st.Waiting = []wire.Line{ln}
		h := &wire.HistoryReport{}
		span := int64(23 * time.Hour / time.Millisecond)
		for e := range 10000 {
			start := now.UnixMilli() - span + int64(e)*span/10000
			h.Entries = append(h.Entries, wire.HistoryEntry{Lease: uint64(e), Device: e % 16, Name: fmt.Sprintf("npu%d", e%16), Kind: wire.KindInline,
				User: fmt.Sprintf("user%d", e%23), Start: start, End: start + span/10000*16*9/10})
		}
		u := &wire.UsageReport{}
		for k := range 23 {
			u.Rows = append(u.Rows, wire.UsageRow{User: fmt.Sprintf("user%d", k), DeviceHours: float64(k)})
		}
		boxes = append(boxes, &Box{Name: fmt.Sprintf("box%d", i), Status: st, History: h, Usage: u})
	}
	return boxes
}

// BenchmarkRender: the page of 4 such boxes, view and template.
func BenchmarkRender(b *testing.B) {
	now := time.Now()
	boxes := benchBoxes(4, now)
	s := New(Config{Socket: "/nonexistent", Host: "box0"})
	for b.Loop() {
		if err := Render(io.Discard, "page", s.View(boxes, now)); err != nil {
			b.Fatal(err)
		}
	}
}
