package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// spank_npurun.so, built as the Makefile builds it (warnings are errors),
// against Slurm's spank.h, into SpankDir (removed by Main).
var SpankDir string

var spankOnce = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "npurun-spank-")
	if err != nil {
		return "", err
	}
	SpankDir = dir
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", err
	}
	root := Root()
	so := filepath.Join(dir, "spank_npurun.so")
	if out, err := exec.Command("make", "--no-print-directory", "-C", root, "BUILDDIR="+dir, so).CombinedOutput(); err != nil {
		return "", fmt.Errorf("make spank_npurun.so: %v\n%s", err, out)
	}
	return so, nil
})

// SpankPlugin returns the built plugin; it skips where Slurm's headers are
// missing, except in CI, where .ci/run installs them.
func SpankPlugin(t testing.TB) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	cmd := exec.Command(cc, "-E", "-")
	cmd.Stdin = strings.NewReader("#include <slurm/spank.h>\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no Slurm headers (%s), and CI=true: install libslurm-dev (.ci/run does)", firstLine(string(out)))
		}
		t.Skipf("needs Slurm's headers to build spank_npurun.so (Debian: libslurm-dev): %s", firstLine(string(out)))
	}
	so, err := spankOnce()
	if err != nil {
		t.Fatal(err)
	}
	return so
}

func CloseFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
