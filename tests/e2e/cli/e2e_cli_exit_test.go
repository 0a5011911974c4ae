package cli

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
)

// The exit statuses of npurun, task-submit and npubroker's client
// commands are one table (package exitcode, wire.ExitStatus; EXIT
// STATUS in npurun(1), task-submit(1), npubroker(8)). These run the real
// programs into the two states the issue found them to disagree in.

// TestExitConnectionCap: a broker at its connection cap (max_connections,
// its connections held open here) says so and closes the connection; every
// client says the broker's words and exits 75, try again later (issue 27.9:
// task-submit exited 1, npurun 69). The broker's refusal can come before
// or after the client's request went: both are read as the refusal.
func TestExitConnectionCap(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(1)+"[broker]\nmax_connections = 2\n")
	for range 2 {
		// Answered: taken and counted by the broker.
		if _, err := b.Dial().Status(); err != nil {
			t.Fatal(err)
		}
	}
	dir := harness.SharedDir(t)
	for _, tc := range []struct {
		name string
		cmd  *exec.Cmd
	}{
		{"npurun --no-wait", b.Npurun("--no-wait", "true")},
		{"npurun", b.Npurun("true")},
		{"task-submit", b.TaskSubmit("--log", filepath.Join(dir, "log"), "--", "true")},
		{"task-submit list", b.TaskSubmit("list")},
		{"npubroker status", brokerCmd(b, "status")},
		{"npubroker usage", brokerCmd(b, "usage", "--since", "1d")},
		{"npubroker reload", brokerCmd(b, "reload")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cmd.Dir = dir
			for range 3 { // the refusal races the request: try it more than once
				code, out := harness.ExitCode(t, tc.cmd)
				if code != 75 || !strings.Contains(out, "the broker serves at most 2 connections at once") {
					t.Fatalf("exit %d, want 75 and the broker's reason; output:\n%s", code, out)
				}
				tc.cmd = &exec.Cmd{Path: tc.cmd.Path, Args: tc.cmd.Args, Env: tc.cmd.Env, Dir: dir}
			}
		})
	}
}

// TestExitBrokerKilledDuringCall: a broker killed with -9 while a request
// waits for its answer (taken on the socket, not answered: the broker is
// stopped, then killed) makes npubroker's, task-submit's and npurun's
// commands exit 69, no broker, as a broker that is not there does (issue
// 27.9: npubroker reload exited 1).
func TestExitBrokerKilledDuringCall(t *testing.T) {
	dir := harness.SharedDir(t)
	for _, tc := range []struct {
		name string
		args func(b *harness.Broker) *exec.Cmd
	}{
		{"npubroker reload", func(b *harness.Broker) *exec.Cmd { return brokerCmd(b, "reload") }},
		{"npubroker status", func(b *harness.Broker) *exec.Cmd { return brokerCmd(b, "status") }},
		{"npubroker drain", func(b *harness.Broker) *exec.Cmd { return brokerCmd(b, "drain", "npu0") }},
		{"task-submit list", func(b *harness.Broker) *exec.Cmd { return b.TaskSubmit("list") }},
		{"npurun --no-wait", func(b *harness.Broker) *exec.Cmd { return b.Npurun("--no-wait", "true") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := harness.StartBroker(t, harness.FakeConfig(1))
			pid := b.Pid()
			syscall.Kill(pid, syscall.SIGSTOP)
			cmd := tc.args(b)
			cmd.Dir = dir
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			awaitPolling(t, cmd.Process.Pid)
			b.Kill()
			err := cmd.Wait()
			if code := cmd.ProcessState.ExitCode(); code != 69 || !strings.Contains(out.String(), "the broker went away") {
				t.Errorf("exit %d (%v), want 69 and the broker gone; output:\n%s", code, err, out.String())
			}
		})
	}
}

// brokerCmd prepares an npubroker client command against b.
func brokerCmd(b *harness.Broker, args ...string) *exec.Cmd {
	cmd := exec.Command(b.Bin.Broker, args...)
	cmd.Env = b.Env()
	return cmd
}

// awaitPolling waits until a thread of process pid sleeps in poll(2) or
// ppoll(2): a client that has sent its request and waits for the answer
// (the clients poll their socket, and nothing else).
func awaitPolling(t testing.TB, pid int) {
	t.Helper()
	deadline := time.Now().Add(harness.EventTimeout)
	for time.Now().Before(deadline) {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/wchan", pid))
		for _, p := range tasks {
			w, _ := os.ReadFile(p)
			if s := string(w); strings.Contains(s, "poll") && !strings.Contains(s, "epoll") {
				return
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("pid %d never waited in poll for its answer", pid)
}
