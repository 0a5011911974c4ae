//go:build debtest

package packaging

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// debInnerEnv names the test's directory in the inner run, in the mount
// namespace.
const debInnerEnv = "NPURUN_DEBTEST_DIR"

// standInDir is the systemctl stand-in's state: its calls, the broker's
// pid and log. Under /run, so in the namespace's overlay only.
const standInDir = "/run/npurun-debtest-systemctl"

func init() {
	if filepath.Base(os.Args[0]) == "systemctl" {
		os.Exit(standInSystemctl(os.Args[1:]))
	}
}

func TestDebPackages(t *testing.T) {
	if dir := os.Getenv(debInnerEnv); dir != "" {
		debInner(t, dir)
		return
	}
	var (
		before, dir string
		v1, v2      debPair
	)
	steps := []debStep{{"prerequisites; the machine as found noted", func(t *testing.T) {
		harness.NeedRoot(t)
		for _, tool := range []string{"make", "dpkg-buildpackage", "dh", "lintian", "apt-get", "pam-auth-update", "su", "useradd"} {
			if _, err := exec.LookPath(tool); err != nil {
				t.Fatalf("%s not found: the package test needs dpkg-dev, debhelper, lintian, apt, libpam-runtime, util-linux and passwd (.ci/run installs them)", tool)
			}
		}
		debRefuseIfInstalled(t)
		before = debHostState(t)

		var err error
		dir, err = os.MkdirTemp("", "npurun-deb-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := os.Chmod(dir, 0o755); err != nil { // apt's _apt reads the packages
			t.Fatal(err)
		}
	}}}
	if reuse := os.Getenv("NPURUN_DEBTEST_PACKAGES"); reuse != "" {
		// Working on the test: the packages of an earlier build, as
		// DIR/v1 and DIR/v2, instead of two builds.
		steps = append(steps, debStep{"the packages of NPURUN_DEBTEST_PACKAGES", func(t *testing.T) {
			for _, v := range []string{"v1", "v2"} {
				if out, err := exec.Command("cp", "-R", filepath.Join(reuse, v), filepath.Join(dir, v)).CombinedOutput(); err != nil {
					t.Fatalf("NPURUN_DEBTEST_PACKAGES: %v: %s", err, out)
				}
			}
			v1, v2 = debFind(t, filepath.Join(dir, "v1")), debFind(t, filepath.Join(dir, "v2"))
		}})
	} else {
		steps = append(steps,
			debStep{"build v1", func(t *testing.T) { v1 = debBuild(t, dir, "v1", "") }},
			debStep{"build v2", func(t *testing.T) { v2 = debBuild(t, dir, "v2", v1.Version+"+debtest2") }})
	}
	steps = append(steps,
		debStep{"v2 upgrades v1", func(t *testing.T) {
			if err := exec.Command("dpkg", "--compare-versions", v2.Version, "gt", v1.Version).Run(); err != nil {
				t.Fatalf("version %s does not upgrade %s", v2.Version, v1.Version)
			}
		}},
		debStep{"lintian", func(t *testing.T) { debLintian(t, v1) }},
		debStep{"README size", func(t *testing.T) { debReadmeSize(t, v1) }},
		debStep{"the inner run, in a mount namespace", func(t *testing.T) { debRunInner(t, dir) }},
		debStep{"the machine left as found", func(t *testing.T) {
			if after := debHostState(t); after != before {
				t.Errorf("the machine's PAM configuration or packages changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		}})
	debSteps(t, "outside", steps)
}

// debStep is one named step of the package test. The steps run in order
// on the test's own *testing.T, not as subtests: what a step registers with
// t.Cleanup (users, the shared directory, processes, the systemctl
// stand-in's broker) must last until the whole test ends, as later steps
// use it, and a step's t.Fatal must stop the test, not only the step.
type debStep struct {
	name string
	run  func(*testing.T)
}

// debSteps runs steps in order, logging each by name as it starts and,
// where one fails, naming it: a t.Fatal (or a panic) stops the test in
// that step; a t.Error lets it go on to the next, as it would without
// steps.
func debSteps(t *testing.T, what string, steps []debStep) {
	t.Helper()
	for i, s := range steps {
		t.Logf("%s, step %d of %d: %s", what, i+1, len(steps), s.name)
		failed, done := t.Failed(), false
		func() {
			defer func() {
				switch {
				case !done && t.Skipped():
					t.Logf("%s: step %q skipped the test", what, s.name)
				case !done:
					t.Logf("%s: step %q failed and stopped the test", what, s.name)
				case t.Failed() && !failed:
					t.Logf("%s: step %q failed; the test goes on", what, s.name)
				}
			}()
			s.run(t)
			done = true
		}()
	}
}

// debReadmeSize: the README's size of the npurun package ("about N MB")
// is the built one's within 10%.
func debReadmeSize(t *testing.T, p debPair) {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(harness.Root(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("packages are about ([0-9.]+) MB \\(`npurun`").FindSubmatch(readme)
	if m == nil {
		t.Fatalf("the README does not say how large the npurun package is (\"packages are about N MB (`npurun`\")")
	}
	said, _ := strconv.ParseFloat(string(m[1]), 64)
	st, err := os.Stat(p.Npurun)
	if err != nil {
		t.Fatal(err)
	}
	if is := float64(st.Size()) / 1e6; said < is*0.9 || said > is*1.1 {
		t.Errorf("the README says the npurun package is about %s MB; it is %.1f MB (%d bytes)", m[1], is, st.Size())
	}
}

// debDocPaths are the programs' paths in the Slurm configuration that the
// README and spank_npurun(8) show (Prolog=, Epilog=, plugstack.conf's
// line): the package's, each of which must be installed.
func debDocPaths(t *testing.T) []string {
	t.Helper()
	var paths []string
	re := regexp.MustCompile(`(?m)^(?:Prolog=|Epilog=|optional )(/\S+)$`)
	for _, doc := range []string{"README.md", "man/spank_npurun.8"} {
		data, err := os.ReadFile(filepath.Join(harness.Root(), doc))
		if err != nil {
			t.Fatal(err)
		}
		found := re.FindAllSubmatch(data, -1)
		if len(found) < 3 {
			t.Fatalf("%s shows %d of the Slurm paths (Prolog=, Epilog=, optional ...spank_npurun.so), want 3", doc, len(found))
		}
		for _, f := range found {
			paths = append(paths, strings.ReplaceAll(string(f[1]), `\-`, "-"))
		}
	}
	return paths
}

// debPaths are where the packages put files, and where a make install
// would: if any is there, this machine has an npurun of its own that the
// test must not be confused by (nor, without its namespace, disturb).
var debPaths = []string{
	"/usr/bin/npurun", "/usr/bin/task-submit", "/usr/sbin/npubroker", "/usr/libexec/npurun",
	"/usr/share/pam-configs/npurun", "/etc/npurun",
	"/usr/local/bin/npurun", "/usr/local/bin/task-submit", "/usr/local/sbin/npubroker", "/usr/local/libexec/npurun",
	"/lib/security/pam_npurun.so", "/lib/systemd/system/npubroker.service", "/etc/systemd/system/npubroker.service",
}

// debHidden are a broker's state and run directories: no install, but in
// the namespace they are removed at the start, so that the packages' broker
// starts afresh and the purge can be seen to remove its own.
var debHidden = []string{"/var/spool/npurun", "/run/npurun"}

// debRefuseIfInstalled fails the test, before it changes anything, on a
// machine where npurun is installed (as packages or by make install) or a
// PAM stack names the module.
func debRefuseIfInstalled(t *testing.T) {
	t.Helper()
	var found []string
	for _, p := range debPaths {
		if _, err := os.Lstat(p); err == nil {
			found = append(found, p)
		}
	}
	if m, _ := filepath.Glob("/lib/*/security/pam_npurun.so"); len(m) > 0 {
		found = append(found, m...)
	}
	out, _ := exec.Command("dpkg-query", "-W", "-f", "${Package} ${db:Status-Status}\n", "npurun", "libpam-npurun").Output()
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if name, status, _ := strings.Cut(line, " "); status != "" && status != "not-installed" {
			found = append(found, "package "+name+" ("+status+")")
		}
	}
	if out, _ := exec.Command("grep", "-rl", "pam_npurun", "/etc/pam.d").Output(); len(out) > 0 {
		found = append(found, strings.Fields(string(out))...)
	}
	if len(found) > 0 {
		t.Fatalf("this machine has an npurun of its own (%s): the package test installs and purges npurun packages and would test those, not its own; run it on a machine without npurun", strings.Join(found, ", "))
	}
}

// debHostState is what the test must leave as it found: the PAM
// configuration and state, file by file, and the packages' status.
func debHostState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, root := range []string{"/etc/pam.d", "/usr/share/pam-configs", "/var/lib/pam"} {
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				fmt.Fprintf(&b, "%s: %v\n", p, err)
				return nil
			}
			if d.Type().IsRegular() {
				data, err := os.ReadFile(p)
				sum := sha256.Sum256(data)
				fmt.Fprintf(&b, "%s %s %v\n", p, hex.EncodeToString(sum[:8]), err)
			}
			return nil
		})
	}
	for _, p := range debPaths {
		_, err := os.Lstat(p)
		fmt.Fprintf(&b, "%s present: %v\n", p, err == nil)
	}
	out, _ := exec.Command("dpkg-query", "-W", "-f", "${Package} ${db:Status-Status}\n", "npurun", "libpam-npurun").Output()
	b.Write(out)
	return b.String()
}

// debPair is one build's two packages.
type debPair struct {
	Version, Dir, Npurun, PAM string
}

// debBuild runs make deb into dir/name, with version (or the Makefile's
// default), in a network namespace of its own: the build must need no
// network once the modules are vendored (outside it, into dir/vendor).
func debBuild(t *testing.T, dir, name, version string) debPair {
	t.Helper()
	root, err := harness.RootDir()
	if err != nil {
		t.Fatal(err)
	}
	vendor := filepath.Join(dir, "vendor")
	debdir := filepath.Join(dir, name)
	makeCmd := func(args ...string) *exec.Cmd {
		cmd := exec.Command("make", append([]string{"--no-print-directory", "-C", root}, args...)...)
		for _, kv := range os.Environ() {
			if k, _, _ := strings.Cut(kv, "="); k != "MAKEFLAGS" && k != "MFLAGS" && k != "DESTDIR" && k != "DEBDIR" && k != "DEB_VERSION" && k != "BUILDDIR" {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		return cmd
	}
	if name == "v1" {
		if out, err := makeCmd("deb-vendor", "VENDORDIR="+vendor).CombinedOutput(); err != nil {
			t.Fatalf("make deb-vendor: %v\n%s", err, out)
		}
	}
	args := []string{"deb", "VENDORDIR=" + vendor, "DEBDIR=" + debdir}
	if version != "" {
		args = append(args, "DEB_VERSION="+version)
	}
	cmd := makeCmd(args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNET}
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("make %s (offline): %v\n%s", strings.Join(args, " "), err, debTail(out, 60))
	}
	one := func(pattern string) string {
		m, _ := filepath.Glob(filepath.Join(debdir, pattern))
		if len(m) != 1 {
			t.Fatalf("make deb left %v for %s in %s, want one", m, pattern, debdir)
		}
		return m[0]
	}
	p := debPair{Dir: debdir, Npurun: one("npurun_*.deb"), PAM: one("libpam-npurun_*.deb")}
	v, err := exec.Command("dpkg-deb", "-f", p.Npurun, "Version").Output()
	if err != nil {
		t.Fatal(err)
	}
	p.Version = strings.TrimSpace(string(v))
	if version != "" && p.Version != version {
		t.Fatalf("make deb DEB_VERSION=%s built version %s", version, p.Version)
	}
	sizes := make([]string, 0, 2)
	for _, f := range []string{p.Npurun, p.PAM} {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, fmt.Sprintf("%s %d bytes", filepath.Base(f), st.Size()))
	}
	t.Logf("make deb (%s, offline): %s; %s", name, took.Round(time.Second), strings.Join(sizes, ", "))
	return p
}

func debTail(out []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// debLintian: no error or warning but those the packages override, each
// with its reason in debian/*.lintian-overrides.
func debLintian(t *testing.T, p debPair) {
	t.Helper()
	changes, _ := filepath.Glob(filepath.Join(p.Dir, "*.changes"))
	if len(changes) != 1 {
		t.Fatalf("make deb left %v, want one .changes", changes)
	}
	cmd := exec.Command("lintian", "--fail-on", "error,warning", "--display-info", "--pedantic", changes[0])
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("lintian %s: %v\n%s", changes[0], err, out)
	}
	if tags := regexp.MustCompile(`(?m)^[EWIP]: .*$`).FindAllString(string(out), -1); len(tags) > 0 {
		t.Logf("lintian, informational:\n%s", strings.Join(tags, "\n"))
	}
}

// debRunInner runs this test again in a mount namespace of its own and,
// once it has ended, ends every process left in that namespace.
func debRunInner(t *testing.T, dir string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^TestDebPackages$", "-test.v", "-test.count=1", "-test.timeout=30m")
	cmd.Env = append(os.Environ(), debInnerEnv+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", cmd.Process.Pid))
	own, _ := os.Readlink("/proc/self/ns/mnt")
	if err != nil || ns == own {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the inner test is not in a mount namespace of its own (%q, ours %q, %v)", ns, own, err)
	}
	t.Cleanup(func() { debKillNamespace(t, ns) })
	out := make(chan struct{})
	go func() {
		defer close(out)
		buf := make([]byte, 64*1024)
		var line []byte
		for {
			n, err := r.Read(buf)
			line = append(line, buf[:n]...)
			for {
				i := bytes.IndexByte(line, '\n')
				if i < 0 {
					break
				}
				t.Log("ns: " + string(line[:i]))
				line = line[i+1:]
			}
			if err != nil {
				if len(line) > 0 {
					t.Log("ns: " + string(line))
				}
				r.Close()
				return
			}
		}
	}()
	err = cmd.Wait()
	debKillNamespace(t, ns)
	<-out
	if err != nil {
		t.Fatalf("the package test in its mount namespace failed: %v", err)
	}
}

// debKillNamespace kills every process in the mount namespace ns (the
// broker, supervisors and sessions the inner test started), so that the
// namespace, and every write made in it, goes.
func debKillNamespace(t *testing.T, ns string) {
	for round := 0; ; round++ {
		var left []int
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if link, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err == nil && link == ns {
				syscall.Kill(pid, syscall.SIGKILL)
				left = append(left, pid)
			}
		}
		if len(left) == 0 {
			return
		}
		if round == 100 {
			t.Errorf("processes %v in the test's mount namespace survive SIGKILL", left)
			return
		}
		for _, pid := range left {
			debAwaitExit(pid, time.Second)
		}
	}
}

// debAwaitExit waits up to d for process pid to end, on a pidfd: an event,
// also for a process that is not our child.
func debAwaitExit(pid int, d time.Duration) bool {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return true // gone
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for deadline := time.Now().Add(d); ; {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0
	}
}

// ---- the inner test: in the mount namespace ---------------------------

// debNS is the inner test's view: the host's files, read-only, and the
// overlays' upper layers (what the test wrote).
type debNS struct {
	Host, Upper string
	Overlaid    []string // the overlaid directories, without the leading /
	Removed     []string // what the test itself removed in the namespace
}

// debOverlay puts the overlays in place. It refuses to run unless this
// process is in a mount namespace of its own, where the mounts go with it.
func debOverlay(t *testing.T, dir string) debNS {
	t.Helper()
	self, err1 := os.Readlink("/proc/self/ns/mnt")
	parent, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid()))
	if err1 != nil || err2 != nil || self == parent {
		t.Fatalf("not in a mount namespace of its own (%s, parent %s; %v, %v): refusing to mount over /etc, /usr, /var and /run", self, parent, err1, err2)
	}
	ns := debNS{Host: filepath.Join(dir, "host"), Upper: filepath.Join(dir, "ovl", "upper")}
	ovl := filepath.Join(dir, "ovl")
	for _, d := range []string{ns.Host, ovl} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("tmpfs", ovl, "tmpfs", 0, "mode=0755"); err != nil {
		t.Fatalf("mount a tmpfs on %s: %v", ovl, err)
	}
	if err := unix.Mount("/", ns.Host, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		t.Fatalf("bind / on %s: %v", ns.Host, err)
	}
	if err := unix.Mount("", ns.Host, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("make %s read-only: %v", ns.Host, err)
	}
	dirs := []string{"etc", "usr", "var", "run"}
	for _, d := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"} {
		if st, err := os.Lstat("/" + d); err == nil && st.IsDir() {
			dirs = append(dirs, d)
		}
	}
	for _, d := range dirs {
		up, work := filepath.Join(ns.Upper, d), filepath.Join(ovl, "work", d)
		for _, p := range []string{up, work} {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		opts := fmt.Sprintf("lowerdir=/%s,upperdir=%s,workdir=%s", d, up, work)
		if err := unix.Mount("overlay", "/"+d, "overlay", 0, opts); err != nil {
			t.Fatalf("mount an overlay on /%s: %v", d, err)
		}
	}
	ns.Overlaid = dirs
	return ns
}

// debRun is the inner test's state, from step to step.
type debRun struct {
	dir    string
	ns     debNS
	v1, v2 debPair

	dev            harness.DevTree
	student, staff harness.TestUser
	shared         string // the users' shared directory, with the FIFOs started and gate
	markers        string // a file per npu in use, made exclusively by its holder
	procsBefore    map[string]string

	conf     string        // the administrator's npurun.conf
	first    int           // the broker's pid before the upgrade with systemd
	holder   *harness.Proc // staff's lease of npu 1, held over the upgrade
	taskID   uint64        // staff's task on npu 2, running over the upgrade
	taskLog  string
	startCmd string // the documented command that starts the broker without systemd
	pid      int    // the broker started so, without systemd
}

// debHandPAM is the PAM service of the administrator's that loads the
// module by a line of its own.
const debHandPAM = "/etc/pam.d/npurun-debtest"

// debInner is the package test proper, in the mount namespace.
func debInner(t *testing.T, dir string) {
	r := &debRun{dir: dir}
	debSteps(t, "in the namespace", []debStep{
		{"mount the overlays", r.overlay},
		{"find the packages", r.findPackages},
		{"the systemctl stand-in", r.standIn},
		{"users, devices and the shared directory", r.usersAndDirs},
		// 1. Install, without systemd: everything in place, nothing started.
		{"install without systemd", r.installNoSystemd},
		{"installed files, nothing started", r.checkInstalled},
		// 2. The administrator's configuration, and the broker started as
		// its unit says (here by the test: there is no systemd to do it).
		{"configure and start the broker", r.configureAndStart},
		{"npurun and npubroker as a user", r.useAsUser},
		{"a lease and a task held", r.holdLeaseAndTask},
		// 3. PAM.
		{"PAM", r.pam},
		// 4. Upgrade, with systemd.
		{"upgrade with systemd", r.upgradeWithSystemd},
		{"the lease and the task survive the upgrade", r.surviveUpgrade},
		{"the lease and the task end under the new broker", r.endUnderNewBroker},
		// 5. Purge, with systemd.
		{"purge with systemd", r.purgeWithSystemd},
		{"nothing left after the purge", r.purgeLeftNothing},
		// 6. Without systemd from install to purge.
		{"without systemd: install and start as documented", r.noSystemdInstall},
		{"without systemd: upgrade, the old broker runs on", r.noSystemdUpgrade},
		{"without systemd: a PAM line by hand refuses removal", r.noSystemdHandPAM},
		{"without systemd: NPURUN_REMOVE_FORCE=1 removes", r.noSystemdForceRemove},
		{"without systemd: an sshd ForceCommand refuses purge", r.noSystemdForceCommand},
		{"without systemd: purge", r.noSystemdPurge},
	})
}

// overlay puts the namespace's overlays in place.
func (r *debRun) overlay(t *testing.T) {
	r.ns = debOverlay(t, r.dir)
}

// findPackages finds the two builds' packages.
func (r *debRun) findPackages(t *testing.T) {
	r.v1 = debFind(t, filepath.Join(r.dir, "v1"))
	r.v2 = debFind(t, filepath.Join(r.dir, "v2"))
}

// standIn puts the systemctl stand-in in place of systemctl, so that no
// maintainer script reaches a systemd of the host's; no systemd running
// yet.
func (r *debRun) standIn(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, bin := range []string{"/usr/bin/systemctl", "/bin/systemctl"} {
		if err := os.Remove(bin); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if err := os.Symlink(self, bin); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
	// A policy-rc.d that forbids starting services (build images have one)
	// would keep the maintainer scripts from the units: the namespace is a
	// machine whose services its packages manage.
	r.ns.Removed = append([]string{"/run/systemd/system", standInDir, "/usr/sbin/policy-rc.d"}, debHidden...)
	for _, d := range r.ns.Removed {
		if err := os.RemoveAll(d); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(standInDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(standInDir, "host"), []byte(r.ns.Host), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if log, err := os.ReadFile(filepath.Join(standInDir, "broker.log")); err == nil {
				t.Logf("broker log:\n%s", debTail(log, 80))
			}
		}
		standInStop()
	})
}

// usersAndDirs makes the fake devices, the two users (student restricted,
// staff not), the shared directory with its FIFOs and markers, and notes
// the processes there are before the first install.
func (r *debRun) usersAndDirs(t *testing.T) {
	r.dev = harness.NewDevTree(t, 3)
	r.student, r.staff = harness.NewUser(t), harness.NewUser(t)
	student, staff := r.student, r.staff
	t.Cleanup(func() { debKillUsers(student.UID, staff.UID) }) // before userdel, should the test fail midway
	r.shared = harness.SharedDir(t)
	for _, name := range []string{"started", "gate"} {
		harness.MakeFIFO(t, filepath.Join(r.shared, name))
	}
	r.markers = filepath.Join(r.shared, "markers")
	if err := os.Mkdir(r.markers, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(r.markers, 0o777); err != nil {
		t.Fatal(err)
	}

	r.procsBefore = debProcs(t)
}

// installNoSystemd installs v1 without systemd: the install says the
// broker was not started and calls no systemctl verb that needs systemd.
func (r *debRun) installNoSystemd(t *testing.T) {
	out := debApt(t, "install", r.v1.Npurun, r.v1.PAM)
	if !strings.Contains(out, "npurun: systemd is not running: the broker was not started") {
		t.Errorf("the install without systemd did not say that the broker was not started:\n%s", out)
	}
	// (systemctl preset, which deb-systemd-helper uses to enable the units,
	// needs no running systemd; starting, stopping and reloading do.)
	t.Logf("the install's systemctl calls, without systemd: %q", standInCalls(t))
	for _, verb := range []string{"start", "stop", "restart", "try-restart", "reload-or-restart", "daemon-reload"} {
		for _, c := range standInCalls(t) {
			if v, _ := standInParse(strings.Fields(c)); v == verb {
				t.Errorf("without systemd, the maintainer scripts called systemctl %s", c)
			}
		}
	}
}

// checkInstalled: everything in place after the install, nothing started,
// the PAM profile off.
func (r *debRun) checkInstalled(t *testing.T) {
	for _, p := range []string{"/usr/bin/npurun", "/usr/bin/task-submit", "/usr/sbin/npubroker", "/usr/libexec/npurun/npurun-supervise", "/usr/libexec/npurun/npurun-runtime", "/usr/libexec/npurun/npurun-runtime-create", "/usr/share/man/man8/npurun-runtime.8.gz",
		"/usr/libexec/npurun/npurun-slurm", "/usr/lib/npurun/spank_npurun.so", "/usr/libexec/npurun/npurun-remove-check",
		"/lib/systemd/system/npubroker.service", "/lib/systemd/system/npubroker.socket", "/etc/npurun/npurun.conf",
		"/usr/share/pam-configs/npurun", "/usr/share/man/man8/pam_npurun.8.gz", "/usr/share/man/man1/npurun.1.gz",
		"/etc/systemd/system/sockets.target.wants/npubroker.socket", "/etc/systemd/system/multi-user.target.wants/npubroker.service",
		"/usr/sbin/npuboard", "/lib/systemd/system/npuboard.service", "/usr/share/man/man8/npuboard.8.gz", "/etc/systemd/system/multi-user.target.wants/npuboard.service",
		"/usr/share/bash-completion/completions/task-submit", "/usr/share/zsh/vendor-completions/_npurun", "/usr/share/fish/vendor_completions.d/npubroker.fish"} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("after the install: %v", err)
		}
	}
	// npuboard's system user, which its unit runs it as.
	if out, err := exec.Command("getent", "passwd", "npuboard").Output(); err != nil || !strings.Contains(string(out), ":/usr/sbin/nologin") {
		t.Errorf("no system user npuboard after the install (%v): %q", err, out)
	}
	if unit, err := os.ReadFile("/lib/systemd/system/npuboard.service"); err != nil || !strings.Contains(string(unit), "\nUser=npuboard\n") || !strings.Contains(string(unit), "\nExecStart=/usr/sbin/npuboard ") {
		t.Errorf("npuboard.service does not run /usr/sbin/npuboard as npuboard (%v):\n%s", err, unit)
	}
	if m, _ := filepath.Glob("/lib/*/security/pam_npurun.so"); len(m) != 1 {
		t.Errorf("the module is not in the multiarch security directory: %v", m)
	}
	for _, p := range debDocPaths(t) {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("the README or spank_npurun(8) names %s for slurm.conf or plugstack.conf, which the package does not install: %v", p, err)
		}
	}
	if st, err := os.Stat("/var/spool/npurun"); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("the spool: %v, %v; want a directory of mode 0700", st.Mode(), err)
	}
	if out, _ := exec.Command("dpkg-query", "-W", "-f", "${Conffiles}", "npurun").Output(); !strings.Contains(string(out), "/etc/npurun/npurun.conf ") {
		t.Errorf("npurun.conf is not a conffile: %q", out)
	}
	if _, err := os.Lstat("/run/npurun/broker.sock"); err == nil {
		t.Errorf("the broker's socket is there, with no systemd to start it")
	}
	if pids := debBrokers(t); len(pids) != 0 {
		t.Errorf("a broker runs after an install without systemd: %v", pids)
	}
	if out, _ := exec.Command("/usr/sbin/npubroker", "--version").Output(); strings.TrimSpace(string(out)) != "npubroker "+r.v1.Version {
		t.Errorf("npubroker --version: %q, want the package's version %s", out, r.v1.Version)
	}
	debNoModuleLine(t, "after the install (the profile is off by default)")
}

// configureAndStart writes the administrator's configuration and starts
// the broker as its unit says (here by the test: there is no systemd to
// do it).
func (r *debRun) configureAndStart(t *testing.T) {
	r.conf = r.dev.Config("0-2", fmt.Sprintf("[pools]\ninteractive = \"0\"\nqueue = \"1-2\"\n\n[tasks]\ncgroup = \"off\"\nkill_grace = \"1s\"\n\n[restrict]\nusers = [%q]\nlogin_pool = \"interactive\"\n", r.student.Name))
	if err := os.WriteFile("/etc/npurun/npurun.conf", []byte(r.conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("/usr/sbin/npubroker", "check-config").CombinedOutput(); err != nil {
		t.Fatalf("npubroker check-config: %v\n%s", err, out)
	}
	if out, err := exec.Command("/usr/bin/systemctl", "start", "npubroker.socket", "npubroker.service").CombinedOutput(); err != nil {
		t.Fatalf("start the broker as npubroker.service does: %v\n%s", err, out)
	}
	r.first = standInPid()
}

// useAsUser: an ordinary user's npurun and npubroker status on the default
// socket, and the package's bash completion.
func (r *debRun) useAsUser(t *testing.T) {
	staff := r.staff
	if code, out := harness.ExitCode(t, debAs(staff, "/usr/bin/npurun", "-d", "2", "--", "sh", "-c", `echo "dev=$NPURUN_DEVICES"`)); code != 0 || !strings.Contains(out, "dev=2") {
		t.Fatalf("npurun as %s: exit %d: %s", staff.Name, code, out)
	}
	if code, out := harness.ExitCode(t, debAs(staff, "/usr/sbin/npubroker", "status", "--json")); code != 0 || !json.Valid([]byte(out)) {
		t.Fatalf("npubroker status --json as %s: exit %d: %s", staff.Name, code, out)
	}
	// The package's bash completion offers the installed broker's pools.
	complete := `source /usr/share/bash-completion/completions/npurun && COMP_WORDS=(npurun -p "") COMP_CWORD=2 && _npurun && printf '%s\n' "${COMPREPLY[@]}"`
	if code, out := harness.ExitCode(t, debAs(staff, "/bin/bash", "-c", complete)); code != 0 || out != "interactive\nqueue\n" {
		t.Errorf("bash completing npurun -p as %s with the package's script: exit %d: %q, want the pools interactive and queue", staff.Name, code, out)
	}
}

// holdLeaseAndTask: staff holds a lease of npu 1 and runs a task on npu
// 2, both of which run on over the upgrade.
func (r *debRun) holdLeaseAndTask(t *testing.T) {
	staff, shared, markers := r.staff, r.shared, r.markers
	excl := `set -C; : > "$1/npu$NPURUN_DEVICES" || { echo "DOUBLE GRANT of npu $NPURUN_DEVICES"; exit 3; }; `
	r.holder = harness.StartProc(t, "lease holder", debAs(staff, "/usr/bin/npurun", "-d", "1", "--", "sh", "-c", excl+`echo held; read x; rm -f "$1/npu$NPURUN_DEVICES"`, "sh", markers))
	r.holder.WaitLine("held")
	staffDir := filepath.Join(shared, "staff")
	if err := os.Mkdir(staffDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(staffDir, int(staff.UID), int(staff.GID)); err != nil {
		t.Fatal(err)
	}
	r.taskLog = filepath.Join(staffDir, "task.log")
	code, out := harness.ExitCode(t, debAs(staff, "/usr/bin/task-submit", "--json", "-d", "2", "--log", r.taskLog, "--", "sh", "-c",
		excl+`echo "$NPURUN_DEVICES" > "$2"; read x < "$3"; rm -f "$1/npu$NPURUN_DEVICES"; echo "task done on $NPURUN_DEVICES"`,
		"sh", markers, filepath.Join(shared, "started"), filepath.Join(shared, "gate")))
	var submitted struct {
		ID uint64 `json:"id"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &submitted) != nil || submitted.ID == 0 {
		t.Fatalf("task-submit as %s: exit %d: %s", staff.Name, code, out)
	}
	r.taskID = submitted.ID
	if got := debReadFIFO(t, filepath.Join(shared, "started")); got != "2\n" {
		t.Fatalf("the task started with NPURUN_DEVICES=%q, want 2", got)
	}
	debBusy(t, staff, markers, 1, "before the upgrade")
	debBusy(t, staff, markers, 2, "before the upgrade")
}

// pam: off until enabled; then one line in common-session, which gives su
// -l (su-l) the login lease and marks su (su).
func (r *debRun) pam(t *testing.T) {
	student, staff := r.student, r.staff
	devNode := r.dev.Node("davinci0")
	if s := debSu(t, student, true, devNode); !strings.Contains(s, "devices=unset lease=unset") || !strings.Contains(s, "node closed") {
		t.Errorf("su -l before pam-auth-update --enable: want no PAM module at work:\n%s", s)
	}
	if out, err := exec.Command("pam-auth-update", "--enable", "npurun").CombinedOutput(); err != nil {
		t.Fatalf("pam-auth-update --enable npurun: %v\n%s", err, out)
	}
	debModuleLine(t, "after pam-auth-update --enable npurun")
	s := debSu(t, student, true, devNode)
	if !strings.Contains(s, "devices=0 lease=0:") || !strings.Contains(s, "node opened") {
		t.Errorf("su -l of restricted %s: want the login lease of npu 0, its node open to the user:\n%s", student.Name, s)
	}
	debFree(t, 0) // the session's end ended the lease
	if s := debSu(t, student, false, devNode); !strings.Contains(s, "devices= lease=unset") || !strings.Contains(s, "node closed") {
		t.Errorf("su (not -l) of restricted %s: want the session marked, devices hidden, no lease:\n%s", student.Name, s)
	}
	if s := debSu(t, staff, true, devNode); !strings.Contains(s, "devices=unset lease=unset") {
		t.Errorf("su -l of unrestricted %s: want the session left as it is:\n%s", staff.Name, s)
	}
}

// upgradeWithSystemd: the service restarts into the new broker, the
// socket is not stopped.
func (r *debRun) upgradeWithSystemd(t *testing.T) {
	if err := os.MkdirAll("/run/systemd/system", 0o755); err != nil {
		t.Fatal(err)
	}
	standInReset(t)
	out := debApt(t, "install", r.v2.Npurun, r.v2.PAM)
	calls := standInCalls(t)
	t.Logf("the upgrade's systemctl calls: %q", calls)
	if !debCalled(calls, "restart", "npubroker.service") {
		t.Errorf("the upgrade did not restart npubroker.service; systemctl calls: %q", calls)
	}
	for _, verb := range []string{"stop", "restart", "try-restart"} {
		if debCalled(calls, verb, "npubroker.socket") || (verb == "stop" && debCalled(calls, verb, "npubroker.service")) {
			t.Errorf("the upgrade called systemctl %s on the broker's units: %q", verb, calls)
		}
	}
	second := standInPid()
	if second == 0 || second == r.first {
		t.Fatalf("the broker after the upgrade: pid %d, before %d; want a new one. systemctl calls: %q\napt-get:\n%s", second, r.first, calls, out)
	}
	if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", second)); exe != "/usr/sbin/npubroker" {
		t.Errorf("the broker after the upgrade runs %q, want the new /usr/sbin/npubroker", exe)
	}
	if out, _ := exec.Command("/usr/sbin/npubroker", "--version").Output(); strings.TrimSpace(string(out)) != "npubroker "+r.v2.Version {
		t.Errorf("npubroker --version after the upgrade: %q, want %s", out, r.v2.Version)
	}
}

// surviveUpgrade: the lease and the task run on over the upgrade, the
// PAM line stays.
func (r *debRun) surviveUpgrade(t *testing.T) {
	staff, markers := r.staff, r.markers
	if r.holder.Exited() {
		t.Fatalf("the lease holder ended during the upgrade:\n%s", r.holder.Output())
	}
	debBusy(t, staff, markers, 1, "after the upgrade")
	debBusy(t, staff, markers, 2, "after the upgrade")
	if ti := debShow(t, staff, r.taskID); ti.State != "running" || len(ti.Devices) != 1 || ti.Devices[0] != 2 {
		t.Errorf("task %d after the upgrade: %+v, want running on npu 2", r.taskID, ti)
	}
	debModuleLine(t, "after the upgrade")
}

// endUnderNewBroker: the task and the lease end under the new broker,
// which frees their devices and records the task's success.
func (r *debRun) endUnderNewBroker(t *testing.T) {
	staff := r.staff
	debWriteFIFO(t, filepath.Join(r.shared, "gate"), "go\n")
	if code, out := harness.ExitCode(t, debAs(staff, "/usr/bin/task-submit", "wait", strconv.FormatUint(r.taskID, 10))); code != 0 {
		t.Errorf("task-submit wait %d after the upgrade: exit %d: %s", r.taskID, code, out)
	}
	if log, _ := os.ReadFile(r.taskLog); !strings.Contains(string(log), "task done on 2") {
		t.Errorf("the task's log: %q", log)
	}
	r.holder.Stdin.Close()
	r.holder.MustSucceed()
	debFree(t, 1)
	debFree(t, 2)
}

// purgeWithSystemd: the purge stops the broker's units, and no broker
// runs.
func (r *debRun) purgeWithSystemd(t *testing.T) {
	standInReset(t)
	debApt(t, "purge", "npurun", "libpam-npurun")
	calls := standInCalls(t)
	t.Logf("the purge's systemctl calls: %q", calls)
	for _, unit := range []string{"npubroker.service", "npubroker.socket"} {
		if !debCalled(calls, "stop", unit) {
			t.Errorf("the removal did not stop %s; systemctl calls: %q", unit, calls)
		}
	}
	if pids := debBrokers(t); len(pids) != 0 {
		t.Errorf("brokers still run after the purge: %v", pids)
	}
}

// purgeLeftNothing: the PAM line and every file of the packages gone, the
// spool and the run directory too, and no process left.
func (r *debRun) purgeLeftNothing(t *testing.T) {
	debNoModuleLine(t, "after the purge")
	for _, p := range []string{"/etc/pam.d/common-session", "/etc/pam.d/common-session-noninteractive"} {
		now, err1 := os.ReadFile(p)
		was, err2 := os.ReadFile(filepath.Join(r.ns.Host, p))
		if err1 != nil || err2 != nil || !bytes.Equal(now, was) {
			t.Errorf("%s after the purge is not what it was (%v, %v):\n%s\nwas:\n%s", p, err1, err2, now, was)
		}
	}
	for _, p := range []string{"/etc/npurun", "/var/spool/npurun", "/run/npurun", "/usr/libexec/npurun", "/usr/share/pam-configs/npurun",
		"/etc/systemd/system/sockets.target.wants/npubroker.socket", "/etc/systemd/system/multi-user.target.wants/npubroker.service",
		"/etc/systemd/system/multi-user.target.wants/npuboard.service", "/usr/sbin/npuboard"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s is still there after the purge", p)
		}
	}
	if out, _ := exec.Command("dpkg-query", "-W", "-f", "${db:Status-Status}", "npurun", "libpam-npurun").Output(); strings.Contains(string(out), "installed") || strings.Contains(string(out), "config-files") {
		t.Errorf("dpkg after the purge: %q", out)
	}
	debAudit(t, r.ns)
	debProcsLeft(t, r.procsBefore, "after the purge")
}

// The steps noSystemd*: without systemd from install to purge (issue 27,
// items 11, 12 and 14): the broker started as npubroker(8) and the README
// say, its log where they say, an upgrade that says the truth of the
// broker that runs, a removal refused while a PAM file or an sshd
// ForceCommand of the administrator's needs what it removes, and a purge
// that stops the broker and leaves the machine as it was, file by file and
// process by process.

// noSystemdInstall installs v1 without systemd, which says how to start
// the broker, and starts it so.
func (r *debRun) noSystemdInstall(t *testing.T) {
	if err := os.RemoveAll("/run/systemd/system"); err != nil {
		t.Fatal(err)
	}
	standInReset(t)
	out := debApt(t, "install", r.v1.Npurun, r.v1.PAM)
	r.startCmd = debNoSystemdCommand(t)
	if !strings.Contains(out, "npurun: systemd is not running: the broker was not started; start it as root: "+r.startCmd) {
		t.Errorf("the install without systemd did not say how to start the broker (%q):\n%s", r.startCmd, out)
	}
	if err := os.WriteFile("/etc/npurun/npurun.conf", []byte(r.conf), 0o644); err != nil {
		t.Fatal(err)
	}
	r.pid = debStartDocumented(t, r.startCmd, 1)
	debFree(t, 0)
	if _, err := os.Stat("/run/npurun-devices"); err != nil {
		t.Errorf("the broker claims no device in /run/npurun-devices: %v", err)
	}
}

// noSystemdUpgrade: the upgrade leaves that broker running, the previous
// version, and says so; restarted as the message says, the new one runs.
func (r *debRun) noSystemdUpgrade(t *testing.T) {
	pid := r.pid
	out := debApt(t, "install", r.v2.Npurun, r.v2.PAM)
	if want := fmt.Sprintf("npurun: systemd is not running: the broker that runs (pid %d) is still the previous version's; restart it to run this one: kill %d", pid, pid); !strings.Contains(out, want) {
		t.Errorf("the upgrade without systemd did not say %q:\n%s", want, out)
	}
	if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); exe != "/usr/sbin/npubroker (deleted)" {
		t.Errorf("after the upgrade, the broker %d runs %q, want the previous version's (deleted) program", pid, exe)
	}
	syscall.Kill(pid, syscall.SIGTERM)
	if !debAwaitExit(pid, harness.EventTimeout) {
		t.Fatalf("the broker %d did not stop on SIGTERM", pid)
	}
	r.pid = debStartDocumented(t, r.startCmd, 2)
	if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", r.pid)); exe != "/usr/sbin/npubroker" {
		t.Errorf("the restarted broker runs %q, want the new /usr/sbin/npubroker", exe)
	}
	debFree(t, 0)
}

// noSystemdHandPAM: a PAM line added by hand (as the README allowed before
// the package) and the profile's own: removing libpam-npurun is refused,
// naming the hand's line and not the profile's; nothing changes.
func (r *debRun) noSystemdHandPAM(t *testing.T) {
	if out, err := exec.Command("pam-auth-update", "--enable", "npurun").CombinedOutput(); err != nil {
		t.Fatalf("pam-auth-update --enable npurun: %v\n%s", err, out)
	}
	handPAM := debHandPAM
	if err := os.WriteFile(handPAM, []byte("# a service of the administrator's\nsession required pam_npurun.so\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := debAptErr("remove", "libpam-npurun")
	if err == nil {
		t.Errorf("apt-get remove libpam-npurun went ahead while %s loads the module:\n%s", handPAM, out)
	}
	for _, want := range []string{"libpam-npurun: PAM loads pam_npurun.so here", handPAM + ":2: session required pam_npurun.so", "libpam-npurun: hint: ", "NPURUN_REMOVE_FORCE=1"} {
		if !strings.Contains(out, want) {
			t.Errorf("the refused removal of libpam-npurun does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "common-session") {
		t.Errorf("the refused removal named common-session, whose line is the profile's:\n%s", out)
	}
	if m, _ := filepath.Glob("/lib/*/security/pam_npurun.so"); len(m) != 1 {
		t.Errorf("the refused removal removed the module: %v", m)
	}
	debModuleLine(t, "after the refused removal")
}

// noSystemdForceRemove: NPURUN_REMOVE_FORCE=1: removed all the same, the
// lines named.
func (r *debRun) noSystemdForceRemove(t *testing.T) {
	handPAM := debHandPAM
	out, err := debAptErr("remove", "libpam-npurun", "NPURUN_REMOVE_FORCE=1")
	if err != nil || !strings.Contains(out, "libpam-npurun: warning: PAM loads pam_npurun.so here") || !strings.Contains(out, handPAM+":2:") {
		t.Errorf("NPURUN_REMOVE_FORCE=1 apt-get remove libpam-npurun: %v, want it removed with a warning naming %s:\n%s", err, handPAM, out)
	}
	if m, _ := filepath.Glob("/lib/*/security/pam_npurun.so"); len(m) != 0 {
		t.Errorf("the forced removal left the module: %v", m)
	}
	if err := os.Remove(handPAM); err != nil {
		t.Fatal(err)
	}
	debNoModuleLine(t, "after the removal of libpam-npurun")
}

// noSystemdForceCommand: an sshd ForceCommand that runs npurun: purging
// npurun is refused, naming it, and the broker runs on; then the
// ForceCommand goes.
func (r *debRun) noSystemdForceCommand(t *testing.T) {
	snippet := "/etc/ssh/sshd_config.d/npurun.conf"
	if err := os.MkdirAll(filepath.Dir(snippet), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(snippet, []byte(fmt.Sprintf("Match User %s\n    ForceCommand /usr/bin/npurun --login\n", r.student.Name)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := debAptErr("purge", "npurun", "libpam-npurun")
	if err == nil {
		t.Errorf("apt-get purge npurun went ahead while %s runs npurun:\n%s", snippet, out)
	}
	for _, want := range []string{"npurun: sshd runs /usr/bin/npurun for these accounts (ForceCommand)", snippet + ":2:     ForceCommand /usr/bin/npurun --login", "NPURUN_REMOVE_FORCE=1"} {
		if !strings.Contains(out, want) {
			t.Errorf("the refused purge of npurun does not say %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat("/usr/bin/npurun"); err != nil {
		t.Errorf("the refused purge removed npurun: %v", err)
	}
	if !slices.Contains(debBrokers(t), r.pid) {
		t.Errorf("the refused purge stopped the broker %d", r.pid)
	}
	if err := os.Remove(snippet); err != nil {
		t.Fatal(err)
	}
}

// noSystemdPurge: with the ForceCommand out, the purge stops the
// broker and removes the device claims and the log, and leaves the
// machine as it was.
func (r *debRun) noSystemdPurge(t *testing.T) {
	out := debApt(t, "purge", "npurun", "libpam-npurun")
	if want := fmt.Sprintf("npurun: stopping the broker (pid %d), which systemd does not run", r.pid); !strings.Contains(out, want) {
		t.Errorf("the purge without systemd did not say %q:\n%s", want, out)
	}
	if pids := debBrokers(t); len(pids) != 0 {
		t.Errorf("brokers still run after the purge without systemd: %v", pids)
	}
	for _, p := range []string{"/run/npurun", "/run/npurun-devices", "/var/log/npubroker.log", "/etc/npurun", "/usr/libexec/npurun", "/usr/lib/npurun"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s is still there after the purge without systemd", p)
		}
	}
	debNoModuleLine(t, "after the purge without systemd")
	debAudit(t, r.ns)
	debProcsLeft(t, r.procsBefore, "after the purge without systemd")
}

// debNoSystemdCommand is the command that npubroker(8)'s WITHOUT SYSTEMD
// and the README give to start the broker without systemd: the same in
// both, or the test fails.
func debNoSystemdCommand(t *testing.T) string {
	t.Helper()
	man, err := os.ReadFile(filepath.Join(harness.Root(), "man", "npubroker.8"))
	if err != nil {
		t.Fatal(err)
	}
	var fromMan string
	_, sec, _ := strings.Cut(string(man), "\n.SH WITHOUT SYSTEMD\n")
	if _, ex, ok := strings.Cut(sec, "\n.EX\n"); ok {
		fromMan, _, _ = strings.Cut(ex, "\n")
		fromMan = strings.ReplaceAll(fromMan, `\-`, "-")
	}
	readme, err := os.ReadFile(filepath.Join(harness.Root(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var fromReadme string
	for _, line := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(line, "setsid npubroker serve ") {
			fromReadme = strings.TrimSpace(harness.DocComment.ReplaceAllString(line, ""))
		}
	}
	if fromMan == "" || fromMan != fromReadme {
		t.Fatalf("the command without systemd: npubroker(8) says %q, the README %q; want one command", fromMan, fromReadme)
	}
	return fromMan
}

// debStartDocumented runs the documented command, as root, and returns
// the broker's pid once its log has the documented line for the nth time
// (an inotify event on the log's directory, not a guess).
func debStartDocumented(t *testing.T, command string, nth int) int {
	t.Helper()
	const logFile = "/var/log/npubroker.log"
	if !strings.Contains(command, ">>"+logFile+" ") {
		t.Fatalf("the documented command %q does not log to %s", command, logFile)
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, filepath.Dir(logFile), unix.IN_CREATE|unix.IN_MODIFY); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", command)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}
	cmd.Dir = "/"
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", command, err, out)
	}
	serving := regexp.MustCompile(`(?m)^npubroker: serving \S+ npu \S+ on /run/npurun/broker\.sock$`)
	buf := make([]byte, 4096)
	for deadline := time.Now().Add(harness.EventTimeout); ; {
		data, _ := os.ReadFile(logFile)
		if len(serving.FindAll(data, -1)) >= nth {
			break
		}
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatalf("%s has no line \"npubroker: serving ...\" (the %d. start) within %s:\n%s", logFile, nth, harness.EventTimeout, data)
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		unix.Poll(fds, int(left.Milliseconds())+1)
		unix.Read(fd, buf)
	}
	data, err := os.ReadFile("/run/npurun/broker.pid")
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 || !slices.Contains(debBrokers(t), pid) {
		t.Fatalf("/run/npurun/broker.pid: %q, %v; brokers running: %v", data, err, debBrokers(t))
	}
	return pid
}

// debAptErr is debApt that returns the failure; an argument KEY=VALUE
// goes into apt-get's environment (which the maintainer scripts inherit).
func debAptErr(action string, args ...string) (string, error) {
	env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	var pkgs []string
	for _, a := range args {
		if strings.Contains(a, "=") {
			env = append(env, a)
		} else {
			pkgs = append(pkgs, a)
		}
	}
	cmd := exec.Command("apt-get", append([]string{action, "-y", "--no-install-recommends", "-o", "Dpkg::Options::=--force-confold"}, pkgs...)...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// debProcs are the processes in this mount namespace but this one (and
// zombies), by pid and start time, with what they run.
func debProcs(t *testing.T) map[string]string {
	t.Helper()
	own, _ := os.Readlink("/proc/self/ns/mnt")
	procs := map[string]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err != nil || ns != own {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		_, rest, _ := strings.Cut(string(stat), ") ")
		f := strings.Fields(rest)
		if len(f) < 20 || f[0] == "Z" {
			continue
		}
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		procs[strconv.Itoa(pid)+"/"+f[19]] = fmt.Sprintf("pid %d %s (%s)", pid, exe, strings.ReplaceAll(strings.TrimRight(string(cmdline), "\x00"), "\x00", " "))
	}
	return procs
}

// debProcsLeft fails the test for each process in this namespace that was
// not there before the first install.
func debProcsLeft(t *testing.T, before map[string]string, when string) {
	t.Helper()
	var left []string
	for k, p := range debProcs(t) {
		if _, ok := before[k]; !ok {
			left = append(left, p)
		}
	}
	slices.Sort(left)
	if len(left) > 0 {
		t.Errorf("%s, processes that were not there before the install run:\n  %s", when, strings.Join(left, "\n  "))
	}
}

// debFind is a build's packages, in the inner test.
func debFind(t *testing.T, dir string) debPair {
	t.Helper()
	p := debPair{Dir: dir}
	for _, f := range []*string{&p.Npurun, &p.PAM} {
		pattern := "npurun_*.deb"
		if f == &p.PAM {
			pattern = "libpam-npurun_*.deb"
		}
		m, _ := filepath.Glob(filepath.Join(dir, pattern))
		if len(m) != 1 {
			t.Fatalf("%s in %s: %v", pattern, dir, m)
		}
		*f = m[0]
	}
	v, err := exec.Command("dpkg-deb", "-f", p.Npurun, "Version").Output()
	if err != nil {
		t.Fatal(err)
	}
	p.Version = strings.TrimSpace(string(v))
	return p
}

// debApt runs apt-get ACTION -y ARGS (package files as ./paths) and
// returns its output; a failure fails the test.
func debApt(t *testing.T, action string, args ...string) string {
	t.Helper()
	cmd := exec.Command("apt-get", append([]string{action, "-y", "--no-install-recommends", "-o", "Dpkg::Options::=--force-confold"}, args...)...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	cmd.Stdin = nil
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("apt-get %s %s: %v\n%s", action, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// debAs is a command of u's with a plain environment: no NPURUN_SOCKET,
// so the programs use the default socket.
func debAs(u harness.TestUser, name string, args ...string) *exec.Cmd {
	cmd := u.As(exec.Command(name, args...), "/")
	cmd.Env = []string{"PATH=/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/", "LANG=C.UTF-8", "USER=" + u.Name}
	return cmd
}

// debSu opens a real PAM session of u with su (-l: the PAM service su-l,
// else su), as root, and returns what the session's shell saw: its
// variables and whether the device node opens.
func debSu(t *testing.T, u harness.TestUser, login bool, node string) string {
	t.Helper()
	script := fmt.Sprintf(`echo "devices=${NPURUN_DEVICES-unset} lease=${NPURUN_LEASE-unset}"; if (exec 3<>%s) 2>/dev/null; then echo "node opened"; else echo "node closed"; fi`, node)
	args := []string{"-s", "/bin/sh", "-c", script, u.Name}
	if login {
		args = append([]string{"-l"}, args...)
	}
	cmd := exec.Command("su", args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin:/usr/sbin:/sbin", "LANG=C.UTF-8"}
	code, out := harness.ExitCode(t, cmd)
	if code != 0 {
		t.Fatalf("su %s: exit %d:\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

// debModuleLine: common-session has the profile's line, and
// common-session-noninteractive has not (Session-Interactive-Only).
func debModuleLine(t *testing.T, when string) {
	t.Helper()
	cs, _ := os.ReadFile("/etc/pam.d/common-session")
	if !regexp.MustCompile(`(?m)^session\s+required\s+pam_npurun\.so lease_services=login,su-l\s*$`).Match(cs) {
		t.Errorf("%s, /etc/pam.d/common-session has no pam_npurun line:\n%s", when, cs)
	}
	if ni, _ := os.ReadFile("/etc/pam.d/common-session-noninteractive"); bytes.Contains(ni, []byte("pam_npurun")) {
		t.Errorf("%s, common-session-noninteractive names pam_npurun:\n%s", when, ni)
	}
}

func debNoModuleLine(t *testing.T, when string) {
	t.Helper()
	out, _ := exec.Command("grep", "-rn", "pam_npurun", "/etc/pam.d").CombinedOutput()
	if len(out) > 0 {
		t.Errorf("%s, /etc/pam.d names pam_npurun:\n%s", when, out)
	}
}

// debBusy: npu id is not granted to another (npurun --no-wait fails with
// 75), and had it been, the O_EXCL marker of the holder would have said so.
func debBusy(t *testing.T, u harness.TestUser, markers string, id int, when string) {
	t.Helper()
	code, out := harness.ExitCode(t, debAs(u, "/usr/bin/npurun", "--no-wait", "-d", strconv.Itoa(id), "--", "sh", "-c",
		`set -C; : > "$1/npu$NPURUN_DEVICES" || { echo "DOUBLE GRANT of npu $NPURUN_DEVICES"; exit 3; }; rm -f "$1/npu$NPURUN_DEVICES"`, "sh", markers))
	if code != 75 {
		t.Errorf("%s, npurun --no-wait -d %d: exit %d, want 75 (busy): %s", when, id, code, out)
	}
}

// debFree returns once npu id is granted again (to root), within
// EventTimeout.
func debFree(t *testing.T, id int) {
	t.Helper()
	cmd := exec.Command("/usr/bin/npurun", "-d", strconv.Itoa(id), "--timeout", harness.EventTimeout.String(), "true")
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	if code, out := harness.ExitCode(t, cmd); code != 0 {
		t.Fatalf("npu %d did not come free: exit %d: %s", id, code, out)
	}
}

func debShow(t *testing.T, u harness.TestUser, id uint64) wire.TaskInfo {
	t.Helper()
	code, out := harness.ExitCode(t, debAs(u, "/usr/bin/task-submit", "show", "--json", strconv.FormatUint(id, 10)))
	var ti wire.TaskInfo
	if code != 0 || json.Unmarshal([]byte(out), &ti) != nil {
		t.Fatalf("task-submit show --json %d: exit %d: %s", id, code, out)
	}
	return ti
}

// debReadFIFO reads what the writer of the named pipe p writes, waiting
// for it to open the pipe (an event) up to EventTimeout.
func debReadFIFO(t *testing.T, p string) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		data, _ := os.ReadFile(p)
		got <- string(data)
	}()
	select {
	case s := <-got:
		return s
	case <-time.After(harness.EventTimeout):
		os.WriteFile(p, nil, 0) // let the reader go
		t.Fatalf("nothing came through %s within %s", p, harness.EventTimeout)
		return ""
	}
}

// debWriteFIFO writes s to the named pipe p once its reader has it open.
func debWriteFIFO(t *testing.T, p, s string) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- os.WriteFile(p, []byte(s), 0) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(harness.EventTimeout):
		t.Fatalf("nobody read %s within %s", p, harness.EventTimeout)
	}
}

// debKillUsers kills every process of these uids.
func debKillUsers(uids ...uint32) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(fmt.Sprintf("/proc/%d", pid), &st) == nil && slices.Contains(uids, st.Uid) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// debBrokers are the processes running the installed broker (deleted or
// not).
func debBrokers(t *testing.T) []int {
	t.Helper()
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && strings.HasPrefix(exe, "/usr/sbin/npubroker") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// debCalled tells whether the systemctl calls include verb on unit.
func debCalled(calls []string, verb, unit string) bool {
	for _, c := range calls {
		v, units := standInParse(strings.Fields(c))
		if v != verb {
			continue
		}
		for _, u := range units {
			if u == unit {
				return true
			}
		}
	}
	return false
}

// debBookkeeping are the files that apt, dpkg, pam-auth-update and the
// test itself (its users, the systemctl stand-in) may leave changed in the
// overlays: none of them the packages'.
var debBookkeeping = regexp.MustCompile(`^(` + strings.Join([]string{
	`etc/(passwd|group|shadow|gshadow|subuid|subgid)-?`, `etc/\.pwd\.lock`, `etc/ld\.so\.cache`,
	`var/lib/dpkg/.*`, `var/lib/apt/.*`, `var/cache/(apt|debconf|man|ldconfig)/.*`, `var/log/.*`,
	`(usr/)?bin/systemctl`, `run/.*`,
}, "|") + `)$`)

// debLeftover are what the packages' programs make outside the packages'
// files, in trees that debBookkeeping passes over: the purge removes them
// (the run directory, the device claims, the log of a broker without
// systemd).
var debLeftover = regexp.MustCompile(`^(run/npurun|run/npurun-devices|var/log/npubroker\.log.*)$`)

// debSystemdDirs are directories that enabling a unit makes, and that may
// stay behind, empty, when the units are purged.
var debSystemdDirs = regexp.MustCompile(`^(etc/systemd/system/[^/]+\.wants|etc/systemd/system|var/lib/systemd(/deb-systemd-helper-[^/]+(/.*)?)?)$`)

// debAudit compares what the purge left in the overlays' upper layers with
// the host's files: a file there that is not bookkeeping must be the
// host's, byte for byte (copied up, not changed); a directory must be the
// host's too; a file the host has must not have been removed.
func debAudit(t *testing.T, ns debNS) {
	t.Helper()
	var left []string
	filepath.WalkDir(ns.Upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == ns.Upper {
			return err
		}
		rel, _ := filepath.Rel(ns.Upper, p)
		if debLeftover.MatchString(rel) && !slices.Contains(ns.Removed, "/"+rel) {
			if st, err := os.Lstat(filepath.Join(ns.Host, rel)); err != nil || !st.IsDir() {
				left = append(left, "/"+rel+" (the packages', left behind)")
				return fs.SkipDir
			}
		}
		if debBookkeeping.MatchString(rel) {
			return nil
		}
		host := filepath.Join(ns.Host, rel)
		hst, herr := os.Lstat(host)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case info.Mode()&fs.ModeCharDevice != 0 && info.Sys().(*syscall.Stat_t).Rdev == 0:
			if !slices.Contains(ns.Removed, "/"+rel) {
				left = append(left, "/"+rel+" (removed, and the host has it)")
			}
		case d.IsDir():
			if herr != nil || !hst.IsDir() {
				if entries, err := os.ReadDir(p); err == nil && len(entries) == 0 && debSystemdDirs.MatchString(rel) {
					return nil // an empty directory of enable links, or of deb-systemd-helper's state
				}
				left = append(left, "/"+rel+"/ (a directory the host has not)")
				return fs.SkipDir
			}
		case herr != nil:
			left = append(left, "/"+rel+" (a file the host has not)")
		case info.Mode().Type() == fs.ModeSymlink:
			a, _ := os.Readlink(p)
			b, _ := os.Readlink(host)
			if a != b {
				left = append(left, "/"+rel+" (a changed link)")
			}
		default:
			a, _ := os.ReadFile(p)
			b, _ := os.ReadFile(host)
			if !bytes.Equal(a, b) {
				left = append(left, "/"+rel+" (changed)")
			}
		}
		return nil
	})
	if len(left) > 0 {
		t.Errorf("after the purge, in the overlaid %v:\n  %s", ns.Overlaid, strings.Join(left, "\n  "))
	}
}

// ---- the systemctl stand-in ----------------------------------------------

// standInParse splits systemctl's arguments into the verb and the units.
func standInParse(args []string) (string, []string) {
	var verb string
	var units []string
	for _, a := range args {
		switch {
		case strings.HasPrefix(a, "-"):
		case verb == "":
			verb = a
		default:
			units = append(units, a)
		}
	}
	return verb, units
}

func standInCalls(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(standInDir, "calls"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	s := strings.TrimSpace(string(data))
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func standInReset(t *testing.T) {
	t.Helper()
	if err := os.Remove(filepath.Join(standInDir, "calls")); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
}

// standInSystemctl is systemctl for the maintainer scripts: it records
// the call and does what systemd would for npubroker.service; the socket
// unit is a flag only (the broker listens itself without socket
// activation).
func standInSystemctl(args []string) int {
	f, err := os.OpenFile(filepath.Join(standInDir, "calls"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "systemctl (the package test's stand-in):", err)
		return 1
	}
	fmt.Fprintln(f, strings.Join(args, " "))
	f.Close()
	verb, units := standInParse(args)
	switch verb {
	case "preset", "enable", "disable", "reenable", "is-enabled", "mask", "unmask":
		return standInInstall(args, verb, units)
	}
	code := 0
	for _, unit := range units {
		var err error
		switch verb {
		case "is-active":
			if !standInActive(unit) {
				code = 3
			}
		case "start":
			err = standInStart(unit)
		case "stop":
			err = standInUnitStop(unit)
		case "restart", "try-restart", "reload-or-restart":
			if verb == "try-restart" && !standInActive(unit) {
				continue
			}
			if err = standInUnitStop(unit); err == nil {
				err = standInStart(unit)
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "systemctl (stand-in) %s %s: %v\n", verb, unit, err)
			code = 1
		}
	}
	return code
}

// standInInstall does what systemctl does to unit files, which needs no
// running systemd: with the host's systemctl (from the read-only view of
// the host, working on this namespace's files, client-side: --root=/),
// else by the units' [Install] WantedBy= alone.
func standInInstall(args []string, verb string, units []string) int {
	if host, err := os.ReadFile(filepath.Join(standInDir, "host")); err == nil {
		real := filepath.Join(string(host), "usr/bin/systemctl")
		if _, err := os.Stat(real); err == nil {
			if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--root") }) {
				args = append([]string{"--root=/"}, args...)
			}
			cmd := exec.Command(real, args...)
			cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
			if err := cmd.Run(); err != nil {
				if ee, ok := err.(*exec.ExitError); ok {
					return ee.ExitCode()
				}
				fmt.Fprintln(os.Stderr, "systemctl (stand-in):", err)
				return 1
			}
			return 0
		}
	}
	code := 0
	for _, unit := range units {
		text, err := os.ReadFile("/lib/systemd/system/" + unit)
		if err != nil {
			fmt.Fprintln(os.Stderr, "systemctl (stand-in):", err)
			code = 1
			continue
		}
		var links []string
		for _, line := range strings.Split(string(text), "\n") {
			if v, ok := strings.CutPrefix(line, "WantedBy="); ok {
				for _, target := range strings.Fields(v) {
					links = append(links, "/etc/systemd/system/"+target+".wants/"+unit)
				}
			}
		}
		switch verb {
		case "preset", "enable", "reenable":
			for _, l := range links {
				os.MkdirAll(filepath.Dir(l), 0o755)
				os.Symlink("/lib/systemd/system/"+unit, l)
			}
		case "disable":
			for _, l := range links {
				os.Remove(l)
			}
		case "is-enabled":
			state := "disabled"
			for _, l := range links {
				if _, err := os.Lstat(l); err == nil {
					state = "enabled"
				}
			}
			fmt.Println(state)
			if state != "enabled" {
				code = 1
			}
		}
	}
	return code
}

func standInActive(unit string) bool {
	if unit == "npubroker.service" {
		return standInPid() != 0
	}
	_, err := os.Stat(filepath.Join(standInDir, unit))
	return err == nil
}

func standInUnitStop(unit string) error {
	if unit == "npubroker.service" {
		return standInStop()
	}
	os.Remove(filepath.Join(standInDir, unit))
	return nil
}

// standInPid is the running broker's pid, 0 if none.
func standInPid() int {
	data, err := os.ReadFile(filepath.Join(standInDir, "npubroker.service.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return 0
	}
	if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil || strings.Contains(string(stat), ") Z ") {
		return 0
	}
	return pid
}

// standInStart starts the unit's ExecStart= in a session of its own, its
// output to broker.log, and returns once it has sent READY=1.
func standInStart(unit string) error {
	if unit != "npubroker.service" {
		return os.WriteFile(filepath.Join(standInDir, unit), nil, 0o644)
	}
	if standInPid() != 0 {
		return nil
	}
	text, err := os.ReadFile("/lib/systemd/system/npubroker.service")
	if err != nil {
		return err
	}
	var argv []string
	for _, line := range strings.Split(string(text), "\n") {
		if v, ok := strings.CutPrefix(line, "ExecStart="); ok {
			argv = strings.Fields(v)
		}
	}
	if len(argv) == 0 {
		return fmt.Errorf("no ExecStart= in npubroker.service")
	}
	notify := filepath.Join(standInDir, "notify")
	os.Remove(notify)
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notify, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer conn.Close()
	log, err := os.OpenFile(filepath.Join(standInDir, "broker.log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "NOTIFY_SOCKET=" + notify}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	pid := cmd.Process.Pid
	if err := os.WriteFile(filepath.Join(standInDir, "npubroker.service.pid"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	ready := make(chan error, 1)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				ready <- err
				return
			}
			if strings.Contains("\n"+string(buf[:n])+"\n", "\nREADY=1\n") {
				ready <- nil
				return
			}
		}
	}()
	select {
	case err := <-ready:
		return err
	case err := <-exited:
		return fmt.Errorf("%s exited before READY=1: %v (see %s)", argv[0], err, log.Name())
	case <-time.After(harness.EventTimeout):
		return fmt.Errorf("%s sent no READY=1 within %s", argv[0], harness.EventTimeout)
	}
}

// standInStop ends the broker as systemd stops a unit of KillMode=process:
// SIGTERM to the main process alone, SIGKILL if it has not exited in time.
func standInStop() error {
	pid := standInPid()
	if pid == 0 {
		return nil
	}
	syscall.Kill(pid, syscall.SIGTERM)
	if !debAwaitExit(pid, harness.EventTimeout) {
		syscall.Kill(pid, syscall.SIGKILL)
		if !debAwaitExit(pid, harness.EventTimeout) {
			return fmt.Errorf("broker %d survives SIGKILL", pid)
		}
	}
	return os.Remove(filepath.Join(standInDir, "npubroker.service.pid"))
}
