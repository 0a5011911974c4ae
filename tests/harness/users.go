package harness

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// ShellHome is a home directory for shells started by a test, as of an
// account that has used them before: an interactive zsh without a
// start-up file stops at its new-user menu, and a first interactive fish
// generates completions from the man pages in the background (a process
// that would hold the lease until it is done).
func ShellHome(t *testing.T) string {
	t.Helper()
	home := t.TempDir()
	if err := os.WriteFile(filepath.Join(home, ".zshrc"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(home, ".local/share/fish/generated_completions"), 0o755); err != nil {
		t.Fatal(err)
	}
	return home
}

// NewGroup creates a system group for the test, with members, and removes
// it afterwards (after the members, whose cleanups run first when they
// were made later).
func NewGroup(t *testing.T) (string, uint32) {
	t.Helper()
	NeedRoot(t)
	buf := make([]byte, 4)
	rand.Read(buf)
	name := "npurun-g" + hex.EncodeToString(buf)
	if out, err := exec.Command("groupadd", "--system", name).CombinedOutput(); err != nil {
		t.Fatalf("groupadd %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("groupdel", name).CombinedOutput(); err != nil {
			t.Errorf("groupdel %s: %v: %s", name, err, out)
		}
	})
	g, err := user.LookupGroup(name)
	if err != nil {
		t.Fatal(err)
	}
	gid, _ := strconv.Atoi(g.Gid)
	return name, uint32(gid)
}

// TestUser is a system account made for one test.
type TestUser struct {
	Name     string
	UID, GID uint32
}

// NewUser creates a system user for the test and removes it afterwards.
func NewUser(t testing.TB) TestUser {
	t.Helper()
	NeedRoot(t)
	buf := make([]byte, 4)
	rand.Read(buf)
	name := "npurun-t" + hex.EncodeToString(buf)
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { userdel(t, name) })
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return TestUser{Name: name, UID: uint32(uid), GID: uint32(gid)}
}

// As makes cmd run as u.
func (u TestUser) As(cmd *exec.Cmd, dir string) *exec.Cmd {
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.UID, Gid: u.GID}}
	cmd.Dir = dir
	return cmd
}

// userdel removes the account name (and, with extra, its home: "--remove").
// A process of the user that has just exited may not have been reaped yet
// by whoever it was left to: userdel then names it (status 8), and is
// tried again once that process is gone.
func userdel(t testing.TB, name string, extra ...string) {
	t.Helper()
	usedBy := regexp.MustCompile(`currently used by process (\d+)`)
	for try := 0; ; try++ {
		out, err := exec.Command("userdel", append(extra, name)...).CombinedOutput()
		if err == nil {
			return
		}
		m := usedBy.FindSubmatch(out)
		if m == nil || try == 3 {
			t.Errorf("userdel %s: %v: %s", name, err, out)
			return
		}
		pid, _ := strconv.Atoi(string(m[1]))
		AwaitReaped(pid, time.Now().Add(EventTimeout))
	}
}

// AwaitReaped waits until deadline for process pid to exit (its pidfd
// says so) and be reaped (its /proc entry gone: no event tells a process
// other than its parent, so that is looked at every 10 ms).
func AwaitReaped(pid int, deadline time.Time) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // gone already
	}
	defer unix.Close(fd)
	for time.Now().Before(deadline) {
		n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 10)
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); n > 0 && err != nil {
			return
		}
	}
}
