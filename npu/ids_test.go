package npu

import "testing"

// JoinIDs keeps the order it is given and writes no ranges: the variables
// that select devices number them in that order.
func TestJoinIDs(t *testing.T) {
	for _, tt := range []struct {
		ids  []int
		want string
	}{
		{nil, ""},
		{[]int{3}, "3"},
		{[]int{2, 0, 1}, "2,0,1"},
		{[]int{0, 1, 2, 3}, "0,1,2,3"},
	} {
		if got := JoinIDs(tt.ids); got != tt.want {
			t.Errorf("JoinIDs(%v) = %q, want %q", tt.ids, got, tt.want)
		}
	}
}
