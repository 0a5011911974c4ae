package policy

import (
	"slices"
	"strings"
	"testing"
)

// TestScheduling: [scheduling] backfill is on by default, may be turned
// off, must be a boolean, and a reload takes it up (not NeedsRestart).
func TestScheduling(t *testing.T) {
	base := "[devices]\nvendor = \"fake\"\nids = \"0-1\"\n"
	on, err := Parse("a.toml", []byte(base))
	if err != nil || !on.Scheduling.Backfill {
		t.Fatalf("default: backfill %v, err %v; want on", on != nil && on.Scheduling.Backfill, err)
	}
	off, err := Parse("b.toml", []byte(base+"[scheduling]\nbackfill = false\n"))
	if err != nil || off.Scheduling.Backfill {
		t.Fatalf("backfill = false: %+v, %v", off, err)
	}
	if r := on.NeedsRestart(off); len(r) != 0 {
		t.Errorf("a reload that turns backfill off needs a restart: %v", r)
	}
	if c := on.Changed(off); !slices.Contains(c, "[scheduling]") {
		t.Errorf("changed: %v, want [scheduling]", c)
	}
	for _, bad := range []string{"[scheduling]\nbackfill = \"yes\"\n", "[scheduling]\nbackfil = true\n"} {
		if _, err := Parse("c.toml", []byte(base+bad)); err == nil || !strings.Contains(err.Error(), "backfil") {
			t.Errorf("%q: err %v", bad, err)
		}
	}
}
