package clusterconf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestHasCluster(t *testing.T) {
	for text, want := range map[string]bool{
		"[cluster]\nscheduler = \"slurm\"\n":              true,
		"[ cluster ]  # the login node\n":                 true,
		"x = 1\n  [cluster.boards]\nn1 = \"http://n1\"\n": true,
		"[devices]\nids = \"0-3\"\n":                      false,
		"# [cluster]\n":                                   false,
		"note = \"[cluster]\"\n":                          false,
		"[clusters]\n":                                    false,
		"[[cluster]]\n":                                   false,
	} {
		if got := HasCluster([]byte(text)); got != want {
			t.Errorf("HasCluster(%q) = %v, want %v", text, got, want)
		}
	}
}

func TestRead(t *testing.T) {
	dir := t.TempDir()
	if _, has, err := Read(filepath.Join(dir, "none")); has || err != nil {
		t.Errorf("no file: %v, %v", has, err)
	}
	big := filepath.Join(dir, "big.conf")
	if err := os.WriteFile(big, []byte("[cluster]\n"+strings.Repeat("#\n", MaxSize)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Read(big); err == nil || !strings.Contains(err.Error(), "larger than 1 MiB") {
		t.Errorf("a file over MaxSize: %v", err)
	}
}
