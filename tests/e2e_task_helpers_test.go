package tests

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/wire"
)

// taskConfig is n fake devices and [tasks] settings that keep the tests
// fast: four CPU slots and a one-second kill grace.
func taskConfig(n int) string {
	return FakeConfig(n) + "[tasks]\ncpu_slots = 4\nkill_grace = \"1s\"\n"
}

// taskResult is a finished task-submit invocation.
type taskResult struct {
	code           int
	stdout, stderr string
}

func (r taskResult) String() string {
	return fmt.Sprintf("exit %d; stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// runTaskCmd runs cmd to completion with its outputs kept apart.
func runTaskCmd(t testing.TB, cmd *exec.Cmd) taskResult {
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
	case <-time.After(eventTimeout):
		cmd.Process.Kill()
		<-done
		t.Fatalf("%v did not end within %s; stdout:\n%s\nstderr:\n%s", cmd.Args, eventTimeout, out.String(), errb.String())
	}
	r := taskResult{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("%v: %v", cmd.Args, err)
	}
	return r
}

// asUser makes cmd run as u (or as the test process when u is nil) in dir,
// with extra supplementary groups.
func asUser(cmd *exec.Cmd, u *testUser, dir string, groups ...uint32) *exec.Cmd {
	if u != nil {
		u.as(cmd, dir)
		cmd.SysProcAttr.Credential.Groups = groups
	}
	cmd.Dir = dir
	return cmd
}

// submitTask runs `task-submit --json ARGS` as u (nil: the test process)
// in dir and returns the new task's id; any failure fails the test.
func submitTask(t testing.TB, b *Broker, u *testUser, dir string, args ...string) uint64 {
	t.Helper()
	r := runTaskCmd(t, asUser(b.TaskSubmit(append([]string{"--json"}, args...)...), u, dir))
	if r.code != 0 {
		t.Fatalf("task-submit %q: %s", args, r)
	}
	var s struct {
		ID uint64 `json:"id"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil || s.ID == 0 {
		t.Fatalf("task-submit --json printed %q: %v", r.stdout, err)
	}
	return s.ID
}

// showTask is `task-submit show --json ID` as the test process.
func showTask(t testing.TB, b *Broker, id uint64) wire.TaskInfo {
	t.Helper()
	r := runTaskCmd(t, b.TaskSubmit("show", "--json", strconv.FormatUint(id, 10)))
	if r.code != 0 {
		t.Fatalf("show %d: %s", id, r)
	}
	var ti wire.TaskInfo
	if err := json.Unmarshal([]byte(r.stdout), &ti); err != nil {
		t.Fatalf("show --json %d printed %q: %v", id, r.stdout, err)
	}
	return ti
}

// listTasks is `task-submit list [--all] --json` as u (nil: the test
// process).
func listTasks(t testing.TB, b *Broker, u *testUser, all bool) []wire.TaskInfo {
	t.Helper()
	args := []string{"list", "--json"}
	if all {
		args = append(args, "--all")
	}
	r := runTaskCmd(t, asUser(b.TaskSubmit(args...), u, "/"))
	if r.code != 0 {
		t.Fatalf("list: %s", r)
	}
	var ts []wire.TaskInfo
	if err := json.Unmarshal([]byte(r.stdout), &ts); err != nil {
		t.Fatalf("list --json printed %q: %v", r.stdout, err)
	}
	return ts
}

// findTask is the task with id in ts, nil if none.
func findTask(ts []wire.TaskInfo, id uint64) *wire.TaskInfo {
	for i := range ts {
		if ts[i].ID == id {
			return &ts[i]
		}
	}
	return nil
}

// waitTask is `task-submit wait ID` as the test process: the task's exit
// status as wait gives it.
func waitTask(t testing.TB, b *Broker, id uint64) taskResult {
	t.Helper()
	return runTaskCmd(t, b.TaskSubmit("wait", strconv.FormatUint(id, 10)))
}

// makeFIFO makes a named pipe at path that anyone may open.
func makeFIFO(t testing.TB, path string) {
	t.Helper()
	if err := unix.Mkfifo(path, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
}

// openFIFO opens a named pipe in flag's direction, which blocks until a
// process opens the other end: the event that a task has got that far.
// It fails the test if none does within eventTimeout.
func openFIFO(t testing.TB, path string, flag int) *os.File {
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
	case <-time.After(eventTimeout):
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
		t.Fatalf("nobody opened the other end of %s within %s", path, eventTimeout)
		return nil
	}
}

// userDir makes a directory owned by u (or the test process, u nil) with
// the given mode, in a directory every user can enter.
func userDir(t testing.TB, u *testUser, mode os.FileMode) string {
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

// procGone waits up to eventTimeout for process pid to be gone (a zombie
// counts as gone) and tells whether it went. comm, when not empty, is the
// process's name: a process of another name under that pid is a reuse,
// so the original is gone.
func procGone(t testing.TB, pid int, comm string) bool {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return true
	}
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	defer unix.Close(fd)
	if state, name := procState(pid); state == 'Z' || state == 'X' || state == 0 || (comm != "" && name != comm) {
		return true
	}
	// A pidfd is readable once the process has exited.
	n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(eventTimeout/time.Millisecond))
	return err == nil && n == 1
}

// procState is a process's state letter and name from /proc/PID/stat; 0
// when it does not exist.
func procState(pid int) (byte, string) {
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

// groupMembers lists the live (not zombie) processes of process group pgid.
func groupMembers(pgid int) []int {
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

// readInt reads a decimal number from a file a task wrote.
func readInt(t testing.TB, path string) int {
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

// idStr is a task id as a command-line argument.
func idStr(id uint64) string { return strconv.FormatUint(id, 10) }
