package local

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/claim"
)

// Each task runs in a control group of its own where the machine has
// cgroup v2 and the broker runs as root. Its supervisor is started in it
// (clone3 with CLONE_INTO_CGROUP), so nothing of the task ever runs
// outside it; whatever the task starts stays in it, whatever session or
// process group it makes, and a user cannot move a process out (the
// groups are root's). When the task ends, however it ends — its report,
// its supervisor gone, the time-limit backstop, a cancel — the broker
// kills everything in the group at once (cgroup.kill) and removes the
// group once it is empty. The group also measures the task: CPU time
// (cpu.stat) and, where the memory controller is on, peak memory
// (memory.peak), shown by task-submit show.
//
// Where the groups go, [tasks] cgroup (npubroker serve --cgroup overrides
// it):
//
//   - "auto" (the default): the broker's own control group, found from
//     /proc/self/cgroup under the cgroup2 mount found in
//     /proc/self/mountinfo. Under systemd the unit has Delegate=yes and
//     DelegateSubgroup=broker, so the broker runs in npubroker.service/broker
//     and the tasks' groups are its siblings (task-ID): the service's own
//     group holds no process, as cgroup v2 wants of a group whose
//     controllers are handed down. A broker in another group (started by
//     hand) moves itself into a leaf "broker" of it first; one in the root
//     group (a container) uses /npurun below the root.
//   - a directory of the cgroup v2 file system: the parent of the tasks'
//     groups, made if missing; the broker stays where it is.
//   - "off": no control groups.
//
// Without them (off, not root, no cgroup v2, no cgroup.kill) the broker
// falls back on the supervisor, a child subreaper that ends everything
// below it when the task ends, and, when the supervisor itself is gone, on
// killing what is left in its session, filtered by uid and start time
// (killSession). What that fallback misses is in the README's limits.
//
// The parent belongs to one state directory. A broker holds a flock on it
// for its life and marks it with its state directory (an extended
// attribute, ownerXattr), because at start it kills every task-ID group
// its journal does not know: a second broker on the same parent (a test
// or demo broker in a container's root group, beside the real one, or
// after it was stopped with tasks running) would otherwise kill the first
// one's tasks. A parent locked by another broker, or whose task groups
// still hold processes of another state directory's tasks, is refused.
//
// The memory controller is turned on for the tasks' groups only where the
// broker was not started in their parent. systemd older than 254 ignores
// DelegateSubgroup= and starts the broker in the service's own group, which
// the broker then leaves for a leaf of it; but at the next restart systemd
// puts the new broker in that group again, and cgroup v2 refuses a process
// in a group that hands a controller down (EBUSY: the service fails with
// 219/CGROUP while a task runs). There, tasks get CPU time but no peak
// memory.

// cgroups is where the tasks' control groups are made.
type cgroups struct {
	parent string   // the directory they are made in
	memory bool     // the memory controller is on for them: memory.peak
	claim  *os.File // parent, flocked for the broker's life
}

// ownerXattr marks a parent of tasks' groups with the state directory of
// the broker that made them.
const ownerXattr = "user.npurun.state_dir"

// cgroupPrefix names a task's group: task-ID.
const cgroupPrefix = "task-"

// idlePrefix names an idle supervisor's group: idle-N (idle.go).
const idlePrefix = "idle-"

// brokerLeaf is the group the broker moves itself into in "auto" mode.
const brokerLeaf = "broker"

// setupCgroups decides where tasks' control groups go, from mode ("auto",
// "off" or a directory), for the broker of the state directory stateDir.
// It returns nil, with a log line saying why, when they cannot be used; a
// directory named explicitly that cannot be used is an error, so that a
// broker configured for control groups never runs without them.
func setupCgroups(mode, stateDir string, lg *log.Logger) (*cgroups, error) {
	fallback := func(why string) (*cgroups, error) {
		lg.Printf("tasks have no control group of their own (%s): each is contained by its supervisor and, once that is gone, its session (npubroker(8), TASKS)", why)
		return nil, nil
	}
	explicit := mode != "auto" && mode != "off" && mode != ""
	fail := func(err error) (*cgroups, error) {
		if explicit {
			return nil, fmt.Errorf("tasks' control groups: %w", err)
		}
		return fallback(err.Error())
	}
	switch {
	case mode == "off":
		return fallback("[tasks] cgroup = \"off\"")
	case os.Geteuid() != 0:
		if explicit {
			return nil, fmt.Errorf("tasks' control groups in %s: the broker is not root", mode)
		}
		return fallback("the broker is not root")
	}
	mnt, mntRoot, err := cgroup2Mount("/proc/self/mountinfo")
	if err != nil {
		return fail(err)
	}
	var parent, leaf string
	if explicit {
		parent = filepath.Clean(mode)
		if parent == mnt {
			return fail(fmt.Errorf("%s is the root control group: name a directory below it", parent))
		}
		if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fail(fmt.Errorf("make %s: %w", parent, err))
		}
		var st unix.Statfs_t
		if err := unix.Statfs(parent, &st); err != nil {
			return fail(fmt.Errorf("%s: %w", parent, err))
		}
		if st.Type != unix.CGROUP2_SUPER_MAGIC {
			return fail(fmt.Errorf("%s is not on the cgroup v2 file system (mounted at %s)", parent, mnt))
		}
	} else {
		own, err := ownCgroup()
		if err != nil {
			return fail(err)
		}
		if parent, leaf, err = autoParent(mnt, mntRoot, own); err != nil {
			return fail(err)
		}
	}
	if _, err := os.Stat(filepath.Join(parent, "cgroup.kill")); err != nil {
		return fail(fmt.Errorf("%s has no cgroup.kill (Linux 5.14 or later has it): %w", parent, err))
	}
	claim, err := claimCgroup(parent, stateDir)
	if err != nil {
		return fail(err)
	}
	if leaf != "" {
		if err := moveInto(leaf); err != nil {
			claim.Close()
			return fail(err)
		}
	}
	cg := &cgroups{parent: parent, claim: claim}
	mem := "memory accounting on"
	switch {
	case leaf != "":
		// Started in parent itself: the next broker will be too (see
		// the top of this file), so parent hands no controller down.
		mem = "memory accounting off: the broker was started in " + parent + " itself, where the next one will be started too (systemd older than 254 ignores DelegateSubgroup=), so no controller may be handed down from it"
	case enableMemory(parent):
		cg.memory = true
	default:
		mem = "memory accounting off: the memory controller is not available to " + parent
	}
	lg.Printf("each task runs in a control group of its own under %s (%s)", parent, mem)
	return cg, nil
}

// errCgroupTaken is a parent of tasks' groups that is another broker's.
var errCgroupTaken = errors.New("another broker's")

// claimCgroup takes parent for the broker of stateDir for as long as the
// returned file stays open (a flock on the directory), and marks it as
// that state directory's. It refuses a parent another broker holds, and
// one marked for another state directory while any of its tasks' groups
// holds a process: this broker would kill them, not knowing their tasks.
// A parent whose marked owner left nothing running is taken over.
func claimCgroup(parent, stateDir string) (*os.File, error) {
	f, err := os.Open(parent)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", parent, err)
	}
	owner := func() string {
		buf := make([]byte, 4096)
		n, err := unix.Getxattr(parent, ownerXattr, buf)
		if err != nil {
			return ""
		}
		return string(buf[:n])
	}
	// A broker just killed may have left a child between clone and exec,
	// holding the descriptor for a moment.
	err = claim.Lock(int(f.Fd()))
	switch {
	case errors.Is(err, unix.EWOULDBLOCK):
		f.Close()
		return nil, fmt.Errorf("%s is %w, which is running (state directory %s): give each broker a directory of its own ([tasks] cgroup, --cgroup)", parent, errCgroupTaken, orUnknown(owner()))
	case err != nil:
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", parent, err)
	}
	if o := owner(); o != "" && o != stateDir {
		if busy := populatedTasks(parent); len(busy) > 0 {
			f.Close()
			return nil, fmt.Errorf("%s is %w: the tasks of state directory %s still run in %s; give each broker a directory of its own ([tasks] cgroup, --cgroup)", parent, errCgroupTaken, o, strings.Join(busy, ", "))
		}
	}
	if err := unix.Setxattr(parent, ownerXattr, []byte(stateDir), 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("mark %s as %s's: %w", parent, stateDir, err)
	}
	return f, nil
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// populatedTasks names the tasks' groups in parent that hold a process.
func populatedTasks(parent string) []string {
	ents, err := os.ReadDir(parent)
	if err != nil {
		return nil
	}
	var busy []string
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), cgroupPrefix) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(parent, e.Name(), "cgroup.events"))
		if err == nil && bytes.Contains(data, []byte("populated 1")) {
			busy = append(busy, e.Name())
		}
	}
	return busy
}

// cgroup2Mount finds where the cgroup v2 file system is mounted, and the
// group its root shows, from a mountinfo file.
func cgroup2Mount(mountinfo string) (mnt, root string, err error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
		before, after, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f := strings.Fields(before)
		g := strings.Fields(after)
		if len(f) < 5 || len(g) < 1 || g[0] != "cgroup2" {
			continue
		}
		return unescapeMount(f[4]), unescapeMount(f[3]), nil
	}
	if err := sc.Err(); err != nil {
		return "", "", err
	}
	return "", "", errors.New("no cgroup v2 file system is mounted")
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ownCgroup is this process's cgroup v2 group ("/system.slice/x.service").
func ownCgroup() (string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("this process is in no cgroup v2 group")
}

// autoParent is the parent of the tasks' groups in "auto" mode, for a
// process in group own, and the leaf of it the broker must move into
// first ("" when it need not: it was started there, or sits in the root).
func autoParent(mnt, mntRoot, own string) (parent, leaf string, err error) {
	rel, ok := groupBelow(own, mntRoot)
	if !ok || strings.Contains(own, "(deleted)") {
		return "", "", fmt.Errorf("this process's group %s is not below the cgroup2 mount %s", own, mnt)
	}
	dir := filepath.Join(mnt, rel)
	switch {
	case dir == mnt:
		// The root group (a container, no systemd): a group of our own
		// below it.
		parent := filepath.Join(mnt, "npurun")
		if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", "", fmt.Errorf("make %s: %w", parent, err)
		}
		return parent, "", nil
	case filepath.Base(dir) == brokerLeaf:
		return filepath.Dir(dir), "", nil // DelegateSubgroup=broker
	}
	return dir, filepath.Join(dir, brokerLeaf), nil
}

// groupBelow tells whether group p is root or below it, component by
// component (/system.sliceX is not below /system.slice), and gives p
// relative to root ("" for root itself).
func groupBelow(p, root string) (rel string, ok bool) {
	p, root = path.Clean("/"+p), path.Clean("/"+root)
	switch {
	case p == root:
		return "", true
	case root == "/":
		return p[1:], true
	}
	if rel, ok := strings.CutPrefix(p, root+"/"); ok {
		return rel, true
	}
	return "", false
}

// moveInto moves the broker into the control group leaf, made if missing.
func moveInto(leaf string) error {
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("make %s: %w", leaf, err)
	}
	if err := writeCgroupFile(filepath.Join(leaf, "cgroup.procs"), strconv.Itoa(os.Getpid())); err != nil {
		return fmt.Errorf("move the broker into %s: %w", leaf, err)
	}
	return nil
}

// enableMemory turns the memory controller on for parent's children if
// parent may have it, and tells whether it is on.
func enableMemory(parent string) bool {
	has := func(file string) bool {
		data, err := os.ReadFile(filepath.Join(parent, file))
		return err == nil && slices.Contains(strings.Fields(string(data)), "memory")
	}
	if !has("cgroup.controllers") {
		return false
	}
	if !has("cgroup.subtree_control") {
		// Refused while parent holds processes of its own (cgroup v2's
		// rule for groups that hand controllers down): then no peak.
		_ = writeCgroupFile(filepath.Join(parent, "cgroup.subtree_control"), "+memory")
	}
	return has("cgroup.subtree_control")
}

// writeCgroupFile writes one value to a control file.
func writeCgroupFile(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// dir is task id's group.
func (cg *cgroups) dir(id uint64) string {
	return filepath.Join(cg.parent, cgroupPrefix+strconv.FormatUint(id, 10))
}

// idleDir is idle supervisor n's group.
func (cg *cgroups) idleDir(n uint64) string {
	return filepath.Join(cg.parent, idlePrefix+strconv.FormatUint(n, 10))
}

// open makes task id's group if it does not exist yet and opens it, for
// CLONE_INTO_CGROUP.
func (cg *cgroups) open(id uint64) (int, error) { return openGroup(cg.dir(id)) }

// openGroup makes group d if it does not exist yet and opens it.
func openGroup(d string) (int, error) {
	if err := unix.Mkdir(d, 0o755); err != nil && err != unix.EEXIST {
		return -1, fmt.Errorf("make control group %s: %w", d, err)
	}
	fd, err := unix.Open(d, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open control group %s: %w", d, err)
	}
	return fd, nil
}

// kill kills every process in task id's group; fs.ErrNotExist when it has
// none.
func (cg *cgroups) kill(id uint64) error { return killGroup(cg.dir(id)) }

// killGroup kills every process in group d; fs.ErrNotExist when there is
// no such group.
func killGroup(d string) error {
	return writeCgroupFile(filepath.Join(d, "cgroup.kill"), "1")
}

// removeGroup kills what is left in group d and removes the group;
// unix.EBUSY while processes are still dying in it. A group already gone
// is no error.
func removeGroup(d string) error {
	err := killGroup(d)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := unix.Rmdir(d); err != nil && err != unix.ENOENT {
		return err
	}
	return nil
}

// waitGroupEmpty waits up to d for group dir to hold no process, woken by
// the kernel's notice on cgroup.events. It tells whether it waited: false
// when the group held no process already, or could not be read.
func waitGroupEmpty(dir string, d time.Duration) bool {
	f, err := os.Open(filepath.Join(dir, "cgroup.events"))
	if err != nil {
		return false
	}
	defer f.Close()
	deadline := time.Now().Add(d)
	buf := make([]byte, 256)
	for waited := false; ; waited = true {
		n, err := f.ReadAt(buf, 0)
		if n == 0 && err != nil {
			return waited
		}
		if bytes.Contains(buf[:n], []byte("populated 0")) {
			return waited
		}
		ms := int(time.Until(deadline) / time.Millisecond)
		if ms <= 0 {
			return waited
		}
		pfd := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLPRI}}
		if _, err := unix.Poll(pfd, ms); err != nil && err != unix.EINTR {
			return waited
		}
	}
}

// usage is what task id's group has used: CPU time and, where the memory
// controller is on, peak memory in bytes (0 where unknown).
func (cg *cgroups) usage(id uint64) (cpu time.Duration, peak int64) {
	d := cg.dir(id)
	if data, err := os.ReadFile(filepath.Join(d, "cpu.stat")); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
				if us, err := strconv.ParseInt(v, 10, 64); err == nil {
					cpu = time.Duration(us) * time.Microsecond
				}
			}
		}
	}
	if cg.memory {
		if data, err := os.ReadFile(filepath.Join(d, "memory.peak")); err == nil {
			peak, _ = strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		}
	}
	return cpu, peak
}

// tasks lists the ids of the tasks' groups that exist.
func (cg *cgroups) tasks() []uint64 { return cg.groups(cgroupPrefix) }

// idleGroups lists the idle supervisors' groups that exist.
func (cg *cgroups) idleGroups() []uint64 { return cg.groups(idlePrefix) }

// groups lists the numbers of the groups named prefix+N.
func (cg *cgroups) groups(prefix string) []uint64 {
	ents, err := os.ReadDir(cg.parent)
	if err != nil {
		return nil
	}
	var ids []uint64
	for _, e := range ents {
		if s, ok := strings.CutPrefix(e.Name(), prefix); ok && e.IsDir() {
			if id, err := strconv.ParseUint(s, 10, 64); err == nil {
				ids = append(ids, id)
			}
		}
	}
	return ids
}

// reapCgroup kills what is left in an ended task's group and removes the
// group once empty (reapGroup), unless the task is known again.
func (l *local) reapCgroup(id uint64) {
	l.reapGroup(l.cg.dir(id), func() bool { return !l.host.Known(id) })
}

// How reapGroup tries again while processes are still dying in a group:
// the first wait, doubled each time up to the last, and how many tries
// (about ten minutes in all) before the group is left to the next broker
// start, which removes what this one left. (Variables: a test shortens
// the waits.)
var (
	reapFirstWait = 50 * time.Millisecond
	reapMaxWait   = time.Minute
	reapTries     = 20
)

// reapGroup kills what is left in group d (cgroup.kill) and removes it,
// and, while processes are still dying in it, waits for the kernel's
// notice that it is empty and tries again, a bounded number of times. The
// groups of tasks and of idle supervisors are all removed here. When ours
// is set it is called with the lock held before each try, and the group is
// left alone (another owns it now) once it returns false; the removal is
// then made under the lock too.
func (l *local) reapGroup(d string, ours func() bool) {
	wait := reapFirstWait
	for try := 1; ; try++ {
		var err error
		if ours != nil {
			l.host.Lock()
			if !ours() {
				l.host.Unlock()
				return
			}
			err = removeGroup(d)
			l.host.Unlock()
		} else {
			err = removeGroup(d)
		}
		switch {
		case err == nil:
			return
		case err != unix.EBUSY:
			l.log.Printf("remove control group %s: %v", d, err)
			return
		case try == reapTries:
			l.log.Printf("control group %s still holds dying processes after %d tries: left in place, the next broker start removes it", d, try)
			return
		case try == 6:
			l.log.Printf("processes are still dying in control group %s; the broker goes on trying", d)
		}
		if !waitGroupEmpty(d, wait) {
			// Empty, yet it cannot be removed (a group below it, which
			// only root makes): no notice will come, so wait all the same
			// rather than spend the tries at once.
			time.Sleep(wait)
		}
		wait = min(2*wait, reapMaxWait)
	}
}
