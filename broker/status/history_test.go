package status

import (
	"slices"
	"testing"

	"github.com/npurun/npurun/wire"
)

// TestTaskLeases: the history takes task leases alone, of the asker
// (everyone's with all), that ended from since on (their last device's
// end), newest end first, at most so many; a lease carried into a fresh
// file ("open") counts once.
func TestTaskLeases(t *testing.T) {
	dev := func(d int) *int { return &d }
	start := func(lease, task uint64, uid uint32, at int64, devs ...int) usageRec {
		return usageRec{T: at, Ev: "start", Lease: lease, Kind: wire.KindTask, Task: task, UID: uid, User: "u", Devices: devs}
	}
	end := func(lease uint64, d int, at int64) usageRec {
		return usageRec{T: at, Ev: "end", Lease: lease, Device: dev(d)}
	}
	old := []usageRec{
		start(1, 10, 1, 100, 0), end(1, 0, 200), // ended before since
		start(2, 11, 1, 300, 0, 1), end(2, 0, 400),
		{T: 300, Ev: "start", Lease: 3, Kind: wire.KindInline, UID: 1, Devices: []int{2}}, end(3, 2, 1200), // not a task
		start(4, 12, 2, 500, 3), end(4, 3, 1100), // another user's
	}
	cur := []usageRec{
		{T: 300, Ev: "open", Lease: 2, Kind: wire.KindTask, Task: 11, UID: 1, Devices: []int{0, 1}},
		end(2, 1, 1000),
		start(5, 13, 1, 900, 4), end(5, 4, 1300),
		start(6, 14, 1, 950, 5), // still held: not ended
	}
	got, more := taskLeases([][]usageRec{old, cur}, 1, false, 250, 10)
	var ids []uint64
	for _, tl := range got {
		ids = append(ids, tl.Task)
	}
	if want := []uint64{13, 11}; !slices.Equal(ids, want) || more {
		t.Fatalf("uid 1's history: tasks %v (more %v), want %v", ids, more, want)
	}
	if tl := got[1]; tl.Started != 300 || tl.Ended != 1000 || !tl.Complete || !slices.Equal(tl.Devices, []int{0, 1}) {
		t.Errorf("task 11: %+v, want started 300, ended 1000 (its last device), complete, devices 0,1", tl)
	}
	all, more := taskLeases([][]usageRec{old, cur}, 1, true, 250, 2)
	if len(all) != 2 || all[0].Task != 13 || all[1].Task != 12 || !more {
		t.Errorf("everyone's history, at most 2: %+v (more %v), want tasks 13, 12 and more", all, more)
	}
}
