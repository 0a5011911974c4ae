package harness

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// DevTree is a fake /dev of real character nodes (each behaves as
// /dev/null): davinci0..n-1 and Ascend's control nodes, mode 0660, owned
// by root's group, as they are once the device group is taken away from
// restricted accounts.
type DevTree struct {
	Dir string
}

// ControlNodes are Ascend's shared nodes.
var ControlNodes = []string{"davinci_manager", "devmm_svm", "hisi_hdc"}

func NewDevTree(t testing.TB, n int) DevTree {
	t.Helper()
	NeedRoot(t)
	NeedTool(t, "acl", "getfacl", "setfacl")
	dir := filepath.Join(SharedDir(t), "dev")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	names := append([]string(nil), ControlNodes...)
	for i := range n {
		names = append(names, fmt.Sprintf("davinci%d", i))
	}
	for _, name := range names {
		p := filepath.Join(dir, name)
		if err := unix.Mknod(p, unix.S_IFCHR|0o660, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatalf("mknod %s: %v", p, err)
		}
		if err := unix.Chmod(p, 0o660); err != nil {
			t.Fatal(err)
		}
	}
	return DevTree{Dir: dir}
}

func (d DevTree) Node(name string) string { return filepath.Join(d.Dir, name) }

// Config is an Ascend configuration on the tree (no npu-smi: logical ids
// are the physical ones) with extra appended.
func (d DevTree) Config(ids, extra string) string {
	return fmt.Sprintf("[devices]\nvendor = \"ascend\"\nids = %q\ndev_dir = %q\nnpu_smi = %q\n\n%s",
		ids, d.Dir, filepath.Join(d.Dir, "no-npu-smi"), extra)
}

// CanOpen tells whether u may open path for reading and writing, from a
// process of u's with u's groups: the kernel's answer, EACCES or not.
func CanOpen(t *testing.T, u TestUser, path string) bool {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", `exec 3<>"$1"`, "sh", path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.UID, Gid: u.GID}}
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
	t.Fatalf("open %s as %s: %v: %s", path, u.Name, err, stderr.String())
	return false
}

// ACLText is getfacl's view of path's ACL (numeric ids, no header).
func ACLText(t *testing.T, path string) string {
	t.Helper()
	out, err := exec.Command("getfacl", "-cn", path).Output()
	if err != nil {
		t.Fatalf("getfacl %s: %v", path, err)
	}
	return strings.TrimSpace(string(out))
}

// WaitFree returns once device id is free again, as seen by a new lease of
// it: the broker has removed the ended lease's ACL entries by then (it does
// so before the device can be granted again).
func WaitFree(t *testing.T, b *Broker, id int) {
	t.Helper()
	cmd := b.Npurun("-d", fmt.Sprint(id), "--timeout", "20s", "true")
	if code, out := ExitCode(t, cmd); code != 0 {
		t.Fatalf("npu %d did not come free: exit %d: %s", id, code, out)
	}
}

// LeaseAs starts npurun ARGS as u, its command printing "held" and keeping
// the lease until its standard input closes.
func LeaseAs(t *testing.T, b *Broker, u TestUser, name string, args ...string) Holder {
	t.Helper()
	args = append(args, "sh", "-c", `echo "held $NPURUN_DEVICES"; read x; exit 0`)
	p := StartProc(t, name, u.As(b.Npurun(args...), b.Dir))
	p.WaitLine("held")
	return Holder{p}
}
