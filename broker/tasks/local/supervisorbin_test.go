package local

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// setACL gives uid rwx on path through a POSIX access ACL (a named user
// entry and a mask of rwx), written as the kernel's binary xattr, as
// `setfacl -m u:UID:rwx` does; it skips where the file system keeps none.
func setACL(t *testing.T, path string, uid uint32) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	mode := uint16(st.Mode)
	b := binary.LittleEndian.AppendUint32(nil, 2)
	for _, e := range []struct {
		tag, perm uint16
		id        uint32
	}{
		{0x01, mode >> 6 & 7, ^uint32(0)}, // user::
		{0x02, 7, uid},                    // user:UID:rwx
		{0x04, mode >> 3 & 7, ^uint32(0)}, // group::
		{0x10, 7, ^uint32(0)},             // mask::rwx
		{0x20, mode & 7, ^uint32(0)},      // other::
	} {
		b = binary.LittleEndian.AppendUint16(b, e.tag)
		b = binary.LittleEndian.AppendUint16(b, e.perm)
		b = binary.LittleEndian.AppendUint32(b, e.id)
	}
	if err := unix.Setxattr(path, "system.posix_acl_access", b, 0); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			t.Skipf("%s: the file system keeps no POSIX ACLs", path)
		}
		t.Fatalf("set the ACL of %s: %v", path, err)
	}
}

// TestOpenTrusted: a POSIX ACL that lets another user write the
// supervisor program, or a directory above it, makes it untrusted, though
// its mode then shows only its group (root) as able to write: with an ACL
// the group bits are the mask, the most any named user or group gets. A
// set-user-ID or set-group-ID program is refused: it would run every task
// with its owner's rights.
func TestOpenTrusted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the program's group must be root's")
	}
	const other = 4242
	tests := []struct {
		name  string
		setup func(t *testing.T, dir, prog string)
		want  string // in the error; "" for a program trusted
	}{
		{"mode alone", func(*testing.T, string, string) {}, ""},
		{"group root may write", func(t *testing.T, _, prog string) {
			chmodT(t, prog, 0o775)
		}, ""},
		{"program writable through an ACL", func(t *testing.T, _, prog string) {
			setACL(t, prog, other)
		}, "prog has an access ACL"},
		{"directory writable through an ACL", func(t *testing.T, dir, _ string) {
			setACL(t, dir, other)
		}, "dir has an access ACL"},
		{"set-user-ID", func(t *testing.T, _, prog string) {
			chmodT(t, prog, os.ModeSetuid|0o755)
		}, "prog is set-user-ID or set-group-ID (mode 4755)"},
		{"set-group-ID", func(t *testing.T, _, prog string) {
			chmodT(t, prog, os.ModeSetgid|0o755)
		}, "prog is set-user-ID or set-group-ID (mode 2755)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "dir")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			chmodT(t, dir, 0o755)
			prog := filepath.Join(dir, "prog")
			if err := os.WriteFile(prog, []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			chmodT(t, prog, 0o755)
			// Of group root, which may write it.
			if err := os.Chown(prog, -1, 0); err != nil {
				t.Fatal(err)
			}
			tc.setup(t, dir, prog)
			f, err := openTrusted(prog, uint32(os.Geteuid()))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("openTrusted: %v", err)
			case tc.want == "":
				f.Close()
			case err == nil:
				f.Close()
				t.Fatalf("openTrusted took %s; want an error saying %q", prog, tc.want)
			case !strings.Contains(err.Error(), tc.want):
				t.Fatalf("openTrusted: %v; want it to say %q", err, tc.want)
			}
		})
	}
}

// chmodT sets a mode exactly, whatever the umask.
func chmodT(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}
