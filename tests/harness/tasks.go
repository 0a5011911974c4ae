package harness

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/wire"
)

// ContainedBy tells which containment b's tasks have: their control groups
// (true) or the supervisor's and session's (false). As root under CI=true
// the control groups must be the one exercised: a machine without cgroup
// v2 fails the test rather than skipping what it is there for.
func ContainedBy(t *testing.T, b *Broker) bool {
	t.Helper()
	if b.Cgroup != "" {
		b.WaitLog(0, "each task runs in a control group of its own under "+b.Cgroup)
		return true
	}
	if os.Getenv("CI") == "true" && os.Geteuid() == 0 {
		t.Fatal("CI=true as root, and this machine has no cgroup v2 with cgroup.kill: tasks' control groups are not exercised")
	}
	b.WaitLog(0, "tasks have no control group of their own")
	t.Log("no control groups for tasks here: the supervisor's containment is exercised")
	return false
}

// ContainUser is the user the containment tests submit as: a test user as
// root, the test process otherwise.
func ContainUser(t *testing.T) *TestUser {
	if os.Geteuid() != 0 {
		return nil
	}
	u := NewUser(t)
	return &u
}

// Escaped reads the pid an escaping workload writes to the FIFO at path.
func Escaped(t *testing.T, path string) int {
	t.Helper()
	f := OpenFIFO(t, path, os.O_RDONLY)
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		t.Fatalf("read the escaped process's pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("escaped pid %q: %v", line, err)
	}
	return pid
}

// Gone tells whether pid is gone (a zombie counts as gone).
func Gone(pid int) bool {
	state, _ := ProcState(pid)
	return state == 0 || state == 'Z' || state == 'X'
}

// AwaitRemoved waits for the control group dir to be removed, woken by
// inotify on its parent; it fails the test if that does not happen within
// EventTimeout.
func AwaitRemoved(t *testing.T, dir string) {
	t.Helper()
	ifd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ifd)
	if _, err := unix.InotifyAddWatch(ifd, filepath.Dir(dir), unix.IN_DELETE); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(EventTimeout)
	buf := make([]byte, 4096)
	for {
		if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
			return
		}
		ms := int(time.Until(deadline) / time.Millisecond)
		if ms <= 0 {
			t.Fatalf("control group %s still there %s after its task ended (processes: %v)", dir, EventTimeout, CgroupProcs(dir))
		}
		if n, _ := unix.Poll([]unix.PollFd{{Fd: int32(ifd), Events: unix.POLLIN}}, ms); n > 0 {
			unix.Read(ifd, buf)
		}
	}
}

// WithoutHook is env without NPUBROKER_TEST_HOOK: the next broker stops
// nowhere.
func WithoutHook(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "NPUBROKER_TEST_HOOK=") {
			out = append(out, kv)
		}
	}
	return out
}

// TaskConfig is n fake devices and [tasks] settings that keep the tests
// fast: four CPU slots and a one-second kill grace.
func TaskConfig(n int) string {
	return FakeConfig(n) + "[tasks]\ncpu_slots = 4\nkill_grace = \"1s\"\n"
}

// TaskResult is a finished task-submit invocation.
type TaskResult struct {
	Code           int
	Stdout, Stderr string
}

func (r TaskResult) String() string {
	return fmt.Sprintf("exit %d; stdout:\n%s\nstderr:\n%s", r.Code, r.Stdout, r.Stderr)
}

// RunTaskCmd runs cmd to completion with its outputs kept apart.
func RunTaskCmd(t testing.TB, cmd *exec.Cmd) TaskResult {
	t.Helper()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatalf("%v: %v", cmd.Args, err)
	}
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(EventTimeout):
		cmd.Process.Kill()
		<-done
		t.Fatalf("%v did not end within %s; stdout:\n%s\nstderr:\n%s", cmd.Args, EventTimeout, out.String(), errb.String())
	}
	r := TaskResult{Stdout: out.String(), Stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	default:
		t.Fatalf("%v: %v", cmd.Args, err)
	}
	return r
}

// AsUser makes cmd run as u (or as the test process when u is nil) in dir,
// with extra supplementary groups.
func AsUser(cmd *exec.Cmd, u *TestUser, dir string, groups ...uint32) *exec.Cmd {
	if u != nil {
		u.As(cmd, dir)
		cmd.SysProcAttr.Credential.Groups = groups
	}
	cmd.Dir = dir
	return cmd
}

// SubmitTask runs `task-submit --json ARGS` as u (nil: the test process)
// in dir and returns the new task's id; any failure fails the test.
func SubmitTask(t testing.TB, b *Broker, u *TestUser, dir string, args ...string) uint64 {
	t.Helper()
	r := RunTaskCmd(t, AsUser(b.TaskSubmit(append([]string{"--json"}, args...)...), u, dir))
	if r.Code != 0 {
		t.Fatalf("task-submit %q: %s", args, r)
	}
	var s struct {
		ID uint64 `json:"id"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &s); err != nil || s.ID == 0 {
		t.Fatalf("task-submit --json printed %q: %v", r.Stdout, err)
	}
	return s.ID
}

// ShowTask is `task-submit show --json ID` as the test process.
func ShowTask(t testing.TB, b *Broker, id uint64) wire.TaskInfo {
	t.Helper()
	r := RunTaskCmd(t, b.TaskSubmit("show", "--json", strconv.FormatUint(id, 10)))
	if r.Code != 0 {
		t.Fatalf("show %d: %s", id, r)
	}
	var ti wire.TaskInfo
	if err := json.Unmarshal([]byte(r.Stdout), &ti); err != nil {
		t.Fatalf("show --json %d printed %q: %v", id, r.Stdout, err)
	}
	return ti
}

// ListTasks is `task-submit list [--all] --json` as u (nil: the test
// process).
func ListTasks(t testing.TB, b *Broker, u *TestUser, all bool) []wire.TaskInfo {
	t.Helper()
	args := []string{"list", "--json"}
	if all {
		args = append(args, "--all")
	}
	r := RunTaskCmd(t, AsUser(b.TaskSubmit(args...), u, "/"))
	if r.Code != 0 {
		t.Fatalf("list: %s", r)
	}
	var ts []wire.TaskInfo
	if err := json.Unmarshal([]byte(r.Stdout), &ts); err != nil {
		t.Fatalf("list --json printed %q: %v", r.Stdout, err)
	}
	return ts
}

// FindTask is the task with id in ts, nil if none.
func FindTask(ts []wire.TaskInfo, id uint64) *wire.TaskInfo {
	for i := range ts {
		if ts[i].ID == id {
			return &ts[i]
		}
	}
	return nil
}

// WaitTask is `task-submit wait ID` as the test process: the task's exit
// status as wait gives it.
func WaitTask(t testing.TB, b *Broker, id uint64) TaskResult {
	t.Helper()
	return RunTaskCmd(t, b.TaskSubmit("wait", strconv.FormatUint(id, 10)))
}

// MakeFIFO makes a named pipe at path that anyone may open.
func MakeFIFO(t testing.TB, path string) {
	t.Helper()
	if err := unix.Mkfifo(path, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
}

// OpenFIFO opens a named pipe in flag's direction, which blocks until a
// process opens the other end: the event that a task has got that far.
// It fails the test if none does within EventTimeout.
func OpenFIFO(t testing.TB, path string, flag int) *os.File {
	t.Helper()
	type res struct {
		f   *os.File
		err error
	}
	ch := make(chan res, 1)
	go func() {
		f, err := os.OpenFile(path, flag, 0)
		ch <- res{f, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		t.Cleanup(func() { r.f.Close() })
		return r.f
	case <-time.After(EventTimeout):
		// Open the other end ourselves so that the blocked open returns.
		other := os.O_RDONLY | syscall.O_NONBLOCK
		if flag&(os.O_WRONLY|os.O_RDWR) == 0 {
			other = os.O_RDWR
		}
		if f, err := os.OpenFile(path, other, 0); err == nil {
			defer f.Close()
		}
		if r := <-ch; r.f != nil {
			r.f.Close()
		}
		t.Fatalf("nobody opened the other end of %s within %s", path, EventTimeout)
		return nil
	}
}

// UserDir makes a directory owned by u (or the test process, u nil) with
// the given mode, in a directory every user can enter.
func UserDir(t testing.TB, u *TestUser, mode os.FileMode) string {
	t.Helper()
	dir := filepath.Join(SharedDir(t), "home")
	if err := os.Mkdir(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	if u != nil {
		if err := os.Chown(dir, int(u.UID), int(u.GID)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// ProcGone waits up to EventTimeout for process pid to be gone (a zombie
// counts as gone) and tells whether it went. comm, when not empty, is the
// process's name: a process of another name under that pid is a reuse,
// so the original is gone.
func ProcGone(t testing.TB, pid int, comm string) bool {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return true
	}
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	defer unix.Close(fd)
	if state, name := ProcState(pid); state == 'Z' || state == 'X' || state == 0 || (comm != "" && name != comm) {
		return true
	}
	// A pidfd is readable once the process has exited.
	n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(EventTimeout/time.Millisecond))
	return err == nil && n == 1
}

// ProcState is a process's state letter and name from /proc/PID/stat; 0
// when it does not exist.
func ProcState(pid int) (byte, string) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, ""
	}
	s := string(data)
	open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || close < open || close+2 >= len(s) {
		return 0, ""
	}
	return s[close+2], s[open+1 : close]
}

// GroupMembers lists the live (not zombie) processes of process group pgid.
func GroupMembers(pgid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(data)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:]) // state ppid pgrp …
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, _ := strconv.Atoi(f[2]); g == pgid {
			out = append(out, pid)
		}
	}
	return out
}

// ReadInt reads a decimal number from a file a task wrote.
func ReadInt(t testing.TB, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatalf("%s: %q: %v", path, data, err)
	}
	return n
}

// IDStr is a task id as a command-line argument.
func IDStr(id uint64) string { return strconv.FormatUint(id, 10) }

// AwaitExit waits up to d for the process of pidfd to exit, and tells
// whether it did. (poll(2) is not restarted after a signal handler, and
// the Go runtime's preemption signal interrupts it.)
func AwaitExit(pidfd int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left < 0 {
			return false
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}, int(left/time.Millisecond)+1)
		if err == nil && n == 1 {
			return true
		}
		if err != nil && err != unix.EINTR {
			return false
		}
	}
}

// supProc is a running npurun-supervise of the tests' binaries.
type supProc struct {
	PID  int
	PPID int // its broker's pid while that broker lives
	uid  uint32
	ID   string // the task id on its command line; "" for one started idle
	Idle bool   // started idle and given no task yet: its standard input is still the broker's socket
}

// Supervisors lists the running supervisors started from b's binaries:
// processes whose executable is bin.Supervisor (the broker runs it from
// the file it opened at its start, so /proc/PID/exe names that file).
// A supervisor's own child is not one: between its fork and the exec of
// the task's command (the log says "task N started" just before the
// fork) it has the supervisor's executable and command line, and is
// soon the command (TestTaskSupervisorTermWhileReporting took it for
// the supervisor, and found it gone once the task had ended).
func Supervisors(bin *Binaries) []supProc {
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
		if st, _ := ProcState(pid); st == 'Z' || st == 0 {
			continue
		}
		data, _ := os.ReadFile(dir + "/cmdline")
		args := strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
		if len(args) == 0 || args[0] != "npurun-supervise" {
			continue
		}
		p := supProc{PID: pid, PPID: procPPID(pid)}
		if len(args) > 1 {
			p.ID = args[1]
		}
		var st unix.Stat_t
		if unix.Stat(dir, &st) == nil {
			p.uid = st.Uid
		}
		fd0, _ := os.Readlink(dir + "/fd/0")
		p.Idle = p.ID == "" && strings.HasPrefix(fd0, "socket:")
		out = append(out, p)
	}
	sup := map[int]bool{}
	for _, p := range out {
		sup[p.PID] = true
	}
	return slices.DeleteFunc(out, func(p supProc) bool { return sup[p.PPID] })
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

// IdleOf lists b's idle supervisors of uid (its children: other tests'
// brokers run the same program, and a test user's uid may be used again).
func IdleOf(b *Broker, uid uint32) []int {
	var out []int
	for _, p := range Supervisors(b.Bin) {
		if p.Idle && p.uid == uid && p.PPID == b.Pid() {
			out = append(out, p.PID)
		}
	}
	return out
}

// AwaitIdle waits for an idle supervisor of b for uid other than the pids
// in not, and returns its pid. The broker starts one once a task of uid
// has started; nothing announces it but /proc, which is polled.
func AwaitIdle(t testing.TB, b *Broker, uid uint32, not ...int) int {
	t.Helper()
	deadline := time.Now().Add(EventTimeout)
	for {
		for _, pid := range IdleOf(b, uid) {
			if !slices.Contains(not, pid) {
				return pid
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no idle supervisor of uid %d within %s; supervisors: %+v", uid, EventTimeout, Supervisors(b.Bin))
		}
		time.Sleep(5 * time.Millisecond)
	}
}
