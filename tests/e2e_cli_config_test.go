package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestCheckConfigCommandLine: check-config has flags and help like the
// other commands, and warns, with file and line, of what the broker
// accepts but is probably a mistake, still exiting 0; errors still exit 1.
func TestCheckConfigCommandLine(t *testing.T) {
	bin := bins(t)
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// Line numbers matter: the warnings name them.
	warned := write("warned.conf", FakeConfig(6)+`[pools]
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
	clean := write("clean.conf", FakeConfig(4)+"[pools]\na = \"0-1\"\nb = \"2-3\"\n[user.root]\nmax_devices = 2\n")
	bad := write("bad.conf", FakeConfig(4)+"[pools]\na = \"0-1\"\n[user.npurun-tnosuch]\nmax_device = 1\n")
	// Valid, but for a machine with devices this one lacks: serve would
	// not start here.
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
			err: []string{"npubroker check-config [FILE]", "Warnings"}, errNot: []string{"read config"}, noStdio: true},
		{name: "-h", args: []string{"-h"}, code: 0, err: []string{"npubroker check-config [FILE]"}, noStdio: true},
		{name: "unknown flag", args: []string{"--frobnicate", clean}, code: 2, err: []string{"npubroker: unknown flag: --frobnicate"}, noStdio: true},
		{name: "two files", args: []string{clean, warned}, code: 2, err: []string{"npubroker: check-config takes one file, got 2"}, noStdio: true},
		{name: "clean", args: []string{clean}, code: 0, out: []string{clean + ": ok"}, errNot: []string{"warning"}},
		{name: "warnings", args: []string{warned}, code: 0, out: []string{warned + ": ok"}, err: []string{
			warned + ":4: [pools]: warning: devices 2,4-5 are in no pool, so nobody may lease them",
			warned + `:9: [user.npurun-tnosuch]: warning: no user "npurun-tnosuch" on this machine`,
			warned + `:13: [group.npurun-tnosuch]: warning: no group "npurun-tnosuch" on this machine`,
		}, errNot: []string{"[user.root]", "[group.root]"}},
		{name: "errors still fail", args: []string{bad}, code: 1, err: []string{bad + ":7: [user.npurun-tnosuch] max_device: unknown key"}, noStdio: true},
		{name: "no devices here", args: []string{elsewhere}, code: 0, out: []string{elsewhere + ": ok"}, err: []string{
			elsewhere + ": [devices]: warning: no ascend devices: no davinciN nodes in " + devDir + ": npubroker serve would not start on this machine"}},
		{name: "a device missing", args: []string{missing}, code: 0, out: []string{missing + ": ok"}, err: []string{
			missing + ": [devices]: warning: no gpu 0: " + devDir + "/nvidia0 does not exist: npubroker serve would not start on this machine"}},
		{name: "no such file", args: []string{filepath.Join(dir, "nosuch.conf")}, code: 1, err: []string{
			"npubroker: read config: open " + filepath.Join(dir, "nosuch.conf") + ": no such file or directory"}, noStdio: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runTaskCmd(t, exec.Command(bin.Broker, append([]string{"check-config"}, tc.args...)...))
			if r.code != tc.code {
				t.Fatalf("npubroker check-config %s: want exit %d; %s", strings.Join(tc.args, " "), tc.code, r)
			}
			for _, w := range tc.out {
				if !strings.Contains(r.stdout, w) {
					t.Errorf("standard output lacks %q; %s", w, r)
				}
			}
			for _, w := range tc.err {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("standard error lacks %q; %s", w, r)
				}
			}
			for _, w := range tc.errNot {
				if strings.Contains(r.stderr, w) {
					t.Errorf("standard error has %q; %s", w, r)
				}
			}
			if tc.noStdio && r.stdout != "" {
				t.Errorf("standard output has %q, want nothing", r.stdout)
			}
		})
	}
}

// TestBrokerLogsStop: a broker stopped by SIGTERM or SIGINT says which
// signal stopped it, and that it stopped.
func TestBrokerLogsStop(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			b := StartBroker(t, FakeConfig(1))
			b.signal(sig)
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
