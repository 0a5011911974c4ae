package slurmjobs

import "testing"

// TestExternJob: only a root process whose command line is exactly an
// extern step daemon's names a job.
func TestExternJob(t *testing.T) {
	for _, c := range []struct {
		uid  uint32
		cmd  []string
		want uint32
	}{
		{0, []string{"slurmstepd: [42.extern]"}, 42},
		{0, []string{"slurmstepd: [42.extern]\x00"}, 42},
		{1000, []string{"slurmstepd: [42.extern]"}, 0}, // a user's process named so
		{0, []string{"slurmstepd: [42.batch]"}, 0},
		{0, []string{"slurmstepd: [42.0]"}, 0},
		{0, []string{"sh", "slurmstepd: [42.extern]"}, 0},
		{0, []string{"xslurmstepd: [42.extern]"}, 0},
		{0, []string{"slurmstepd: [99999999999.extern]"}, 0}, // not a uint32
		{0, nil, 0},
	} {
		if got := ExternJob(c.uid, c.cmd); got != c.want {
			t.Errorf("ExternJob(%d, %q) = %d, want %d", c.uid, c.cmd, got, c.want)
		}
	}
}
