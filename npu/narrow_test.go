package npu

import (
	"slices"
	"strings"
	"testing"
)

// lookupIn reads entries NAME=VALUE as os.LookupEnv reads the environment.
func lookupIn(env []string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		for _, kv := range env {
			if v, ok := strings.CutPrefix(kv, name+"="); ok {
				return v, true
			}
		}
		return "", false
	}
}

// TestNarrowAgreesWithEnv: narrowing a lease's variables to any of its
// devices gives what the broker's Env gives for those devices alone, for
// a remapped Ascend inventory and for NVIDIA; -n K takes the first K in
// NPURUN_DEVICES' order.
func TestNarrowAgreesWithEnv(t *testing.T) {
	all := []int{0, 1, 2, 3}
	for _, inv := range []*Inventory{
		{Vendor: Ascend, IDs: all, Logical: map[int]int{0: 2, 1: 3, 2: 0, 3: 1}},
		{Vendor: Fake, IDs: all, Logical: identity(all)},
		{Vendor: NVIDIA, IDs: all, Logical: identity(all)},
	} {
		lease := inv.Env(all)
		for mask := 1; mask < 1<<len(all); mask++ {
			var ids []int
			for i, id := range all {
				if mask&(1<<i) != 0 {
					ids = append(ids, id)
				}
			}
			got, chosen, err := Narrow(lookupIn(lease), ids, len(ids))
			want := dropOrder(inv.Env(ids))
			if err != nil || !slices.Equal(got, want) {
				t.Errorf("%s: Narrow(%v) of %v = %v, %v; want %v", inv.Vendor, ids, lease, got, err, want)
			}
			if !slices.Equal(sortedUnique(chosen), ids) {
				t.Errorf("%s: Narrow(%v) chose %v", inv.Vendor, ids, chosen)
			}
		}
		order, _ := parseList(strings.TrimPrefix(lease[0], "NPURUN_DEVICES="))
		for n := 1; n <= len(all); n++ {
			got, chosen, err := Narrow(lookupIn(lease), nil, n)
			if want := dropOrder(inv.Env(order[:n])); err != nil || !slices.Equal(got, want) || !slices.Equal(chosen, order[:n]) {
				t.Errorf("%s: Narrow(-n %d) of %v = %v %v, %v; want %v on %v", inv.Vendor, n, lease, got, chosen, err, want, order[:n])
			}
		}
	}
}

// dropOrder leaves out CUDA_DEVICE_ORDER, which Narrow leaves as it is.
func dropOrder(env []string) []string {
	return slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "CUDA_DEVICE_ORDER=") })
}

// TestNarrowRefuses: variables changed since the grant are named, not
// guessed at.
func TestNarrowRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
		ids  []int
		n    int
		want string
	}{
		{"no NPURUN_DEVICES", []string{"ASCEND_RT_VISIBLE_DEVICES=0,1"}, []int{1}, 1, `NPURUN_DEVICES="" does not list`},
		{"device not listed", []string{"NPURUN_DEVICES=0,1", "ASCEND_RT_VISIBLE_DEVICES=0,1"}, []int{2}, 1, `NPURUN_DEVICES="0,1" does not list device 2`},
		{"fewer than asked", []string{"NPURUN_DEVICES=0,1", "ASCEND_RT_VISIBLE_DEVICES=0,1"}, nil, 3, "lists fewer than 3 devices"},
		{"vendor variable changed", []string{"NPURUN_DEVICES=0,1", "ASCEND_RT_VISIBLE_DEVICES=1"}, []int{1}, 1, "no visible-device variable"},
		{"vendor variable gone", []string{"NPURUN_DEVICES=0,1"}, []int{1}, 1, "no visible-device variable"},
		{"not a list", []string{"NPURUN_DEVICES=0,x", "ASCEND_RT_VISIBLE_DEVICES=0,1"}, []int{0}, 1, `NPURUN_DEVICES="0,x" does not list`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Narrow(lookupIn(tc.env), tc.ids, tc.n)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Narrow = %v, want an error with %q", err, tc.want)
			}
		})
	}
}
