package npu

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestACLBytes(t *testing.T) {
	a := acl{
		{aclOther, 0, aclNoID},
		{aclUser, aclRW, 2000},
		{aclGroupObj, aclRW, aclNoID},
		{aclUser, aclRead, 1000},
		{aclUserObj, 7, aclNoID},
		{aclGroup, aclRead, 50},
	}
	got, err := parseACL(a.withMask().bytes())
	if err != nil {
		t.Fatal(err)
	}
	want := acl{
		{aclUserObj, 7, aclNoID},
		{aclUser, aclRead, 1000},
		{aclUser, aclRW, 2000},
		{aclGroupObj, aclRW, aclNoID},
		{aclGroup, aclRead, 50},
		{aclMask, aclRW, aclNoID},
		{aclOther, 0, aclNoID},
	}
	if !slices.Equal(got, want) {
		t.Errorf("round trip = %v, want %v", got, want)
	}
	// The mask is the union of the named entries and the owning group.
	m := acl{{aclUserObj, 6, aclNoID}, {aclUser, aclRead, 7}, {aclGroupObj, 0, aclNoID}, {aclMask, 7, aclNoID}, {aclOther, 0, aclNoID}}.withMask()
	if !slices.Contains(m, aclEntry{aclMask, aclRead, aclNoID}) {
		t.Errorf("mask of user:7:r-- group::--- = %v, want r--", m)
	}
	// No named entry: no mask.
	if m := fromMode(0o640).withMask(); len(m) != 3 {
		t.Errorf("minimal ACL with mask: %v", m)
	}
	for _, bad := range [][]byte{nil, {2, 0, 0}, {1, 0, 0, 0}, {2, 0, 0, 0, 1, 0, 6, 0}} {
		if _, err := parseACL(bad); err == nil {
			t.Errorf("parseACL(%v) accepted", bad)
		}
	}
}

// needRoot skips a test that needs root, except in CI (CI=true), where a
// skip would hide a gap and so is a failure.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("this test needs root, and CI=true: run CI as root")
	}
	t.Skip("needs root (mknod, other uids)")
}

// charDev makes a directory everyone may enter with character nodes that
// behave as /dev/null, each with mode.
func charDev(t *testing.T, mode uint32, names ...string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "npurun-dev-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		p := filepath.Join(dir, n)
		if err := unix.Mknod(p, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatalf("mknod %s: %v", p, err)
		}
		if err := unix.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// getfacl is the acl package's reading of path's ACL: an independent check
// of the bytes we write.
func getfacl(t *testing.T, path string) string {
	t.Helper()
	out, err := exec.Command("getfacl", "-cn", path).Output()
	if err != nil {
		t.Fatalf("getfacl %s: %v: %s", path, err, out)
	}
	return strings.TrimSpace(string(out))
}

// canOpen tells whether uid (with no group that owns the node) may open
// path for reading and writing.
func canOpen(t *testing.T, path string, uid uint32) bool {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", `exec 3<>"$1"`, "sh", path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: 65534, Groups: []uint32{}}}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return true
	case errors.As(err, &ee) && strings.Contains(stderr.String(), "Permission denied"):
		return false
	}
	t.Fatalf("open %s as uid %d: %v: %s", path, uid, err, stderr.String())
	return false
}

func modeOf(t *testing.T, path string) uint32 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Mode & 0o7777
}

func TestACLOnDeviceNodes(t *testing.T) {
	needRoot(t)
	if _, err := exec.LookPath("getfacl"); err != nil {
		t.Fatal("getfacl not found: install the acl package (.ci/run does)")
	}
	dir := charDev(t, 0o640, "davinci0", "davinci1")
	node, other := filepath.Join(dir, "davinci0"), filepath.Join(dir, "davinci1")
	const student, admins = 54321, 54322

	if canOpen(t, node, student) {
		t.Fatal("a user outside the node's group opens a 0640 node")
	}
	if err := AllowUser(node, student); err != nil {
		t.Fatal(err)
	}
	want := "user::rw-\nuser:54321:rw-\ngroup::r--\nmask::rw-\nother::---"
	if got := getfacl(t, node); got != want {
		t.Errorf("after AllowUser:\n%s\nwant\n%s", got, want)
	}
	if m := modeOf(t, node); m != 0o660 {
		t.Errorf("mode %o after AllowUser, want 660 (group bits show the mask)", m)
	}
	if !canOpen(t, node, student) {
		t.Error("the user named in the ACL cannot open the node")
	}
	if canOpen(t, other, student) {
		t.Error("the user opens another node")
	}
	if err := AllowUser(node, student); err != nil { // again: nothing changes
		t.Fatal(err)
	}
	if got := getfacl(t, node); got != want {
		t.Errorf("after a second AllowUser:\n%s\nwant\n%s", got, want)
	}

	// An administrator's entries stay, whatever the broker removes.
	if out, err := exec.Command("setfacl", "-m", "u:"+strconv.Itoa(admins)+":r,g:50:r", node).CombinedOutput(); err != nil {
		t.Fatalf("setfacl: %v: %s", err, out)
	}
	uids, err := ACLUsers(node)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(uids, []uint32{student, admins}) {
		t.Errorf("ACLUsers = %v, want [%d %d]", uids, student, admins)
	}
	removed, err := RemoveUsers(node, func(uid uint32) bool { return uid == student })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []uint32{student}) {
		t.Errorf("removed %v, want [%d]", removed, student)
	}
	want = "user::rw-\nuser:54322:r--\ngroup::r--\ngroup:50:r--\nmask::r--\nother::---"
	if got := getfacl(t, node); got != want {
		t.Errorf("after RemoveUsers:\n%s\nwant\n%s (the mask shrinks to what is left)", got, want)
	}
	if canOpen(t, node, student) {
		t.Error("the user opens the node after its entry was removed")
	}
	if removed, err := RemoveUsers(node, func(uid uint32) bool { return uid == student }); err != nil || removed != nil {
		t.Errorf("RemoveUsers with nothing to remove = %v, %v", removed, err)
	}

	// The last named entry gone, the ACL is the mode again.
	if out, err := exec.Command("setfacl", "-x", "g:50", node).CombinedOutput(); err != nil {
		t.Fatalf("setfacl: %v: %s", err, out)
	}
	if _, err := RemoveUsers(node, func(uint32) bool { return true }); err != nil {
		t.Fatal(err)
	}
	if m := modeOf(t, node); m != 0o640 {
		t.Errorf("mode %o with no entry left, want 640 back", m)
	}
	if _, err := unix.Getxattr(node, "system.posix_acl_access", make([]byte, 64)); err != unix.ENODATA {
		t.Errorf("xattr left on a node with no entry: %v", err)
	}
}

func TestACLRefusesWhatIsNotADevice(t *testing.T) {
	needRoot(t)
	dir := charDev(t, 0o660, "davinci0")
	link := filepath.Join(dir, "davinci1")
	if err := os.Symlink(filepath.Join(dir, "davinci0"), link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "davinci2")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{link, file, filepath.Join(dir, "davinci3")} {
		if err := AllowUser(p, 54321); err == nil {
			t.Errorf("AllowUser(%s) succeeded", p)
		}
	}
	if got := getfacl(t, filepath.Join(dir, "davinci0")); strings.Contains(got, "54321") {
		t.Errorf("the symlink's target got an entry:\n%s", got)
	}
}

// TestACLKeepsANarrowedMask: a mask that an administrator narrowed (chmod
// on a node with an ACL) is not widened by the broker's changes: adding
// an entry opens the node to that user alone, and removing it gives
// neither the owning group nor another named entry back what the mask
// took, even once no named entry is left.
func TestACLKeepsANarrowedMask(t *testing.T) {
	needRoot(t)
	dir := charDev(t, 0o660, "davinci0")
	node := filepath.Join(dir, "davinci0")
	const student, admins = 54321, 54322
	if out, err := exec.Command("setfacl", "-m", "u:"+strconv.Itoa(admins)+":rw", node).CombinedOutput(); err != nil {
		t.Fatalf("setfacl: %v: %s", err, out)
	}
	// The administrator takes the node from everyone but its owner.
	if err := unix.Chmod(node, 0o600); err != nil {
		t.Fatal(err)
	}
	if canOpen(t, node, admins) {
		t.Fatal("the mask does not hold: the test shows nothing")
	}
	if err := AllowUser(node, student); err != nil {
		t.Fatal(err)
	}
	if !canOpen(t, node, student) {
		t.Error("the broker's entry does not open the node")
	}
	if canOpen(t, node, admins) {
		t.Errorf("adding the broker's entry opened the node to uid %d again:\n%s", admins, getfacl(t, node))
	}
	// Narrowed again while the entry is there: allowing again opens it
	// (the mask as it is counts, not as it would be recomputed).
	if err := unix.Chmod(node, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := AllowUser(node, student); err != nil {
		t.Fatal(err)
	}
	if !canOpen(t, node, student) {
		t.Errorf("AllowUser left the entry masked:\n%s", getfacl(t, node))
	}
	if _, err := RemoveUsers(node, func(uid uint32) bool { return uid == student }); err != nil {
		t.Fatal(err)
	}
	if canOpen(t, node, admins) {
		t.Errorf("removing the broker's entry opened the node to uid %d again:\n%s", admins, getfacl(t, node))
	}
	if m := modeOf(t, node); m&0o070 != 0 {
		t.Errorf("mode %o after the broker's entry went: the owning group got back what the administrator took", m)
	}
	// With no named entry left, the owning group is as the mode said.
	if _, err := RemoveUsers(node, func(uint32) bool { return true }); err != nil {
		t.Fatal(err)
	}
	if m := modeOf(t, node); m != 0o600 {
		t.Errorf("mode %o with no entry left, want 600 as the administrator set it", m)
	}
}

// TestWatchNodes: the nodes of devices and the control nodes, each with
// its device number; nodes that share a number are left out and said,
// as are missing and non-character ones; a missing control node is not.
func TestWatchNodes(t *testing.T) {
	needRoot(t)
	dir, err := os.MkdirTemp("", "npurun-dev-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	mk := func(name string, major, minor uint32) {
		if err := unix.Mknod(filepath.Join(dir, name), unix.S_IFCHR|0o600, int(unix.Mkdev(major, minor))); err != nil {
			t.Fatal(err)
		}
	}
	mk("davinci0", 1, 7)
	mk("davinci1", 1, 5)
	mk("davinci2", 1, 8) // shares its number with davinci3 and devmm_svm
	mk("davinci3", 1, 8)
	if err := os.WriteFile(filepath.Join(dir, "davinci4"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	mk("davinci_manager", 1, 9)
	mk("devmm_svm", 1, 8)
	// hisi_hdc is missing: a control node a driver may not have
	inv := &Inventory{Vendor: Ascend, IDs: []int{0, 1, 2, 3, 4, 5}, DevDir: dir}
	nodes, notes := inv.WatchNodes()
	want := []Node{
		{Path: dir + "/davinci0", Device: 0, Number: unix.Mkdev(1, 7)},
		{Path: dir + "/davinci1", Device: 1, Number: unix.Mkdev(1, 5)},
		{Path: dir + "/davinci_manager", Device: ControlNode, Number: unix.Mkdev(1, 9), Control: true},
	}
	if !slices.Equal(nodes, want) {
		t.Errorf("nodes:\n%+v\nwant\n%+v", nodes, want)
	}
	wantNotes := []string{
		"npu 4: device node " + dir + "/davinci4: " + dir + "/davinci4 is not a character device",
		"npu 5: device node " + dir + "/davinci5: no such file or directory",
		dir + "/davinci2, " + dir + "/davinci3, " + dir + "/devmm_svm share device number 1:8",
	}
	if len(notes) != len(wantNotes) {
		t.Fatalf("notes %q, want %d", notes, len(wantNotes))
	}
	for i, w := range wantNotes {
		if !strings.HasPrefix(notes[i], w) {
			t.Errorf("note %d: %q, want it to start %q", i, notes[i], w)
		}
	}
}
