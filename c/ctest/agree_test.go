// Package ctest checks that npurun's C clients (c/npurun_wire.c, which
// pam_npurun.so and spank_npurun.so #include, and pam/module/pam_npurun.c)
// agree with the Go side on the values both must share: the socket's
// default path, the protocol version, the caps on a message and on a
// grant's devices, the first lease descriptor, the session-policy file's
// name and size cap, the longest on_busy wait and the variables that hide
// every device. It holds tests only.
//
// The C values are evaluated, not read as text: each source is #included
// into a small program that the system's cc builds and runs, and that
// prints them.
package ctest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/wire"
)

// needCC returns the C compiler, skipping without one, except in CI
// (CI=true), where a skip would hide a gap and so is a failure.
func needCC(t *testing.T) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err == nil {
		return cc
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no C compiler (cc), and CI=true")
	}
	t.Skip("needs a C compiler (cc) to evaluate the C sources' #defines")
	return ""
}

// needHeader skips where cc finds no header named include (a -dev package
// missing), except in CI, where that is a failure.
func needHeader(t *testing.T, cc, include, pkg string) {
	t.Helper()
	cmd := exec.Command(cc, "-E", "-x", "c", "-")
	cmd.Stdin = strings.NewReader("#include <" + include + ">\n")
	if err := cmd.Run(); err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("no %s, and CI=true: install %s", include, pkg)
	}
	t.Skipf("needs %s (%s)", include, pkg)
}

// cValues builds a program that #includes source (relative to the
// repository's root) and runs main, which prints NAME=VALUE lines, and
// returns them.
func cValues(t *testing.T, cc, source, main string, libs ...string) map[string]string {
	t.Helper()
	abs, err := filepath.Abs(filepath.Join("..", "..", source))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(abs); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "probe.c"), filepath.Join(dir, "probe")
	// _GNU_SOURCE as the modules define it before npurun_wire.c (struct
	// ucred).
	prog := fmt.Sprintf("#define _GNU_SOURCE\n#include %q\n\n%s", abs, main)
	if err := os.WriteFile(src, []byte(prog), 0o600); err != nil {
		t.Fatal(err)
	}
	// -w: the source's static functions go unused here.
	args := append([]string{"-std=gnu11", "-w", "-o", bin, src}, libs...)
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("cc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("%s's probe: %v", source, err)
	}
	vals := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			t.Fatalf("%s's probe said %q", source, sc.Text())
		}
		vals[name] = val
	}
	return vals
}

// agree compares the C value name with the Go value want (a string or an
// int), naming both sides where they differ.
func agree(t *testing.T, source string, vals map[string]string, name string, want any, goName string) {
	t.Helper()
	got, ok := vals[name]
	if !ok {
		t.Errorf("%s: %s not printed", source, name)
		return
	}
	if got != fmt.Sprint(want) {
		t.Errorf("%s: %s is %s, but Go's %s is %v: change both together", source, name, got, goName, want)
	}
}

// TestWireConstantsAgree: c/npurun_wire.c, the wire code of the PAM module
// and the SPANK plugin, has the broker client's constants.
func TestWireConstantsAgree(t *testing.T) {
	cc := needCC(t)
	const source = "c/npurun_wire.c"
	vals := cValues(t, cc, source, `
int main(void)
{
	printf("DEFAULT_SOCKET=%s\n", DEFAULT_SOCKET);
	printf("PROTOCOL_VERSION=%lld\n", (long long)(PROTOCOL_VERSION));
	printf("MAX_MESSAGE=%lld\n", (long long)(MAX_MESSAGE));
	printf("MAX_DEVICES=%lld\n", (long long)(MAX_DEVICES));
	printf("FIRST_LEASE_FD=%lld\n", (long long)(FIRST_LEASE_FD));
	return 0;
}
`)
	agree(t, source, vals, "DEFAULT_SOCKET", wire.DefaultSocket, "wire.DefaultSocket")
	agree(t, source, vals, "PROTOCOL_VERSION", wire.Version, "wire.Version")
	agree(t, source, vals, "MAX_MESSAGE", wire.MaxMessage, "wire.MaxMessage")
	agree(t, source, vals, "MAX_DEVICES", wire.MaxDevices, "wire.MaxDevices")
	agree(t, source, vals, "FIRST_LEASE_FD", wire.FirstLeaseFD, "wire.FirstLeaseFD")
}

// TestPAMConstantsAgree: pam_npurun.c reads the session-policy file the
// broker writes, by the same name and with the same cap on its size as
// wire.ReadSessionPolicy; it waits out any on_busy wait policy allows;
// and it hides the devices with npu.HiddenEnv's variables.
func TestPAMConstantsAgree(t *testing.T) {
	cc := needCC(t)
	needHeader(t, cc, "security/pam_modules.h", "libpam0g-dev or pam-devel")
	const source = "pam/module/pam_npurun.c"
	vals := cValues(t, cc, source, `
int main(void)
{
	size_t i;
	printf("POLICY_FILE=%s\n", POLICY_FILE);
	printf("MAX_POLICY=%lld\n", (long long)(MAX_POLICY));
	printf("MAX_WAIT_MS=%lld\n", (long long)(MAX_WAIT_MS));
	printf("HIDDEN_ENV=");
	for (i = 0; i < sizeof hidden_env / sizeof *hidden_env; i++)
		printf("%s%s", i ? " " : "", hidden_env[i]);
	printf("\n");
	return 0;
}
`, "-lpam")
	agree(t, source, vals, "POLICY_FILE", wire.SessionPolicyFile, "wire.SessionPolicyFile")
	if got := strings.Fields(vals["HIDDEN_ENV"]); !reflect.DeepEqual(got, npu.HiddenEnv()) {
		t.Errorf("%s: hidden_env is %q, but Go's npu.HiddenEnv() is %q: change both together", source, got, npu.HiddenEnv())
	}
	if ms, err := strconv.ParseInt(vals["MAX_WAIT_MS"], 10, 64); err != nil || ms < policy.MaxBusyWait.Milliseconds() {
		t.Errorf("%s: MAX_WAIT_MS is %q, shorter than Go's policy.MaxBusyWait (%d ms): a login's allowed wait would be refused", source, vals["MAX_WAIT_MS"], policy.MaxBusyWait.Milliseconds())
	}

	// Go's cap on the file is unexported: it is checked as Go reads the
	// file, one of MAX_POLICY bytes and one a byte longer. Only a file of
	// root's is read.
	max, err := strconv.Atoi(vals["MAX_POLICY"])
	if err != nil {
		t.Fatalf("%s: MAX_POLICY is %q", source, vals["MAX_POLICY"])
	}
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("reading a session-policy file needs root (a file of root's), and CI=true: run CI as root")
		}
		t.Skip("comparing MAX_POLICY with Go's cap needs root: the Go reader reads only a file of root's")
	}
	dir := t.TempDir()
	socket, path := filepath.Join(dir, "broker.sock"), filepath.Join(dir, wire.SessionPolicyFile)
	head := "on_broker_down deny\n"
	for _, size := range []int{max, max + 1} {
		data := []byte(head + strings.Repeat("#", size-len(head)-1) + "\n")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := wire.ReadSessionPolicy(socket)
		switch {
		case size == max && err != nil:
			t.Errorf("%s's MAX_POLICY is %d, but Go does not read a file of %d bytes: %v", source, max, size, err)
		case size == max && p.OnBrokerDown != "deny":
			t.Errorf("a file of %d bytes read as %+v", size, p)
		case size > max && err == nil:
			t.Errorf("%s's MAX_POLICY is %d, but Go reads a file of %d bytes", source, max, size)
		case size > max && !strings.Contains(err.Error(), "larger than"):
			t.Errorf("a file of %d bytes: %v, want larger than %d", size, err, max)
		}
	}
}
