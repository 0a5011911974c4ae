package status

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// TestNpurunStatusUsage: npubroker is in an sbin directory, on no ordinary
// user's PATH, while its status and usage are for everyone: npurun status
// and npurun usage run them (issue 27.15), as a user whose PATH has no
// sbin; their options and errors are npubroker's. Only the first word
// decides: npurun -- status runs a program named status under a lease.
func TestNpurunStatusUsage(t *testing.T) {
	u := harness.NewUser(t)
	b := harness.StartBroker(t, harness.FakeConfig(2))
	h := harness.Hold(t, b, "holder", "-d", "1")
	defer h.Release()
	dir := harness.SharedDir(t)
	userPath := "PATH=/usr/bin:/bin"
	run := func(args ...string) harness.TaskResult {
		t.Helper()
		cmd := harness.AsUser(b.Npurun(args...), &u, dir)
		cmd.Env = append(cmd.Env, userPath)
		return harness.RunTaskCmd(t, cmd)
	}

	r := run("status", "--json")
	var bd wire.Board
	if err := json.Unmarshal([]byte(r.Stdout), &bd); r.Code != 0 || err != nil {
		t.Fatalf("npurun status --json: %s (%v)", r, err)
	}
	if d := harness.Device(t, &bd, 1); d.Lease == nil || d.State != wire.DeviceLeased {
		t.Errorf("npurun status --json: npu1 %+v, want leased", d)
	}
	if r := run("status"); r.Code != 0 || !strings.Contains(r.Stdout, "DEVICE") || !strings.Contains(harness.LineWith(r.Stdout, "npu1 "), "leased") {
		t.Errorf("npurun status: %s; want the table with npu1 leased", r)
	}
	if r := run("usage", "--json"); r.Code != 0 || !strings.Contains(r.Stdout, `"since"`) {
		t.Errorf("npurun usage --json: %s; want the sums of the last 7 days", r)
	}
	if r := run("status", "--bogus"); r.Code != 2 || !strings.Contains(r.Stderr, "unknown flag: --bogus") {
		t.Errorf("npurun status --bogus: %s; want npubroker's usage error, 2", r)
	}
	if r := run("status", "--help"); r.Code != 0 || !strings.Contains(r.Stderr, "status [--json] [--watch] [--cluster] [--socket PATH]") {
		t.Errorf("npurun status --help: %s", r)
	}

	// A program named status, first in PATH: npurun -- status runs it.
	progs := filepath.Join(dir, "progs")
	if err := os.MkdirAll(progs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(progs, "status"), []byte("#!/bin/sh\necho \"ran status on $NPURUN_DEVICES\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := harness.AsUser(b.Npurun("--", "status"), &u, dir)
	cmd.Env = append(cmd.Env, "PATH="+progs+":/usr/bin:/bin")
	if r := harness.RunTaskCmd(t, cmd); r.Code != 0 || r.Stdout != "ran status on 0\n" {
		t.Errorf("npurun -- status: %s; want the program named status run on npu 0", r)
	}
}

// TestNpurunStatusInstalled: an npurun built by make with an SBINDIR, no
// npubroker beside it, runs the npubroker installed in SBINDIR; with none
// there, it says what is missing and exits 127.
func TestNpurunStatusInstalled(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	b := harness.StartBroker(t, harness.FakeConfig(1))
	tmp := t.TempDir()
	build, sbin := filepath.Join(tmp, "build"), filepath.Join(tmp, "sbin")
	if out, err := harness.MakeInRepo(t, "BUILDDIR="+build, "SBINDIR="+sbin, filepath.Join(build, "npurun")).CombinedOutput(); err != nil {
		t.Fatalf("make npurun: %v\n%s", err, out)
	}
	npurun := exec.Command(filepath.Join(build, "npurun"), "status")
	npurun.Env = b.Env()
	code, out := harness.ExitCode(t, npurun)
	if code != 127 || !strings.Contains(out, "npurun: "+filepath.Join(sbin, "npubroker")+": no such file or directory") || !strings.Contains(out, "npurun: hint: npurun status runs npubroker status") {
		t.Errorf("npurun status without npubroker: exit %d, want 127 naming %s/npubroker:\n%s", code, sbin, out)
	}
	if err := os.MkdirAll(sbin, 0o755); err != nil {
		t.Fatal(err)
	}
	harness.CopyFile(t, b.Bin.Broker, filepath.Join(sbin, "npubroker"), 0o755)
	npurun = exec.Command(filepath.Join(build, "npurun"), "status")
	npurun.Env = b.Env()
	if code, out := harness.ExitCode(t, npurun); code != 0 || !strings.Contains(out, "npu0") {
		t.Errorf("npurun status with %s/npubroker: exit %d:\n%s", sbin, code, out)
	}
}
