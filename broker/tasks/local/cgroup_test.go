package local

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestCgroup2Mount(t *testing.T) {
	tests := []struct {
		name, mountinfo string
		mnt, root       string
		wantErr         bool
	}{
		{"hybrid", `30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`, "/sys/fs/cgroup/unified", "/", false},
		{"unified, optional fields", `35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
`, "/sys/fs/cgroup", "/", false},
		{"escaped, a namespace's root", `35 24 0:30 /system.slice /mnt/my\040groups rw - cgroup2 none rw
`, "/mnt/my groups", "/system.slice", false},
		{"none", `31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
`, "", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "mountinfo")
			if err := os.WriteFile(p, []byte(tt.mountinfo), 0o644); err != nil {
				t.Fatal(err)
			}
			mnt, root, err := cgroup2Mount(p)
			if (err != nil) != tt.wantErr || mnt != tt.mnt || root != tt.root {
				t.Errorf("cgroup2Mount = %q, %q, %v; want %q, %q, error %v", mnt, root, err, tt.mnt, tt.root, tt.wantErr)
			}
		})
	}
}

// TestSetupCgroupsRefuses: a directory named for the tasks' control groups
// that cannot hold them stops the broker, naming why; off is off.
func TestSetupCgroupsRefuses(t *testing.T) {
	lg := log.New(io.Discard, "", 0)
	if cg, err := setupCgroups("off", "/var/spool/npurun", lg); cg != nil || err != nil {
		t.Errorf("off: %v, %v; want none and no error", cg, err)
	}
	dir := t.TempDir()
	cg, err := setupCgroups(dir, "/var/spool/npurun", lg)
	want := "not on the cgroup v2 file system"
	if os.Geteuid() != 0 {
		want = "not root"
	}
	if cg != nil || err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a directory of %s: %v, %v; want an error saying %q", dir, cg, err, want)
	}
}

// TestAutoParent: where "auto" puts the tasks' groups, and whether the
// broker must first move into a leaf of its own group (and so hand no
// controller down from it: the next broker is started there too).
func TestAutoParent(t *testing.T) {
	mnt := t.TempDir()
	tests := []struct {
		name, root, own   string
		parent, leaf, err string
	}{
		{"root group: a group of its own", "/", "/", mnt + "/npurun", "", ""},
		{"DelegateSubgroup=broker", "/", "/system.slice/npubroker.service/broker", mnt + "/system.slice/npubroker.service", "", ""},
		{"systemd < 254: started in the service's group", "/", "/system.slice/npubroker.service", mnt + "/system.slice/npubroker.service", mnt + "/system.slice/npubroker.service/broker", ""},
		{"a namespace's root", "/system.slice", "/system.slice/x.service", mnt + "/x.service", mnt + "/x.service/broker", ""},
		{"outside the mount", "/system.slice", "/user.slice/x", "", "", "not below the cgroup2 mount"},
		{"a sibling whose name goes on from the root's", "/system.slice", "/system.sliceX/x.service", "", "", "not below the cgroup2 mount"},
		{"a sibling named root-something", "/foo", "/foo-bar/x", "", "", "not below the cgroup2 mount"},
		{"a namespace's root, with a slash", "/system.slice/", "/system.slice/x.service", mnt + "/x.service", mnt + "/x.service/broker", ""},
		{"in a namespace's root itself", "/system.slice", "/system.slice", mnt + "/npurun", "", ""},
		{"deleted", "/", "/x (deleted)", "", "", "not below the cgroup2 mount"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parent, leaf, err := autoParent(mnt, tt.root, tt.own)
			if parent != tt.parent || leaf != tt.leaf || (err == nil) != (tt.err == "") || (err != nil && !strings.Contains(err.Error(), tt.err)) {
				t.Errorf("autoParent(%q, %q) = %q, %q, %v; want %q, %q, error %q", tt.root, tt.own, parent, leaf, err, tt.parent, tt.leaf, tt.err)
			}
		})
	}
}

// TestGroupBelow: a group is below another component by component, never
// by a string prefix.
func TestGroupBelow(t *testing.T) {
	tests := []struct {
		p, root, rel string
		ok           bool
	}{
		{"/", "/", "", true},
		{"/a/b", "/", "a/b", true},
		{"/foo", "/foo", "", true},
		{"/foo/", "/foo", "", true},
		{"/foo/bar", "/foo", "bar", true},
		{"/foo/bar/baz", "/foo/", "bar/baz", true},
		{"/foo-bar", "/foo", "", false},
		{"/foo-bar/x", "/foo", "", false},
		{"/system.sliceX/y", "/system.slice", "", false},
		{"/fo", "/foo", "", false},
		{"/", "/foo", "", false},
		{"/bar/foo", "/foo", "", false},
	}
	for _, tt := range tests {
		rel, ok := groupBelow(tt.p, tt.root)
		if rel != tt.rel || ok != tt.ok {
			t.Errorf("groupBelow(%q, %q) = %q, %v; want %q, %v", tt.p, tt.root, rel, ok, tt.rel, tt.ok)
		}
	}
}

// testGroup makes a control group of the test's own, below the cgroup v2
// mount, removed when the test ends. It needs root and cgroup v2 with
// cgroup.kill: it skips without them, except in CI (CI=true), where that
// is a failure.
func testGroup(t *testing.T) string {
	t.Helper()
	skip := func(why string) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: %s", why)
		}
		t.Skip(why)
	}
	if os.Geteuid() != 0 {
		skip("needs root to make control groups")
	}
	mnt, _, err := cgroup2Mount("/proc/self/mountinfo")
	if err != nil {
		skip(err.Error())
	}
	dir, err := os.MkdirTemp(mnt, "npurun-t-")
	if err != nil {
		skip(err.Error())
	}
	t.Cleanup(func() {
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				killGroup(p)
			}
			return nil
		})
		for _, d := range []string{filepath.Join(dir, "g", "child"), filepath.Join(dir, "g"), dir} {
			waitGroupEmpty(d, 10*time.Second)
			if err := unix.Rmdir(d); err != nil && err != unix.ENOENT {
				t.Errorf("remove control group %s: %v", d, err)
			}
		}
	})
	if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err != nil {
		skip("no cgroup.kill (Linux 5.14 or later has it)")
	}
	return dir
}

// startIn starts a process that lives until killed in group d, and
// returns what its wait says once it has exited.
func startIn(t *testing.T, d string) <-chan error {
	t.Helper()
	fd, err := openGroup(d)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	cmd := exec.Command("sleep", "1000")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return done
}

// TestReapGroup: the one removal of tasks' and idle supervisors' control
// groups kills what is in the group and removes it; leaves alone a group
// that is not its own any more; and gives up, saying so, on a group that
// cannot be removed (here: a group inside it), after a bounded number of
// tries instead of trying for ever.
func TestReapGroup(t *testing.T) {
	parent := testGroup(t)
	d := filepath.Join(parent, "g")
	var logged bytes.Buffer
	s := newLocal(&testHost{}, "", "", log.New(&logged, "", 0))

	// Not ours: nothing is touched.
	exited := startIn(t, d)
	s.reapGroup(d, func() bool { return false })
	if _, err := os.Stat(d); err != nil {
		t.Fatalf("a group not ours any more: %v", err)
	}
	select {
	case err := <-exited:
		t.Fatalf("a group not ours any more: its process exited: %v", err)
	default:
	}

	// Ours: its process is killed and the group removed.
	s.reapGroup(d, func() bool { return true })
	if _, err := os.Stat(d); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the group is still there: %v", err)
	}
	select {
	case err := <-exited:
		if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("its process ended with %v, want killed", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("its process is still alive")
	}

	// Gone already: nothing to do, nothing to say.
	s.reapGroup(d, nil)
	if logged.Len() > 0 {
		t.Errorf("logged: %s", logged.String())
	}

	// A group that cannot be removed while a group is inside it (empty, so
	// no notice ends a wait): given up after reapTries, and said; each try
	// waits first (shortened here), rather than spending the tries at once.
	first, most := reapFirstWait, reapMaxWait
	reapFirstWait, reapMaxWait = 5*time.Millisecond, 40*time.Millisecond
	defer func() { reapFirstWait, reapMaxWait = first, most }()
	began := time.Now()
	child := filepath.Join(d, "child")
	for _, g := range []string{d, child} {
		if err := os.Mkdir(g, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	exited = startIn(t, child)
	done := make(chan struct{})
	go func() {
		s.reapGroup(d, nil)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("reapGroup still trying after 30s on a group it cannot remove")
	}
	if want := "after 20 tries: left in place"; !strings.Contains(logged.String(), want) {
		t.Errorf("logged %q, want it to say %q", logged.String(), want)
	}
	// 19 waits between 20 tries: 5+10+20+40×16 ms at the least.
	if took := time.Since(began); took < 675*time.Millisecond {
		t.Errorf("reapGroup gave up after %s: its tries did not wait", took)
	}
	select {
	case <-exited: // killed with the group: cgroup.kill kills below it too
	case <-time.After(10 * time.Second):
		t.Error("the process in the group inside is still alive")
	}
}
