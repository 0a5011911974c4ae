package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// TestCheckConfigCommandLine: check-config has flags and help like the
// other commands, and warns, with file and line, of what the broker
// accepts but is probably a mistake, still exiting 0; errors still exit 1,
// devices missing from this machine (serve would not start) among them.
func TestCheckConfigCommandLine(t *testing.T) {
	bin := harness.Bins(t)
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// Line numbers matter: the warnings name them.
	warned := write("warned.conf", harness.FakeConfig(6)+`[pools]
a = "0-1"
b = "3"
[user.root]
max_devices = 2
[user.npurun-tnosuch]
max_devices = 1
[group.root]
max_devices = 2
[group.npurun-tnosuch]
max_devices = 1
`)
	clean := write("clean.conf", harness.FakeConfig(4)+"[pools]\na = \"0-1\"\nb = \"2-3\"\n[user.root]\nmax_devices = 2\n")
	bad := write("bad.conf", harness.FakeConfig(4)+"[pools]\na = \"0-1\"\n[user.npurun-tnosuch]\nmax_device = 1\n")
	// For a machine with devices this one lacks: serve would not start
	// here, and check-config says so as an error.
	devDir := filepath.Join(dir, "dev")
	if err := os.Mkdir(devDir, 0o755); err != nil {
		t.Fatal(err)
	}
	elsewhere := write("elsewhere.conf", "[devices]\nvendor = \"ascend\"\ndev_dir = \""+devDir+"\"\n")
	missing := write("missing.conf", "[devices]\nvendor = \"nvidia\"\nids = \"0-1\"\ndev_dir = \""+devDir+"\"\n")

	for _, tc := range []struct {
		name    string
		args    []string
		code    int
		out     []string // in standard output
		err     []string // in standard error
		errNot  []string // not in standard error
		noStdio bool     // nothing on standard output
	}{
		{name: "--help", args: []string{"--help"}, code: 0,
			err: []string{"npubroker check-config [--socket PATH] [FILE]", "Warnings"}, errNot: []string{"read config"}, noStdio: true},
		{name: "-h", args: []string{"-h"}, code: 0, err: []string{"npubroker check-config [--socket PATH] [FILE]"}, noStdio: true},
		{name: "unknown flag", args: []string{"--frobnicate", clean}, code: 2, err: []string{"npubroker: unknown flag: --frobnicate"}, noStdio: true},
		{name: "two files", args: []string{clean, warned}, code: 2, err: []string{"npubroker: check-config takes one file, got 2"}, noStdio: true},
		{name: "clean", args: []string{clean}, code: 0, out: []string{clean + ": ok"}, errNot: []string{"warning"}},
		{name: "warnings", args: []string{warned}, code: 0, out: []string{warned + ": ok"}, err: []string{
			warned + ":4: [pools]: warning: devices 2,4-5 are in no pool, so nobody may lease them",
			warned + `:9: [user.npurun-tnosuch]: warning: no user "npurun-tnosuch" on this machine`,
			warned + `:13: [group.npurun-tnosuch]: warning: no group "npurun-tnosuch" on this machine`,
		}, errNot: []string{"[user.root]", "[group.root]"}},
		{name: "errors still fail", args: []string{bad}, code: 1, err: []string{bad + ":7: [user.npurun-tnosuch] max_device: unknown key"}, noStdio: true},
		{name: "no devices here", args: []string{elsewhere}, code: 1, err: []string{
			elsewhere + ": [devices]: no ascend devices: no davinciN nodes in " + devDir}, noStdio: true},
		{name: "a device missing", args: []string{missing}, code: 1, err: []string{
			missing + ": [devices]: no gpu 0: " + devDir + "/nvidia0 does not exist"}, noStdio: true},
		{name: "no such file", args: []string{filepath.Join(dir, "nosuch.conf")}, code: 1, err: []string{
			"npubroker: read config: open " + filepath.Join(dir, "nosuch.conf") + ": no such file or directory"}, noStdio: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := harness.RunTaskCmd(t, exec.Command(bin.Broker, append([]string{"check-config"}, tc.args...)...))
			if r.Code != tc.code {
				t.Fatalf("npubroker check-config %s: want exit %d; %s", strings.Join(tc.args, " "), tc.code, r)
			}
			for _, w := range tc.out {
				if !strings.Contains(r.Stdout, w) {
					t.Errorf("standard output lacks %q; %s", w, r)
				}
			}
			for _, w := range tc.err {
				if !strings.Contains(r.Stderr, w) {
					t.Errorf("standard error lacks %q; %s", w, r)
				}
			}
			for _, w := range tc.errNot {
				if strings.Contains(r.Stderr, w) {
					t.Errorf("standard error has %q; %s", w, r)
				}
			}
			if tc.noStdio && r.Stdout != "" {
				t.Errorf("standard output has %q, want nothing", r.Stdout)
			}
		})
	}
}

// TestBrokerLogsStop: a broker stopped by SIGTERM or SIGINT says which
// signal stopped it, and that it stopped.
func TestBrokerLogsStop(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			b := harness.StartBroker(t, harness.FakeConfig(1))
			b.Signal(sig)
			name := map[syscall.Signal]string{syscall.SIGTERM: "SIGTERM", syscall.SIGINT: "SIGINT"}[sig]
			log := b.Log()
			stopping := strings.Index(log, "npubroker: "+name+": stopping")
			stopped := strings.LastIndex(log, "npubroker: stopped\n")
			if stopping < 0 || stopped < stopping || !strings.HasSuffix(log, "npubroker: stopped\n") {
				t.Errorf("broker log after %s lacks %q then a last line %q:\n%s", name, name+": stopping", "stopped", log)
			}
		})
	}
}

// TestConfigOneValidation: check-config, serve and reload validate a file
// the same way (broker.LoadConfig, and the running broker's own checks of
// a reload): a device node that does not exist is refused by all three
// with the same words; a [share] change while a share runs is refused by
// reload (it needs a restart), which check-config, asking the broker
// running, warns of, and taken by serve at the restart, the share going
// on.
func TestConfigOneValidation(t *testing.T) {
	harness.NeedRoot(t)
	serve := func(t *testing.T, b *harness.Broker) harness.TaskResult {
		t.Helper()
		cmd := exec.Command(b.Bin.Broker, "serve", "--config", b.Conf, "--run-dir", b.RunDir, "--socket", b.Socket, "--state-dir", b.StateDir, "--cgroup", "off", "--log", "stderr")
		cmd.Env = append(os.Environ(), b.ExtraEnv...)
		return harness.RunTaskCmd(t, cmd)
	}

	t.Run("device node missing", func(t *testing.T) {
		dev := harness.NewDevTree(t, 2)
		b := harness.StartBroker(t, dev.Config("0-1", ""))
		node := dev.Node("davinci1")
		if err := os.Remove(node); err != nil {
			t.Fatal(err)
		}
		want := b.Conf + ": [devices]: no npu 1: " + node + " does not exist"
		if code, out, errs := harness.DrainCmd(t, b, nil, "check-config", b.Conf); code != 1 || !strings.Contains(errs, want) || out != "" {
			t.Errorf("check-config: exit %d, %q, %q; want 1 and %q", code, out, errs, want)
		}
		if code, _, errs := harness.Reload(t, b); code != 1 || !strings.Contains(errs, want) {
			t.Errorf("reload: exit %d, %q; want 1 and %q", code, errs, want)
		}
		b.Stop()
		if r := serve(t, b); r.Code != 1 || !strings.Contains(r.Stderr, want) {
			t.Errorf("serve: want exit 1 and %q; %s", want, r)
		}
	})

	t.Run("share change with a share running", func(t *testing.T) {
		b := harness.StartBroker(t, harness.ShareConfig(1, "16G"))
		h := harness.Hold(t, b, "share", "--mem", "5G")
		harness.WriteConf(t, b, harness.FakeConfig(1))
		want := b.Conf + ": [share] pools, capacity, capacities, margin cannot change without a restart of the broker"
		code, out, errs := harness.DrainCmd(t, b, nil, "check-config", b.Conf)
		if code != 0 || !strings.Contains(out, b.Conf+": ok") || !strings.Contains(errs, b.Conf+": warning: npubroker reload of the broker running here refuses it: "+want) {
			t.Errorf("check-config: exit %d, %q, %q; want 0, ok, and the reload's refusal %q as a warning", code, out, errs, want)
		}
		if code, _, errs := harness.Reload(t, b); code != 1 || !strings.Contains(errs, want) {
			t.Errorf("reload: exit %d, %q; want 1 and %q", code, errs, want)
		}
		// serve takes it: the share runs on, the device whole once it ends.
		b.Kill()
		b.Start()
		b.WaitLog(0, "npu 0 holds a share of 5120 MiB from before this start, and is not shared now")
		if code, _, errs := harness.DrainCmd(t, b, nil, "check-config", b.Conf); code != 0 || strings.Contains(errs, "warning") {
			t.Errorf("check-config of the file the broker runs: exit %d, %q; want 0, no warning", code, errs)
		}
		h.Release()
		harness.WaitFree(t, b, 0)
	})
}
