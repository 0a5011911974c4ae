package policy

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseShare(t *testing.T) {
	for _, tc := range []struct {
		name, conf string
		want       Share
		bad        string
	}{
		{name: "absent", conf: "", want: Share{Margin: DefaultShareMargin, OverDeclared: OverReport}},
		{name: "all", conf: "[share]\npools = \"all\"\ncapacity = \"64G\"\nmargin = \"0\"\n",
			want: Share{Pools: []string{"*"}, Capacity: 64 << 10, OverDeclared: OverReport}},
		{name: "pools", conf: "[devices]\nvendor = \"fake\"\nids = \"0-3\"\n[pools]\nwhole = \"0-1\"\nshare = \"2-3\"\n[share]\npools = [\"share\"]\ncapacity = \"64G\"\nmargin = \"2G\"\nover_declared = \"term\"\n[share.capacities]\n3 = \"32G\"\n",
			want: Share{Pools: []string{"share"}, Capacity: 64 << 10, Capacities: map[int]int64{3: 32 << 10}, Margin: 2 << 10, OverDeclared: OverTerm}},
		{name: "no pools", conf: "[share]\ncapacity = \"64G\"\n", bad: "pools: missing"},
		{name: "unknown pool", conf: "[share]\npools = [\"nope\"]\n", bad: `no pool "nope"`},
		{name: "bad size", conf: "[share]\npools = \"all\"\ncapacity = \"64X\"\n", bad: `bad size "64X"`},
		{name: "bad policy", conf: "[share]\npools = \"all\"\nover_declared = \"kill\"\n", bad: `want "report" or "term"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse("npurun.conf", []byte(tc.conf))
			if tc.bad != "" {
				if err == nil || !strings.Contains(err.Error(), tc.bad) {
					t.Fatalf("Parse = %v; want an error with %q", err, tc.bad)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(c.Share, tc.want) {
				t.Fatalf("Share = %+v, want %+v", c.Share, tc.want)
			}
		})
	}
	s := Share{Pools: []string{"share"}, Capacity: 100, Capacities: map[int]int64{3: 50}}
	if !s.Shares("share") || s.Shares("whole") || s.CapacityOf(3) != 50 || s.CapacityOf(1) != 100 {
		t.Fatalf("Shares/CapacityOf wrong for %+v", s)
	}
}
