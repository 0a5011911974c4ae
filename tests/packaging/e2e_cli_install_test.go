package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
)

// liveInstallPaths are where an install with the default prefix writes, and
// so where one with another prefix must not.
var liveInstallPaths = []string{
	"/etc/npurun", "/etc/npurun/npurun.conf",
	"/lib/systemd/system/npubroker.service", "/lib/systemd/system/npubroker.socket",
	"/etc/systemd/system/npubroker.service", "/usr/lib/systemd/system/npubroker.service",
	"/usr/local/lib/systemd/system/npubroker.service",
	"/usr/local/bin/npurun", "/usr/local/bin/task-submit", "/usr/local/sbin/npubroker", "/usr/local/sbin/npuboard", "/lib/systemd/system/npuboard.service",
	"/usr/local/libexec/npurun", "/usr/local/libexec/npurun/npurun-supervise", "/usr/local/libexec/npurun/npurun-runtime", "/usr/local/libexec/npurun/npurun-runtime-create",
	"/usr/local/share/man/man1/npurun.1", "/lib/security",
	"/usr/local/share/bash-completion/completions/npurun", "/usr/local/share/zsh/site-functions/_npurun",
	"/usr/local/share/fish/vendor_completions.d/npurun.fish",
}

// fileState is what a path is before and after: absent, or its mtime.
func fileState(p string) string {
	st, err := os.Lstat(p)
	if err != nil {
		return "absent"
	}
	return st.ModTime().Format(time.RFC3339Nano) + " " + st.Mode().String()
}

// absPaths are the absolute paths in make's dry-run output.
var absPaths = regexp.MustCompile(`(^|[\s'">])(/[^\s'";|&<>)]*)`)

// pamConfigDirs are where make uninstall looks for PAM configuration that
// loads the module (under DESTDIR): read, never written.
var pamConfigDirs = []string{"/etc/pam.d", "/usr/lib/pam.d", "/lib/pam.d", "/usr/share/pam-configs"}

// dryRunWritesOnlyUnder runs `make -n ARGS` and fails the test, before
// anything is run for real, if the commands name an absolute path outside
// the given roots (the repository's own files are read, never written: the
// build directory is in a root).
func dryRunWritesOnlyUnder(t *testing.T, args []string, roots ...string) {
	t.Helper()
	root := harness.Root()
	out, err := harness.MakeInRepo(t, append([]string{"-n"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("make -n %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if strings.Contains(string(out), "go build") {
		t.Fatalf("make -n %s would build, which this test does not allow for:\n%s", strings.Join(args, " "), out)
	}
	for _, m := range absPaths.FindAllStringSubmatch(string(out), -1) {
		p := filepath.Clean(m[2])
		ok := p == root || strings.HasPrefix(p, root+"/") || p == "/dev/null" || slices.Contains(pamConfigDirs, p)
		for _, r := range roots {
			ok = ok || p == r || strings.HasPrefix(p, r+"/")
		}
		if !ok {
			t.Fatalf("make %s would touch %s, outside %v; not running it. Dry run:\n%s", strings.Join(args, " "), p, roots, out)
		}
	}
}

// TestMakeInstallPrefix: make install and make uninstall with a PREFIX of
// their own write and remove only under it, the units name the installed
// paths, the configuration is installed once and kept, and uninstall
// leaves what it did not install.
func TestMakeInstallPrefix(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	harness.NeedPAMHeaders(t) // make install builds pam_npurun.so
	b := harness.Bins(t)
	harness.Npuboard(t) // beside the others in b.Dir
	tmp := t.TempDir()
	build := filepath.Join(tmp, "build")
	prefix := filepath.Join(tmp, "prefix")
	// Binaries built already, newer than every source: make builds nothing.
	if err := os.MkdirAll(build, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"npubroker", "npuboard", "npurun", "task-submit", "npurun-supervise", "npurun-slurm", "npurun-runtime", "npurun-runtime-create"} {
		harness.CopyFile(t, filepath.Join(b.Dir, name), filepath.Join(build, name), 0o755)
	}
	vars := []string{"PREFIX=" + prefix, "BUILDDIR=" + build}

	before := make(map[string]string)
	for _, p := range liveInstallPaths {
		before[p] = fileState(p)
	}
	checkLive := func(step string) {
		t.Helper()
		for _, p := range liveInstallPaths {
			if now := fileState(p); now != before[p] {
				t.Errorf("after %s, %s changed: %s, was %s", step, p, now, before[p])
			}
		}
	}

	install := append([]string{"install"}, vars...)
	dryRunWritesOnlyUnder(t, install, tmp)
	if out, err := harness.MakeInRepo(t, install...).CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	checkLive("make install")
	for _, p := range []string{"bin/npurun", "bin/task-submit", "sbin/npubroker", "sbin/npuboard", "libexec/npurun/npurun-supervise", "libexec/npurun/npurun-slurm", "libexec/npurun/npurun-runtime", "libexec/npurun/npurun-runtime-create", "share/man/man1/npurun.1", "share/man/man8/npurun-runtime.8",
		"share/man/man1/task-submit.1", "share/man/man5/npurun.conf.5", "share/man/man8/npubroker.8", "share/man/man8/npuboard.8",
		"lib/systemd/system/npubroker.service", "lib/systemd/system/npubroker.socket", "lib/systemd/system/npuboard.service", "etc/npurun/npurun.conf"} {
		if _, err := os.Stat(filepath.Join(prefix, p)); err != nil {
			t.Errorf("make install did not install %s: %v", p, err)
		}
	}
	// The completion scripts, as the installed programs write them.
	for _, c := range completionFiles("share/zsh/site-functions") {
		want, err := exec.Command(filepath.Join(b.Dir, c.prog), "--completion", c.shell).Output()
		if err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(filepath.Join(prefix, c.path)); err != nil || string(got) != string(want) {
			t.Errorf("make install: %s is not %s --completion %s (%v)", c.path, c.prog, c.shell, err)
		}
	}
	unit := mustRead(t, filepath.Join(prefix, "lib/systemd/system/npubroker.service"))
	if want := "ExecStart=" + prefix + "/sbin/npubroker serve --config " + prefix + "/etc/npurun/npurun.conf\n"; !strings.Contains(unit, want) {
		t.Errorf("installed unit lacks %q:\n%s", want, unit)
	}
	board := mustRead(t, filepath.Join(prefix, "lib/systemd/system/npuboard.service"))
	if want := "ExecStart=" + prefix + "/sbin/npuboard --config " + prefix + "/etc/npurun/npurun.conf\n"; !strings.Contains(board, want) || !strings.Contains(board, "\nUser=npuboard\n") {
		t.Errorf("installed npuboard.service lacks %q or User=npuboard:\n%s", want, board)
	}

	// The administrator's configuration survives a second install.
	conf := filepath.Join(prefix, "etc/npurun/npurun.conf")
	if err := os.WriteFile(conf, []byte("# mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := harness.MakeInRepo(t, install...).CombinedOutput(); err != nil {
		t.Fatalf("second make install: %v\n%s", err, out)
	}
	if got := mustRead(t, conf); got != "# mine\n" {
		t.Errorf("second make install overwrote the configuration: %q", got)
	}

	// A file that is not this install's is left, and named.
	foreignMan := filepath.Join(prefix, "share/man/man8/npubroker.8")
	if err := os.WriteFile(foreignMan, []byte(".TH OTHER 8\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	uninstall := append([]string{"uninstall"}, vars...)
	dryRunWritesOnlyUnder(t, uninstall, tmp)
	out, err := harness.MakeInRepo(t, uninstall...).CombinedOutput()
	if err != nil {
		t.Fatalf("make uninstall: %v\n%s", err, out)
	}
	checkLive("make uninstall")
	gone := []string{"bin/npurun", "bin/task-submit", "sbin/npubroker", "sbin/npuboard", "lib/systemd/system/npuboard.service", "libexec/npurun/npurun-supervise", "libexec/npurun/npurun-runtime", "libexec/npurun/npurun-runtime-create", "libexec/npurun",
		"share/man/man1/npurun.1", "lib/systemd/system/npubroker.service", "lib/systemd/system/npubroker.socket"}
	for _, c := range completionFiles("share/zsh/site-functions") {
		gone = append(gone, c.path)
	}
	for _, p := range gone {
		if _, err := os.Lstat(filepath.Join(prefix, p)); err == nil {
			t.Errorf("make uninstall left %s; output:\n%s", p, out)
		}
	}
	if _, err := os.Stat(foreignMan); err != nil || !strings.Contains(string(out), "left "+foreignMan) {
		t.Errorf("make uninstall removed or did not name the changed %s (%v); output:\n%s", foreignMan, err, out)
	}
	if mustRead(t, conf) != "# mine\n" {
		t.Errorf("make uninstall touched the configuration")
	}
}

// TestMakeInstallStaged: with DESTDIR, every file lands under it while the
// units name the paths of the final install.
func TestMakeInstallStaged(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	harness.NeedPAMHeaders(t) // make install builds pam_npurun.so
	b := harness.Bins(t)
	harness.Npuboard(t) // beside the others in b.Dir
	tmp := t.TempDir()
	build := filepath.Join(tmp, "build")
	stage := filepath.Join(tmp, "stage")
	if err := os.MkdirAll(build, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"npubroker", "npuboard", "npurun", "task-submit", "npurun-supervise", "npurun-slurm", "npurun-runtime", "npurun-runtime-create"} {
		harness.CopyFile(t, filepath.Join(b.Dir, name), filepath.Join(build, name), 0o755)
	}
	for _, tc := range []struct {
		prefix, unit, conf string
	}{
		{"/usr/local", "/lib/systemd/system", "/etc"},
		{"/usr", "/lib/systemd/system", "/etc"},
		{"/opt/npurun", "/opt/npurun/lib/systemd/system", "/opt/npurun/etc"},
	} {
		t.Run(tc.prefix, func(t *testing.T) {
			dest := filepath.Join(stage, strings.ReplaceAll(tc.prefix, "/", "_"))
			args := []string{"install", "PREFIX=" + tc.prefix, "DESTDIR=" + dest, "BUILDDIR=" + build}
			dryRunWritesOnlyUnder(t, args, tmp)
			if out, err := harness.MakeInRepo(t, args...).CombinedOutput(); err != nil {
				t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			unit := mustRead(t, filepath.Join(dest, tc.unit, "npubroker.service"))
			if want := "ExecStart=" + tc.prefix + "/sbin/npubroker serve --config " + tc.conf + "/npurun/npurun.conf\n"; !strings.Contains(unit, want) {
				t.Errorf("staged unit lacks %q:\n%s", want, unit)
			}
			zsh := tc.prefix + "/share/zsh/site-functions/_npurun"
			if tc.prefix == "/usr" {
				zsh = "/usr/share/zsh/vendor-completions/_npurun"
			}
			for _, p := range []string{tc.prefix + "/bin/npurun", tc.prefix + "/sbin/npubroker", tc.conf + "/npurun/npurun.conf", tc.unit + "/npubroker.socket",
				tc.prefix + "/share/bash-completion/completions/task-submit", zsh, tc.prefix + "/share/fish/vendor_completions.d/npubroker.fish"} {
				if _, err := os.Stat(filepath.Join(dest, p)); err != nil {
					t.Errorf("%s not staged: %v", p, err)
				}
			}
		})
	}
}

// TestMakeUninstallOtherPrefix: two installs that share the unit
// directory (/usr/local and /usr both use /lib/systemd/system): uninstalling
// one leaves the other's units.
func TestMakeUninstallOtherPrefix(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	harness.NeedPAMHeaders(t) // make install builds pam_npurun.so
	b := harness.Bins(t)
	harness.Npuboard(t) // beside the others in b.Dir
	tmp := t.TempDir()
	build := filepath.Join(tmp, "build")
	if err := os.MkdirAll(build, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"npubroker", "npuboard", "npurun", "task-submit", "npurun-supervise", "npurun-slurm", "npurun-runtime", "npurun-runtime-create"} {
		harness.CopyFile(t, filepath.Join(b.Dir, name), filepath.Join(build, name), 0o755)
	}
	units := filepath.Join(tmp, "units")
	common := []string{"BUILDDIR=" + build, "SYSTEMDDIR=" + units, "SYSCONFDIR=" + filepath.Join(tmp, "etc")}
	a := append([]string{"PREFIX=" + filepath.Join(tmp, "a")}, common...)
	other := append([]string{"PREFIX=" + filepath.Join(tmp, "b")}, common...)
	dryRunWritesOnlyUnder(t, append([]string{"install"}, a...), tmp)
	if out, err := harness.MakeInRepo(t, append([]string{"install"}, a...)...).CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	dryRunWritesOnlyUnder(t, append([]string{"uninstall"}, other...), tmp)
	out, err := harness.MakeInRepo(t, append([]string{"uninstall"}, other...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("make uninstall: %v\n%s", err, out)
	}
	for _, u := range []string{"npubroker.service", "npubroker.socket"} {
		if _, err := os.Stat(filepath.Join(units, u)); err != nil {
			t.Errorf("uninstalling another prefix removed %s; output:\n%s", u, out)
		}
	}
	if _, err := os.Stat(filepath.Join(tmp, "a/bin/npurun")); err != nil {
		t.Errorf("uninstalling another prefix removed a/bin/npurun: %v", err)
	}
}

// TestMakeUninstallPAMConfigured: make uninstall refuses, naming the files
// and lines, while a PAM configuration (a service file, a pam-auth-update
// profile) loads the module it would remove, or an sshd ForceCommand runs
// the npurun it would remove, and removes nothing; comments,
// "-session" lines and other modules do not count; FORCE=1 goes ahead, and
// so does an uninstall once the lines are gone (issue 14.2). All of it in
// a DESTDIR of the test's: the machine's /etc/pam.d is never touched.
func TestMakeUninstallPAMConfigured(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	harness.NeedPAMHeaders(t)
	b := harness.Bins(t)
	harness.Npuboard(t) // beside the others in b.Dir
	tmp := t.TempDir()
	build := filepath.Join(tmp, "build")
	if err := os.MkdirAll(build, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"npubroker", "npuboard", "npurun", "task-submit", "npurun-supervise", "npurun-slurm", "npurun-runtime", "npurun-runtime-create"} {
		harness.CopyFile(t, filepath.Join(b.Dir, name), filepath.Join(build, name), 0o755)
	}
	dest := filepath.Join(tmp, "stage")
	// PREFIX /usr and PAMDIR a system directory, as a real install: a bare
	// module name loads this module.
	vars := []string{"PREFIX=/usr", "DESTDIR=" + dest, "BUILDDIR=" + build}
	if out, err := harness.MakeInRepo(t, append([]string{"install"}, vars...)...).CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	module := filepath.Join(dest, "lib/security/pam_npurun.so")
	npurun := filepath.Join(dest, "usr/bin/npurun")
	write := func(rel, text string) string {
		t.Helper()
		p := filepath.Join(dest, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sshd := write("etc/pam.d/sshd", "@include common-session\nsession required pam_npurun.so\n")
	login := write("etc/pam.d/login", "session  [success=ok default=bad]  /lib/security/pam_npurun.so lease\n")
	write("etc/pam.d/su-l", "# session required pam_npurun.so lease\n-session optional pam_npurun.so\nsession required pam_other_npurun.so\n")
	profile := write("usr/share/pam-configs/npurun", "Name: npurun device leases\nDefault: yes\nPriority: 0\nSession-Type: Additional\nSession:\n\trequired\tpam_npurun.so\n")
	// sshd's ForceCommand runs this install's npurun (by name: /usr/bin is
	// on sshd's PATH): without it, those accounts' logins fail (issue 27.11).
	forced := write("etc/ssh/sshd_config.d/npurun.conf", "# ForceCommand npurun --login\nMatch Group students\n    ForceCommand npurun --login\n")
	write("etc/ssh/sshd_config", "Include /etc/ssh/sshd_config.d/*.conf\nForceCommand /usr/local/bin/other\n")

	uninstall := append([]string{"uninstall"}, vars...)
	out, err := harness.MakeInRepo(t, uninstall...).CombinedOutput()
	if err == nil {
		t.Fatalf("make uninstall went ahead while PAM loads the module; output:\n%s", out)
	}
	for _, want := range []string{
		"PAM loads pam_npurun.so here",
		sshd + ":2: session required pam_npurun.so",
		login + ":1: session  [success=ok default=bad]  /lib/security/pam_npurun.so lease",
		profile + ":6: \trequired\tpam_npurun.so",
		"sshd runs /usr/bin/npurun for these accounts (ForceCommand)",
		forced + ":3:     ForceCommand npurun --login",
		"make uninstall: hint: ",
		"FORCE=1",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("make uninstall's refusal lacks %q; output:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "su-l") || strings.Contains(string(out), "/usr/local/bin/other") || strings.Contains(string(out), ":1: # ForceCommand") {
		t.Errorf("make uninstall named su-l, sshd_config or a comment, whose lines do not load the module nor run npurun; output:\n%s", out)
	}
	for _, p := range []string{module, npurun} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("the refused uninstall removed %s", p)
		}
	}

	// Another prefix's module is not the one these lines load: its
	// uninstall goes ahead.
	other := []string{"uninstall", "PREFIX=/opt/npurun", "DESTDIR=" + dest, "BUILDDIR=" + build}
	if out, err := harness.MakeInRepo(t, other...).CombinedOutput(); err != nil {
		t.Errorf("make %s refused, though the PAM lines load /lib/security's module: %v\n%s", strings.Join(other, " "), err, out)
	}

	// FORCE=1: removed all the same.
	if out, err := harness.MakeInRepo(t, append(uninstall, "FORCE=1")...).CombinedOutput(); err != nil {
		t.Fatalf("make uninstall FORCE=1: %v\n%s", err, out)
	}
	if _, err := os.Stat(module); err == nil {
		t.Errorf("make uninstall FORCE=1 left %s", module)
	}

	// Installed again, the lines taken out: no refusal.
	if out, err := harness.MakeInRepo(t, append([]string{"install"}, vars...)...).CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	for _, p := range []string{sshd, login, profile, forced} {
		os.Remove(p)
	}
	if out, err := harness.MakeInRepo(t, uninstall...).CombinedOutput(); err != nil {
		t.Fatalf("make uninstall without PAM lines: %v\n%s", err, out)
	}
	if _, err := os.Stat(module); err == nil {
		t.Errorf("make uninstall left %s", module)
	}
}

// completionFile is a completion script make install installs: where,
// under the prefix, and what writes it.
type completionFile struct{ path, prog, shell string }

// completionFiles are the scripts make install installs, the zsh ones in
// zshDir.
func completionFiles(zshDir string) []completionFile {
	var cs []completionFile
	for _, prog := range []string{"npurun", "task-submit", "npubroker"} {
		cs = append(cs,
			completionFile{"share/bash-completion/completions/" + prog, prog, "bash"},
			completionFile{zshDir + "/_" + prog, prog, "zsh"},
			completionFile{"share/fish/vendor_completions.d/" + prog + ".fish", prog, "fish"})
	}
	return cs
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestMakeNeedsCgo: npubroker is not built without cgo (its user and
// group lookups would then skip NSS); the build says why and how to fix it.
func TestMakeNeedsCgo(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	build := t.TempDir()
	target := filepath.Join(build, "npubroker")
	cmd := harness.MakeInRepo(t, "BUILDDIR="+build, target)
	cmd.Env = append(cmd.Env, "CGO_ENABLED=0") // as Go decides where it finds no C compiler
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "npubroker needs cgo") || !strings.Contains(string(out), "install a C compiler") {
		t.Fatalf("make %s without cgo: %v, want a failure naming cgo and the C compiler; output:\n%s", target, err, out)
	}
	if _, err := os.Stat(target); err == nil {
		t.Errorf("npubroker was built without cgo")
	}
}
