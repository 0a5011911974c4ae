package shim

import (
	"os"
	"path/filepath"
	"testing"
)

// TestLoginNode: a "[cluster]" line of $NPURUN_CONF sends npurun's work to
// the cluster; none, a missing file, or a Slurm job's environment do not.
func TestLoginNode(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name, conf, job string
		want            bool
	}{
		{"cluster", write("a", "[devices]\nvendor = \"fake\"\n\n  [cluster]  \nscheduler = \"slurm\"\n"), "", true},
		{"no table", write("b", "[devices]\n# [cluster] in a comment\nvendor = \"fake\"\n"), "", false},
		{"missing", filepath.Join(dir, "none"), "", false},
		{"inside a job", write("c", "[cluster]\nscheduler = \"slurm\"\n"), "17", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("NPURUN_CONF", tc.conf)
			t.Setenv("SLURM_JOB_ID", tc.job)
			if got := loginNode(); got != tc.want {
				t.Errorf("loginNode() = %v, want %v", got, tc.want)
			}
		})
	}
}
