package harness

import (
	"bufio"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// cgroup2Mount is where the cgroup v2 file system is mounted, "" if it is
// not; found in /proc/self/mountinfo, as the broker finds it.
func cgroup2Mount() string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		before, after, ok := strings.Cut(sc.Text(), " - ")
		fields, fs := strings.Fields(before), strings.Fields(after)
		if ok && len(fields) >= 5 && len(fs) > 0 && fs[0] == "cgroup2" {
			return fields[4]
		}
	}
	return ""
}

// OwnCgroupParent makes a parent control group of the test's own for a
// broker's tasks (npubroker serve --cgroup), when the tests run as root on a
// machine with cgroup v2 and cgroup.kill; "" otherwise, or when
// NPURUN_TEST_NO_CGROUP is set (to exercise the fallback as root): the
// broker then runs with --cgroup off and falls back on supervisor and
// session. When the test ends, whatever is left in the group is killed and
// it is removed, after the broker has stopped.
func OwnCgroupParent(t testing.TB) string {
	t.Helper()
	mnt := cgroup2Mount()
	if os.Geteuid() != 0 || mnt == "" || os.Getenv("NPURUN_TEST_NO_CGROUP") != "" {
		return ""
	}
	dir, err := os.MkdirTemp(mnt, "npurun-t-")
	if err != nil {
		t.Logf("no control group for the test's broker: %v", err)
		return ""
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err != nil {
		unix.Rmdir(dir)
		return ""
	}
	t.Cleanup(func() { removeCgroupTree(t, dir) })
	return dir
}

// removeCgroupTree kills everything in the control group dir and below,
// and removes them, waiting for each to empty.
func removeCgroupTree(t testing.TB, dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() {
			removeCgroupTree(t, filepath.Join(dir, e.Name()))
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("kill %s: %v", dir, err)
	}
	deadline := time.Now().Add(EventTimeout)
	for {
		err := unix.Rmdir(dir)
		if err == nil || err == unix.ENOENT {
			return
		}
		if err != unix.EBUSY || time.Now().After(deadline) {
			t.Errorf("remove control group %s: %v", dir, err)
			return
		}
		waitCgroupEmpty(dir, time.Until(deadline))
	}
}

// waitCgroupEmpty waits up to d for a control group to hold no process,
// woken by the kernel's notice on cgroup.events; it tells whether it is
// empty (or gone).
func waitCgroupEmpty(dir string, d time.Duration) bool {
	f, err := os.Open(filepath.Join(dir, "cgroup.events"))
	if err != nil {
		return true
	}
	defer f.Close()
	deadline := time.Now().Add(d)
	buf := make([]byte, 256)
	for {
		n, _ := f.ReadAt(buf, 0)
		if n == 0 || bytes.Contains(buf[:n], []byte("populated 0")) {
			return true
		}
		ms := int(time.Until(deadline) / time.Millisecond)
		if ms <= 0 {
			return false
		}
		unix.Poll([]unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLPRI}}, ms)
	}
}

// CgroupProcs lists the processes in a control group.
func CgroupProcs(dir string) []string {
	data, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	return strings.Fields(string(data))
}

// SleepingTask submits, as u, a task on device 0 that runs until killed,
// and returns its id and its command's pid once that has started.
func SleepingTask(t *testing.T, b *Broker, u *TestUser) (uint64, int) {
	t.Helper()
	dir := SharedDir(t)
	fifo := filepath.Join(dir, "pid")
	MakeFIFO(t, fifo)
	id := SubmitTask(t, b, u, dir, "-d", "0", "--log", filepath.Join(UserDir(t, u, 0o755), "log"), "--",
		"sh", "-c", `echo $$ > "$0"; exec sleep 1000`, fifo)
	return id, Escaped(t, fifo)
}
