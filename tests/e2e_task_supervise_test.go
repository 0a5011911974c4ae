package tests

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// supProc is a running npurun-supervise of the tests' binaries.
type supProc struct {
	pid  int
	ppid int // its broker's pid while that broker lives
	uid  uint32
	id   string // the task id on its command line; "" for one started idle
	idle bool   // started idle and given no task yet: its standard input is still the broker's socket
}

// supervisors lists the running supervisors started from b's binaries:
// processes whose executable is bin.Supervisor (the broker runs it from
// the file it opened at its start, so /proc/PID/exe names that file).
// A supervisor's own child is not one: between its fork and the exec of
// the task's command (the log says "task N started" just before the
// fork) it has the supervisor's executable and command line, and is
// soon the command (TestTaskSupervisorTermWhileReporting took it for
// the supervisor, and found it gone once the task had ended).
func supervisors(bin *Binaries) []supProc {
	ents, _ := os.ReadDir("/proc")
	var out []supProc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := "/proc/" + e.Name()
		if l, _ := os.Readlink(dir + "/exe"); l != bin.Supervisor {
			continue
		}
		if st, _ := procState(pid); st == 'Z' || st == 0 {
			continue
		}
		data, _ := os.ReadFile(dir + "/cmdline")
		args := strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
		if len(args) == 0 || args[0] != "npurun-supervise" {
			continue
		}
		p := supProc{pid: pid, ppid: procPPID(pid)}
		if len(args) > 1 {
			p.id = args[1]
		}
		var st unix.Stat_t
		if unix.Stat(dir, &st) == nil {
			p.uid = st.Uid
		}
		fd0, _ := os.Readlink(dir + "/fd/0")
		p.idle = p.id == "" && strings.HasPrefix(fd0, "socket:")
		out = append(out, p)
	}
	sup := map[int]bool{}
	for _, p := range out {
		sup[p.pid] = true
	}
	return slices.DeleteFunc(out, func(p supProc) bool { return sup[p.ppid] })
}

// procPPID is pid's parent, 0 when unknown.
func procPPID(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// busySupervisors are the pids of the supervisors of bin that are not idle.
func busySupervisors(bin *Binaries) []int {
	var out []int
	for _, p := range supervisors(bin) {
		if !p.idle {
			out = append(out, p.pid)
		}
	}
	return out
}

// idleOf lists b's idle supervisors of uid (its children: other tests'
// brokers run the same program, and a test user's uid may be used again).
func idleOf(b *Broker, uid uint32) []int {
	var out []int
	for _, p := range supervisors(b.Bin) {
		if p.idle && p.uid == uid && p.ppid == b.Pid() {
			out = append(out, p.pid)
		}
	}
	return out
}

// awaitIdle waits for an idle supervisor of b for uid other than the pids
// in not, and returns its pid. The broker starts one once a task of uid
// has started; nothing announces it but /proc, which is polled.
func awaitIdle(t testing.TB, b *Broker, uid uint32, not ...int) int {
	t.Helper()
	deadline := time.Now().Add(eventTimeout)
	for {
		for _, pid := range idleOf(b, uid) {
			if !slices.Contains(not, pid) {
				return pid
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no idle supervisor of uid %d within %s; supervisors: %+v", uid, eventTimeout, supervisors(b.Bin))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// privateBinaries copies the broker and the supervisor into a directory of
// the test's own (the other binaries are shared), so that the test may
// change them; the directory is mode 0755, as the broker wants.
func privateBinaries(t *testing.T) *Binaries {
	t.Helper()
	b := *bins(t)
	dir := SharedDir(t)
	for _, p := range []*string{&b.Broker, &b.Supervisor} {
		to := filepath.Join(dir, filepath.Base(*p))
		copyFile(t, *p, to, 0o755)
		*p = to
	}
	b.Dir = dir
	return &b
}

// TestTaskSupervisorTrusted: the broker runs the supervisor for every user,
// so it runs no task when the program, or a directory above it, could be
// replaced by another user than root (or the broker's own), or is missing:
// it serves leases all the same, and says which file and why in its log and
// to whoever submits (exit 75); a sticky directory (/tmp) open to others is
// fine. Once the file is put right, tasks come back without a restart.
func TestTaskSupervisorTrusted(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, bin *Binaries)
		want  string // in the broker's error; "" for a broker that starts
	}{
		{"as built", func(*testing.T, *Binaries) {}, ""},
		{"program writable by others", func(t *testing.T, bin *Binaries) {
			chmod(t, bin.Supervisor, 0o757)
		}, bin0 + " is writable by others than its owner (mode 0757)"},
		{"program writable by its group", func(t *testing.T, bin *Binaries) {
			chmod(t, bin.Supervisor, 0o775)
			if err := os.Chown(bin.Supervisor, -1, 4242); err != nil {
				t.Skipf("chown: %v", err)
			}
		}, bin0 + " is writable by others than its owner (mode 0775)"},
		{"directory writable by others", func(t *testing.T, bin *Binaries) {
			chmod(t, filepath.Dir(bin.Supervisor), 0o777)
		}, dir0 + " is writable by others than its owner (mode 0777)"},
		{"sticky directory writable by others", func(t *testing.T, bin *Binaries) {
			chmod(t, filepath.Dir(bin.Supervisor), os.ModeSticky|0o777)
		}, ""},
		{"program owned by another user", func(t *testing.T, bin *Binaries) {
			needRoot(t)
			if err := os.Chown(bin.Supervisor, 4242, 4242); err != nil {
				t.Fatal(err)
			}
		}, bin0 + " is owned by uid 4242, not root"},
		{"link from a directory open to others", func(t *testing.T, bin *Binaries) {
			open := filepath.Join(filepath.Dir(bin.Supervisor), "open")
			if err := os.Mkdir(open, 0o777); err != nil {
				t.Fatal(err)
			}
			chmod(t, open, 0o777)
			real := filepath.Join(filepath.Dir(bin.Supervisor), "real")
			if err := os.Rename(bin.Supervisor, real); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(open, "npurun-supervise"), bin.Supervisor); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(real, filepath.Join(open, "npurun-supervise")); err != nil {
				t.Fatal(err)
			}
		}, "/open is writable by others than its owner (mode 0777)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bin := privateBinaries(t)
			tc.setup(t, bin)
			want := strings.NewReplacer(bin0, bin.Supervisor, dir0, filepath.Dir(bin.Supervisor)).Replace(tc.want)
			b := NewBroker(t, taskConfig(1))
			b.Bin = bin
			b.Start()
			if want == "" {
				runsTask(t, b)
				return
			}
			tasksRefused(t, b, want)
		})
	}
	t.Run("missing", func(t *testing.T) {
		if _, err := os.Stat("/usr/local/libexec/npurun/npurun-supervise"); err == nil {
			t.Skip("a supervisor is installed at /usr/local/libexec/npurun: the broker would use it")
		}
		bin := privateBinaries(t)
		if err := os.Remove(bin.Supervisor); err != nil {
			t.Fatal(err)
		}
		b := NewBroker(t, taskConfig(1))
		b.Bin = bin
		b.Start()
		tasksRefused(t, b, "no supervisor program: neither "+bin.Supervisor+" nor /usr/local/libexec/npurun/npurun-supervise exists")
		// Put in place (as make install would), it is found at the next try.
		from := bins(t).Supervisor
		copyFile(t, from, bin.Supervisor, 0o755)
		b.WaitLog(0, "tasks available again")
		runsTask(t, b)
	})
}

// tasksRefused checks that b, whose supervisor program is unusable, serves
// a lease, and refuses a task saying want, in its log, in check-config's
// warnings and to the submitter, with exit status 75.
func tasksRefused(t *testing.T, b *Broker, want string) {
	t.Helper()
	at := b.WaitLog(0, "tasks unavailable: ")
	if log := b.Log()[:at]; !strings.Contains(log, want) {
		t.Errorf("the broker's log does not say %q:\n%s", want, log)
	}
	if out, err := b.Npurun("--", "sh", "-c", `test -n "$NPURUN_DEVICES"`).CombinedOutput(); err != nil {
		t.Errorf("npurun while tasks are unavailable: %v\n%s", err, out)
	}
	// check-config, run from the same place, warns of it and passes.
	out, err := exec.Command(b.Bin.Broker, "check-config", b.Conf).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "[tasks]: warning: ") || !strings.Contains(string(out), want) {
		t.Errorf("check-config: %v; want a warning saying %q; output:\n%s", err, want, out)
	}
	out, err = b.TaskSubmit("--no-device", "--log", filepath.Join(SharedDir(t), "log"), "--", "true").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 75 || !strings.Contains(string(out), "tasks are unavailable: ") || !strings.Contains(string(out), want) {
		t.Errorf("task-submit while tasks are unavailable: %v; want exit 75 saying %q; output:\n%s", err, want, out)
	}
}

// runsTask checks that a task submitted to b runs, and runs its command.
func runsTask(t *testing.T, b *Broker) {
	t.Helper()
	dir := SharedDir(t)
	log := filepath.Join(dir, "log")
	id := submitTask(t, b, nil, dir, "--no-device", "--log", log, "--", "echo", "ran")
	waitTask(t, b, id)
	if ti := showTask(t, b, id); ti.State != "done" {
		t.Errorf("task %d: %s (%s), want done", id, ti.State, ti.Reason)
	}
	if data, err := os.ReadFile(log); err != nil || !strings.Contains(string(data), "ran\n") {
		t.Errorf("the task's log (%v):\n%s", err, data)
	}
}

// Stand-ins for the private binaries' paths in the wanted messages.
const (
	bin0 = "$SUPERVISOR"
	dir0 = "$DIR"
)

func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// TestTaskSupervisorReplaced: the broker runs the supervisor it checked and
// opened at its start, not whatever is at its path later: a program put
// there afterwards (by whoever could) never runs.
func TestTaskSupervisorReplaced(t *testing.T) {
	bin := privateBinaries(t)
	b := NewBroker(t, taskConfig(1))
	b.Bin = bin
	b.Start()
	dir := SharedDir(t)
	marker := filepath.Join(dir, "impostor-ran")
	impostor := filepath.Join(filepath.Dir(bin.Supervisor), "impostor")
	if err := os.WriteFile(impostor, []byte("#!/bin/sh\ntouch "+marker+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(impostor, bin.Supervisor); err != nil {
		t.Fatal(err)
	}
	runsTask(t, b)
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the program put at the supervisor's path ran (%s: %v)", marker, err)
	}
}

// TestTaskIdleSupervisor: once a user's task has started, the broker keeps
// one supervisor idle for that user (running as them, given no task); the
// user's next task runs under it (its command is its child; with control
// groups, it was moved into the task's group first), and another is kept.
// A task started under an idle one (no task id on its command line) is
// adopted by a broker restarted while it runs. A broker that stops lets
// its idle supervisors go. A killed idle supervisor is replaced by a start.
func TestTaskIdleSupervisor(t *testing.T) {
	u := containUser(t)
	b := StartBroker(t, taskConfig(1))
	cg := containedBy(t, b)
	uid := uint32(os.Geteuid())
	if u != nil {
		uid = u.UID
	}
	dir := SharedDir(t)
	if u != nil {
		dir = userDir(t, u, 0o755)
	}
	first := submitTask(t, b, u, dir, "--no-device", "--log", filepath.Join(dir, "first.log"), "--", "true")
	waitTask(t, b, first)
	if ti := showTask(t, b, first); ti.State != "done" {
		t.Fatalf("task %d: %s (%s), want done", first, ti.State, ti.Reason)
	}
	idle := awaitIdle(t, b, uid)
	if n := len(idleOf(b, uid)); n != 1 {
		t.Errorf("%d idle supervisors of uid %d, want 1", n, uid)
	}

	// The next task runs under the idle supervisor: the command's parent.
	fifo, gate := filepath.Join(dir, "ppid"), filepath.Join(dir, "gate")
	makeFIFO(t, fifo)
	makeFIFO(t, gate)
	second := submitTask(t, b, u, dir, "-d", "0", "--log", filepath.Join(dir, "second.log"), "--",
		"sh", "-c", `echo $PPID > "$1"; read x < "$2"; exit 0`, "sh", fifo, gate)
	t.Cleanup(func() {
		if t.Failed() {
			ti := showTask(t, b, second)
			log, _ := os.ReadFile(filepath.Join(dir, "second.log"))
			t.Logf("task %d: %+v; log:\n%s", second, ti, log)
		}
	})
	line, err := bufio.NewReader(openFIFO(t, fifo, os.O_RDONLY)).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if ppid, _ := strconv.Atoi(strings.TrimSpace(line)); ppid != idle {
		t.Errorf("task %d's command runs under pid %d, not the idle supervisor %d", second, ppid, idle)
	}
	if cg && !slices.Contains(cgroupProcs(filepath.Join(b.Cgroup, "task-"+idStr(second))), strconv.Itoa(idle)) {
		t.Errorf("the idle supervisor %d was not moved into task %d's control group", idle, second)
	}
	next := awaitIdle(t, b, uid, idle)

	// A restart adopts the task, whose supervisor has no id on its command line.
	b.Kill()
	if !procGone(t, next, "") {
		t.Errorf("the idle supervisor %d outlives its broker", next)
	}
	b.Start()
	b.WaitLog(0, fmt.Sprintf("task %d is still running (supervisor pid %d)", second, idle))
	openFIFO(t, gate, os.O_WRONLY).Close()
	waitTask(t, b, second)
	if ti := showTask(t, b, second); ti.State != "done" {
		t.Errorf("task %d: %s (%s), want done", second, ti.State, ti.Reason)
	}

	// An idle supervisor killed (its user may) is not used: a start is.
	third := submitTask(t, b, u, dir, "--no-device", "--log", filepath.Join(dir, "third.log"), "--", "true")
	waitTask(t, b, third)
	killed := awaitIdle(t, b, uid)
	if err := unix.Kill(killed, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	procGone(t, killed, "")
	fourth := submitTask(t, b, u, dir, "--no-device", "--log", filepath.Join(dir, "fourth.log"), "--", "true")
	waitTask(t, b, fourth)
	if ti := showTask(t, b, fourth); ti.State != "done" {
		t.Errorf("task %d after its user's idle supervisor was killed: %s (%s), want done", fourth, ti.State, ti.Reason)
	}

	// A broker that stops leaves no idle supervisor.
	last := awaitIdle(t, b, uid)
	b.Stop()
	if !procGone(t, last, "") {
		t.Errorf("the idle supervisor %d outlives its broker's stop", last)
	}
}

// TestTaskIdleSupervisorKilledLeaksNothing: an idle supervisor that exits
// while idle (its user may kill it at will) leaves nothing open in the
// broker: its socket is closed when the broker sees it exit, not when the
// garbage collector finalizes it (the broker runs with GOGC=off here, so
// that when a collection happens does not decide the test).
func TestTaskIdleSupervisorKilledLeaksNothing(t *testing.T) {
	b := StartBrokerEnv(t, taskConfig(1), "GOGC=off")
	uid := uint32(os.Geteuid())
	dir := SharedDir(t)
	run := func(name string) {
		t.Helper()
		id := submitTask(t, b, nil, dir, "--no-device", "--log", filepath.Join(dir, name+".log"), "--", "true")
		waitTask(t, b, id)
	}
	run("first")
	idle := awaitIdle(t, b, uid)
	base := socketFDs(b.Pid())
	const kills = 20
	for i := range kills {
		if err := unix.Kill(idle, unix.SIGKILL); err != nil {
			t.Fatal(err)
		}
		procGone(t, idle, "")
		run(strconv.Itoa(i))
		idle = awaitIdle(t, b, uid, idle)
	}
	// One idle supervisor then and now; the connections of task-submit
	// close as the broker reads their end.
	deadline := time.Now().Add(eventTimeout)
	for {
		n := socketFDs(b.Pid())
		if n <= base {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the broker holds %d sockets after %d idle supervisors were killed, %d before", n, kills, base)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// socketFDs counts the sockets open in process pid.
func socketFDs(pid int) int {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	n := 0
	for _, e := range ents {
		if l, _ := os.Readlink(filepath.Join(dir, e.Name())); strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// TestTaskIdleSupervisorOwnGroup: where tasks have control groups, an idle
// supervisor is born in a group of its own (idle-N), not the broker's, so
// that what its user makes it start (through ptrace; here, a process the
// test puts in that group) neither runs in the broker's group nor outlives
// it: it is killed once the supervisor is given its task, or let go (here,
// by the broker's stop), and the group is removed; what a broker killed
// with -9 leaves, the next one removes.
func TestTaskIdleSupervisorOwnGroup(t *testing.T) {
	b := StartBroker(t, taskConfig(1))
	if !containedBy(t, b) {
		t.Skip("no control groups for tasks here (containedBy fails this under CI=true as root)")
	}
	uid := uint32(os.Geteuid())
	dir := SharedDir(t)
	run := func(name string) uint64 {
		t.Helper()
		id := submitTask(t, b, nil, dir, "--no-device", "--log", filepath.Join(dir, name+".log"), "--", "true")
		waitTask(t, b, id)
		if ti := showTask(t, b, id); ti.State != "done" {
			t.Fatalf("task %d: %s (%s), want done", id, ti.State, ti.Reason)
		}
		return id
	}
	// stray puts a process of the test's into idle supervisor pid's group,
	// as one its user made it start would be, and returns that group and
	// the process's pid.
	stray := func(pid int) (string, int) {
		t.Helper()
		group := idleGroupOf(t, b, pid)
		p := exec.Command("sleep", "300")
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		go p.Wait()
		t.Cleanup(func() { p.Process.Kill() })
		if err := os.WriteFile(filepath.Join(group, "cgroup.procs"), []byte(strconv.Itoa(p.Process.Pid)), 0o644); err != nil {
			t.Fatal(err)
		}
		return group, p.Process.Pid
	}

	run("first")
	idle := awaitIdle(t, b, uid)
	group, pid := stray(idle)
	second := run("second") // under the idle supervisor
	if !procGone(t, pid, "sleep") {
		t.Errorf("a process in idle supervisor %d's group %s outlived its taking by task %d", idle, group, second)
	}
	awaitNoDir(t, group)

	next := awaitIdle(t, b, uid, idle)
	group, pid = stray(next)
	b.Stop()
	if !procGone(t, pid, "sleep") {
		t.Errorf("a process in idle supervisor %d's group %s outlived the broker's stop", next, group)
	}
	// A clean stop removes the groups itself: nobody else will until the
	// next start.
	if left := idleGroups(t, b); len(left) > 0 {
		t.Errorf("the broker's clean stop left idle supervisors' groups: %s", strings.Join(left, ", "))
	}

	// A broker killed with -9 removes nothing: the next one does.
	b.Start()
	run("third")
	last := awaitIdle(t, b, uid)
	group, pid = stray(last)
	b.Kill()
	b.Start()
	if !procGone(t, pid, "sleep") {
		t.Errorf("a process in group %s, left by a broker killed with -9, outlived the next broker's start", group)
	}
	awaitNoDir(t, group)
}

// idleGroups lists the idle-N groups under b's control group parent.
func idleGroups(t *testing.T, b *Broker) []string {
	t.Helper()
	ents, err := os.ReadDir(b.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "idle-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// idleGroupOf is the idle-N group under b's control group parent that
// holds pid, or fails.
func idleGroupOf(t *testing.T, b *Broker, pid int) string {
	t.Helper()
	ents, err := os.ReadDir(b.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if d := filepath.Join(b.Cgroup, e.Name()); strings.HasPrefix(e.Name(), "idle-") && slices.Contains(cgroupProcs(d), strconv.Itoa(pid)) {
			return d
		}
	}
	own, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	t.Fatalf("idle supervisor %d is in no idle-N group under %s: /proc/%d/cgroup says %s", pid, b.Cgroup, pid, own)
	return ""
}

// awaitNoDir waits for the broker to remove directory d (a control group
// whose last process is dying: nothing announces its removal but its
// absence, which is polled).
func awaitNoDir(t *testing.T, d string) {
	t.Helper()
	deadline := time.Now().Add(eventTimeout)
	for {
		if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is still there after %s", d, eventTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestTaskUmask: a task's command makes its files with its submitter's
// umask, as it would have run in the submitter's shell, not the broker's.
func TestTaskUmask(t *testing.T) {
	b := StartBroker(t, taskConfig(1))
	dir := SharedDir(t)
	for _, tc := range []struct {
		mask string
		want os.FileMode
	}{{"077", 0o600}, {"002", 0o664}, {"022", 0o644}} {
		made := filepath.Join(dir, "made-"+tc.mask)
		cmd := b.TaskSubmit("--json", "--no-device", "--log", filepath.Join(dir, tc.mask+".log"), "--", "touch", made)
		cmd.Args = append([]string{"sh", "-c", "umask " + tc.mask + `; exec "$0" "$@"`}, cmd.Args...)
		cmd.Path = "/bin/sh"
		out, err := cmd.Output()
		var s struct {
			ID uint64 `json:"id"`
		}
		if err != nil || json.Unmarshal(out, &s) != nil || s.ID == 0 {
			t.Fatalf("task-submit under umask %s: %v; printed %q", tc.mask, err, out)
		}
		waitTask(t, b, s.ID)
		st, err := os.Stat(made)
		if err != nil {
			t.Fatalf("task %d under umask %s: %v (%+v)", s.ID, tc.mask, err, showTask(t, b, s.ID))
		}
		if st.Mode().Perm() != tc.want {
			t.Errorf("task %d, submitted under umask %s, made %s with mode %04o, want %04o", s.ID, tc.mask, made, st.Mode().Perm(), tc.want)
		}
	}
}
