package lease

import (
	"fmt"
	"slices"
	"testing"
)

func shareWaiter(name string, uid uint32, mem int64, n int, cand ...int) *Waiter {
	return &Waiter{Pool: name, Holder: Holder{Kind: Inline, UID: uid}, N: n, Cand: cand, Mem: mem}
}

// granted writes Plan's grants as "name:devices".
func granted(gs []Grant) []string {
	var out []string
	for _, g := range gs {
		out = append(out, fmt.Sprintf("%s:%v", g.W.Pool, g.Devices))
	}
	return out
}

// TestPlanShares: shares go by best fit (the device with least room that
// holds them, so large free spaces stay whole), never over the room
// left, and several fit on one device.
func TestPlanShares(t *testing.T) {
	for _, tc := range []struct {
		name  string
		order []*Waiter
		free  []bool
		room  []int64
		want  []string
	}{
		{
			name:  "best fit keeps the free device whole",
			order: []*Waiter{shareWaiter("a", 1, 10, 1, 0, 1, 2)},
			free:  freeSet(3, 2),
			room:  []int64{30, 12, 63},
			want:  []string{"a:[1]"},
		},
		{
			name:  "packing several on one device, never over",
			order: []*Waiter{shareWaiter("a", 1, 20, 1, 0), shareWaiter("b", 2, 20, 1, 0), shareWaiter("c", 3, 20, 1, 0), shareWaiter("d", 4, 10, 1, 0)},
			free:  freeSet(1, 0),
			room:  []int64{63},
			want:  []string{"a:[0]", "b:[0]", "c:[0]"},
		},
		{
			name:  "a share of each of two devices",
			order: []*Waiter{shareWaiter("a", 1, 8, 2, 0, 1, 2)},
			free:  freeSet(3),
			room:  []int64{10, 50, 9},
			want:  []string{"a:[2 0]"},
		},
		{
			name:  "a device leased whole or not shared takes none",
			order: []*Waiter{shareWaiter("a", 1, 1, 1, 0, 1)},
			free:  freeSet(2),
			room:  []int64{-1, -1},
			want:  nil,
		},
		{
			name: "a whole-device waiter closes the device with shares to more",
			order: []*Waiter{
				waiter("whole", 1, 1, 0, 1),
				shareWaiter("s1", 2, 4, 1, 0, 1),
				shareWaiter("s2", 3, 4, 1, 0, 1),
			},
			free: freeSet(2),
			room: []int64{40, 50},
			// Device 1 has the most room, least declared: closed for
			// the whole waiter; the shares go on device 0.
			want: []string{"s1:[0]", "s2:[0]"},
		},
		{
			name: "a whole-device waiter takes a free device and shares keep off it",
			order: []*Waiter{
				waiter("whole", 1, 1, 0, 1),
				shareWaiter("s1", 2, 4, 1, 0, 1),
			},
			free: freeSet(2, 1),
			room: []int64{40, 63},
			want: []string{"whole:[1]", "s1:[0]"},
		},
		{
			name: "a large share that does not fit closes the roomiest device",
			order: []*Waiter{
				shareWaiter("big", 1, 60, 1, 0, 1),
				shareWaiter("small", 2, 4, 1, 0, 1),
			},
			free: freeSet(2),
			room: []int64{40, 50},
			want: []string{"small:[0]"},
		},
		{
			name: "only the first share that waits closes a device",
			order: []*Waiter{
				shareWaiter("big1", 1, 60, 1, 0, 1, 2),
				shareWaiter("big2", 2, 60, 1, 0, 1, 2),
				shareWaiter("small", 3, 35, 1, 0, 1, 2),
			},
			free: freeSet(3),
			room: []int64{40, 50, 30},
			// big1 closes npu 1; big2 closes none (were it to, npu 0);
			// small fits npu 0 alone.
			want: []string{"small:[0]"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := granted(Plan(tc.order, tc.free, Room{Share: tc.room}))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Plan = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPlanSharesWholeServed: with shares coming and going on every
// device, a whole-device waiter is served as soon as the shares that were
// there when it came have ended: none lands on the devices it closed.
func TestPlanSharesWholeServed(t *testing.T) {
	const capacity = 63
	room := []int64{capacity - 8, capacity - 8}
	declared := map[int][]int64{0: {8}, 1: {8}} // shares on each device
	q := NewQueue()
	q.Add(waiter("whole", 1, 1, 0, 1))
	for i := range 20 {
		q.Add(shareWaiter(fmt.Sprintf("s%d", i), uint32(10+i), 8, 1, 0, 1))
	}
	for round := 0; round < 10; round++ {
		free := freeSet(2)
		for id := range room {
			if len(declared[id]) == 0 {
				free[id] = true
			}
		}
		for _, g := range Plan(q.Waiters(), free, Room{Share: slices.Clone(room)}) {
			q.Remove(g.W, true)
			if g.W.Pool == "whole" {
				if round > 1 {
					t.Fatalf("the whole-device waiter was served in round %d, want 1 at the latest", round)
				}
				return
			}
			for _, id := range g.Devices {
				declared[id] = append(declared[id], g.W.Mem)
				room[id] -= g.W.Mem
			}
		}
		// The oldest share on each device ends.
		for id := range room {
			if len(declared[id]) > 0 {
				room[id] += declared[id][0]
				declared[id] = declared[id][1:]
			}
		}
	}
	t.Fatal("the whole-device waiter was never served")
}
