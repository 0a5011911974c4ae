package harness

import (
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// pamHeaders tells whether the C compiler finds the PAM headers, which
// pam_npurun.so and the PAM helper are built against (Debian:
// libpam0g-dev), as the Makefile asks: it says why when it does not.
var pamHeaders = sync.OnceValue(func() string {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	cmd := exec.Command(cc, "-E", "-")
	cmd.Stdin = strings.NewReader("#include <security/pam_modules.h>\n#include <security/pam_appl.h>\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "the C compiler (" + cc + ") finds no PAM headers: " + firstLine(string(out))
	}
	return ""
})

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// NeedPAMHeaders skips a test that builds pam_npurun.so or the PAM helper
// where the PAM headers are missing (make test needs only what the
// README's Quick start names), except in CI (CI=true), where the PAM
// tests must run and a skip is a failure.
func NeedPAMHeaders(t testing.TB) {
	t.Helper()
	why := pamHeaders()
	switch {
	case why == "":
	case os.Getenv("CI") == "true":
		t.Fatalf("%s; CI=true: install libpam0g-dev (.ci/run does)", why)
	default:
		t.Skipf("needs the PAM headers to build pam_npurun.so (Debian: libpam0g-dev): %s", why)
	}
}

// NeedTool skips a test that runs a program of the Debian package pkg
// where none of names (on PATH, or an absolute path) is there, except in
// CI (CI=true), where .ci/run installs it and a skip is a failure.
func NeedTool(t testing.TB, pkg string, names ...string) {
	t.Helper()
	for _, name := range names {
		var err error
		if strings.HasPrefix(name, "/") {
			_, err = os.Stat(name)
		} else {
			_, err = exec.LookPath(name)
		}
		if err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("needs %s (%s), and CI=true: install it (.ci/run does)", name, pkg)
			}
			t.Skipf("needs %s (Debian: %s)", name, pkg)
		}
	}
}
