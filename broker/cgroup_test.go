package broker

import (
	"io"
	"log"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
