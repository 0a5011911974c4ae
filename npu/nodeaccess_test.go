package npu

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestNodeAccessWorldOpen: a device's node or a control node that every
// account may open is reported; one open to its owner only is not, nor is
// a group of root's (gid 0 holds no restricted account).
func TestNodeAccessWorldOpen(t *testing.T) {
	dir := t.TempDir()
	for name, mode := range map[string]os.FileMode{"nvidia0": 0o666, "nvidia1": 0o600, "nvidiactl": 0o606, "nvidia-uvm": 0o660} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, nil, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
	}
	groups, open := NodeAccess(NVIDIA, dir, []int{0, 1})
	want := []string{filepath.Join(dir, "nvidia0"), filepath.Join(dir, "nvidiactl")}
	slices.Sort(open)
	if !slices.Equal(open, want) {
		t.Errorf("world-open nodes = %q, want %q", open, want)
	}
	if os.Getegid() == 0 && len(groups) != 0 {
		t.Errorf("groups = %q, want none (the nodes are root's group's)", groups)
	}
}

// TestMember: root is a member of its primary group; a group that does not
// exist has no members.
func TestMember(t *testing.T) {
	if !Member("root", "root") {
		t.Error(`Member("root", "root") = false, want true`)
	}
	if Member("root", "npurun-no-such-group") {
		t.Error("Member of a group that does not exist = true")
	}
}
