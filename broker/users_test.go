package broker

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLoginShell: the shell comes from the user database as getent(1)
// reads it (through NSS with cgo, /etc/passwd without), /bin/sh for one
// that refuses logins or an unknown user.
func TestLoginShell(t *testing.T) {
	out, err := exec.Command("getent", "passwd").Output()
	if err != nil {
		t.Skipf("getent passwd: %v", err)
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, ":")
		if len(f) != 7 {
			continue
		}
		want := f[6]
		if !strings.HasPrefix(want, "/") || strings.HasSuffix(want, "/nologin") || strings.HasSuffix(want, "/false") {
			want = "/bin/sh"
		}
		if got := loginShell(f[0]); got != want {
			t.Errorf("loginShell(%q) = %q, want %q (getent: %q)", f[0], got, want, line)
		}
		seen++
	}
	if seen == 0 {
		t.Fatal("getent passwd listed no user")
	}
	if got := loginShell("npurun-no-such-user"); got != "/bin/sh" {
		t.Errorf("loginShell of an unknown user = %q, want /bin/sh", got)
	}
}
