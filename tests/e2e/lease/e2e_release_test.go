package lease

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
)

// promptly bounds how long a freed device may take to be granted again;
// release is an event (a broker thread blocked in flock), not a poll.
const promptly = 2 * time.Second

// TestReleaseAfterKill: a lease ends when the last process holding its
// descriptor dies, SIGKILL included, and not before.
func TestReleaseAfterKill(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string // the holder's command; prints "held" once it runs
		// stillHeld: killing the process npurun became leaves a child
		// holding the lease, until the whole group is killed.
		stillHeld bool
	}{
		{"exec'd command", `echo held; exec sleep 1000`, false},
		{"background child keeps the lease", `sleep 1000 & echo held; wait`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := harness.StartBroker(t, harness.FakeConfig(2))
			cmd := b.Npurun("-d", "0", "sh", "-c", tc.script)
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			p := harness.StartProc(t, "holder", cmd)
			p.WaitLine("held")
			pid := cmd.Process.Pid // npurun execs: this is the command
			t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL) })
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if _, sig := p.Wait(); sig != syscall.SIGKILL {
				t.Fatalf("holder ended by %v, want SIGKILL", sig)
			}
			if tc.stillHeld {
				if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "-d", "0", "true")); code != 75 {
					t.Fatalf("npu 0 granted while a child of the killed holder still has the lease: exit %d: %s", code, out)
				}
				if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
			start := time.Now()
			if code, out := harness.ExitCode(t, b.Npurun("--timeout", "5s", "-d", "0", "true")); code != 0 {
				t.Fatalf("npu 0 not granted after its holder was killed: exit %d: %s", code, out)
			}
			if d := time.Since(start); d > promptly {
				t.Errorf("npu 0 granted %s after its holder died, want within %s", d, promptly)
			}
		})
	}
}

// TestBrokerKillUnderLoad: the broker is killed with SIGKILL while 40 jobs
// run and wait, and restarted. Waiting npurun reconnect by themselves,
// every job runs, and no device is ever granted twice (the workload's
// O_EXCL markers would say so).
func TestBrokerKillUnderLoad(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(4))
	w := harness.NewWorkload(t)
	const jobs = 40
	var ps []*harness.Proc
	for i := range jobs {
		n := "1"
		if i%7 == 0 {
			n = "2"
		}
		tag := fmt.Sprintf("j%02d", i)
		ps = append(ps, harness.StartProc(t, tag, b.Npurun(append([]string{"-v", "-n", n}, w.Args(b, tag, 30*time.Millisecond)...)...)))
	}
	// Every npurun has heard from the broker (queued or granted) before it
	// is killed: none is left trying its first connection.
	for _, p := range ps {
		p.WaitLine("npurun: ")
	}
	waitRuns(t, w, 6)
	b.Kill()
	if n := len(w.Runs(t)); n >= jobs {
		t.Fatalf("all %d jobs ran before the broker was killed; the test proves nothing", n)
	}
	b.Start()
	for _, p := range ps {
		p.MustSucceed()
		if out := p.Output(); strings.Contains(out, "DOUBLE GRANT") {
			t.Errorf("%s: %s", p.Name, out)
		}
	}
	if n := len(w.Runs(t)); n != jobs {
		t.Fatalf("%d runs logged, want %d", n, jobs)
	}
}

// TestLeaseSurvivesBrokerRestart: a lease granted before a broker crash is
// still a lease after the restart: the new broker grants nothing that is
// held, and frees the device when the holder ends.
func TestLeaseSurvivesBrokerRestart(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(2))
	h := harness.Hold(t, b, "holder", "-d", "0")
	b.Kill()
	b.Start()
	if !strings.Contains(b.Log(), "npu 0 is held by a lease from before this start") {
		t.Errorf("restarted broker did not report the held lease; log:\n%s", b.Log())
	}
	if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "-d", "0", "true")); code != 75 {
		t.Fatalf("npu 0 granted again after a broker restart while its lease is held: exit %d: %s", code, out)
	}
	if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "-d", "1", "true")); code != 0 {
		t.Fatalf("free npu 1 not granted after a restart: exit %d: %s", code, out)
	}
	h.Release()
	if code, out := harness.ExitCode(t, b.Npurun("--timeout", "5s", "-d", "0", "true")); code != 0 {
		t.Fatalf("npu 0 not granted after its lease from before the restart ended: exit %d: %s", code, out)
	}
}

// TestInterruptWaiter: Ctrl-C on a waiting npurun takes it out of the line;
// the next waiter is served when the holder releases, and nothing stays
// locked.
func TestInterruptWaiter(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(1))
	w := harness.NewWorkload(t)
	h := harness.Hold(t, b, "holder")
	first := harness.Queue(t, b, "first", w.Args(b, "first", 0)...)
	second := harness.Queue(t, b, "second", w.Args(b, "second", 0)...)
	logBefore := b.Log()
	if err := first.Cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	// Dying by the signal, or exiting 128+2 after a word, are both fine.
	if code, sig := first.Wait(); sig != syscall.SIGINT && code != 130 {
		t.Fatalf("interrupted waiter ended with exit %d signal %v, want SIGINT or 130; output:\n%s", code, sig, first.Output())
	}
	h.Release()
	second.MustSucceed()
	if got := harness.Tags(w.Runs(t)); len(got) != 1 || got[0] != "second" {
		t.Fatalf("runs %v, want only [second]", got)
	}
	// Nothing is left locked or queued. (--timeout rather than --no-wait:
	// second has exited, but the broker may not have seen it yet.)
	start := time.Now()
	if code, out := harness.ExitCode(t, b.Npurun("--timeout", "5s", "true")); code != 0 {
		t.Fatalf("device not granted after the interrupted waiter: exit %d: %s", code, out)
	}
	if d := time.Since(start); d > promptly {
		t.Errorf("device granted after %s, want within %s", d, promptly)
	}
	// A cancelled wait is routine: the broker has nothing to say about it.
	if extra := strings.TrimPrefix(b.Log(), logBefore); extra != "" {
		t.Errorf("broker logged after the interrupt:\n%s", extra)
	}
}
