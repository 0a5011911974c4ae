package tests

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// testUser is a system account made for one test.
type testUser struct {
	Name     string
	UID, GID uint32
}

// newUser creates a system user for the test and removes it afterwards.
func newUser(t testing.TB) testUser {
	t.Helper()
	needRoot(t)
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
	return testUser{Name: name, UID: uint32(uid), GID: uint32(gid)}
}

// as makes cmd run as u.
func (u testUser) as(cmd *exec.Cmd, dir string) *exec.Cmd {
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.UID, Gid: u.GID}}
	cmd.Dir = dir
	return cmd
}

// TestUsersInterleave: one user's six waiting requests do not starve
// another user's single request, which arrives last but is served within
// one turn; identity is the caller's own uid.
func TestUsersInterleave(t *testing.T) {
	alice, bob := newUser(t), newUser(t)
	b := StartBroker(t, FakeConfig(1))
	w := newWorkload(t)
	h := hold(t, b, "holder")
	var ps []*proc
	for i := range 6 {
		tag := fmt.Sprintf("a%d", i)
		cmd := alice.as(b.Npurun(append([]string{"-v"}, w.args(b, tag, time.Millisecond)...)...), b.Dir)
		p := startProc(t, tag, cmd)
		p.waitLine("npurun: waiting for")
		ps = append(ps, p)
	}
	p := startProc(t, "b0", bob.as(b.Npurun(append([]string{"-v"}, w.args(b, "b0", time.Millisecond)...)...), b.Dir))
	line := p.waitLine("npurun: waiting for")
	ps = append(ps, p)
	t.Logf("bob: %s", line)
	h.release()
	for _, p := range ps {
		p.mustSucceed()
	}
	runs := w.runs(t)
	if len(runs) != 7 {
		t.Fatalf("%d runs, want 7: %v", len(runs), tags(runs))
	}
	pos := -1
	for i, r := range runs {
		want := alice.UID
		if r.Tag == "b0" {
			want, pos = bob.UID, i
		}
		if r.UID != int(want) {
			t.Errorf("%s ran as uid %d, want %d", r.Tag, r.UID, want)
		}
	}
	if pos > 1 {
		t.Errorf("bob's request was served %d-th, after %d of alice's; want no later than alice's second: %v", pos+1, pos, tags(runs))
	}
	// Alice's own requests keep their order.
	var order []string
	for _, r := range runs {
		if r.Tag != "b0" {
			order = append(order, r.Tag)
		}
	}
	for i, tag := range order {
		if tag != fmt.Sprintf("a%d", i) {
			t.Errorf("alice's requests served as %v, want a0..a5", order)
			break
		}
	}
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
		awaitReaped(pid, time.Now().Add(eventTimeout))
	}
}

// awaitReaped waits until deadline for process pid to exit (its pidfd
// says so) and be reaped (its /proc entry gone: no event tells a process
// other than its parent, so that is looked at every 10 ms).
func awaitReaped(pid int, deadline time.Time) {
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
