package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// TestQuickStartNeedsNoPAM: make demo and make test work with what the
// README's Quick start names, which is not libpam0g-dev (issue 14.4). No
// package that go vet ./... or go test ./... builds links the PAM library
// (the PAM helper is behind its build tag); and, as root, in a mount
// namespace where the PAM headers are hidden as if never installed, make
// demo runs through without building pam_npurun.so, and the PAM tests skip
// with their reason (TestPAMBuild, run again in there; CI unset: in CI they
// must run).
func TestQuickStartNeedsNoPAM(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/npurun/npurun/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	if deps := strings.Fields(string(out)); slices.Contains(deps, "github.com/msteinert/pam/v2") {
		t.Errorf("go test ./... builds github.com/msteinert/pam/v2, which needs the PAM headers: keep it behind the pamhelper build tag")
	}

	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	harness.NeedRoot(t)
	empty := t.TempDir()
	build := t.TempDir()
	root := harness.Root()
	// The headers' directory hidden under an empty one, in a mount
	// namespace of the command's own: the machine's stays as it is.
	noPAM := func(args ...string) *exec.Cmd {
		cmd := harness.InMountNS(t, nil, `mount --bind "$1" /usr/include/security; shift; exec "$@"`, append([]string{empty}, args...)...)
		var env []string
		for _, kv := range cmd.Env {
			if !strings.HasPrefix(kv, "CI=") && !strings.HasPrefix(kv, "MAKEFLAGS=") && !strings.HasPrefix(kv, "MFLAGS=") {
				env = append(env, kv)
			}
		}
		cmd.Env = env
		return cmd
	}
	if _, err := os.Stat("/usr/include/security"); err != nil {
		t.Skip("no /usr/include/security here: the PAM headers are missing already")
	}
	if code, out := harness.ExitCode(t, noPAM("sh", "-c", `echo '#include <security/pam_modules.h>' | cc -E - >/dev/null 2>&1`)); code == 0 {
		t.Fatalf("the PAM headers are still found in the namespace; output:\n%s", out)
	}

	code, demo := harness.ExitCode(t, noPAM("make", "--no-print-directory", "-C", root, "demo", "BUILDDIR="+build))
	if code != 0 {
		t.Fatalf("make demo without the PAM headers: exit %d; output:\n%s", code, demo)
	}
	if !strings.Contains(demo, "== stop the broker") {
		t.Errorf("make demo did not run to its end; output:\n%s", demo)
	}
	if _, err := os.Stat(filepath.Join(build, "pam_npurun.so")); err == nil {
		t.Errorf("make demo built pam_npurun.so")
	}

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	code, run := harness.ExitCode(t, noPAM(self, "-test.run", "^TestPAMBuild$", "-test.v", "-test.count", "1"))
	if code != 0 || !strings.Contains(run, "--- SKIP: TestPAMBuild") || !strings.Contains(run, "needs the PAM headers to build pam_npurun.so (Debian: libpam0g-dev)") {
		t.Errorf("TestPAMBuild without the PAM headers: exit %d, want a skip that names libpam0g-dev; output:\n%s", code, run)
	}
}

// TestPAMBuild: where the PAM headers are, pam_npurun.so builds as the
// Makefile builds it, and the PAM helper with its build tag; every PAM
// test starts so (PAMBins).
func TestPAMBuild(t *testing.T) {
	p := harness.PAMBins(t)
	for _, f := range []string{p.Module, p.Helper} {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("%s not built: %v", f, err)
		}
	}
}
