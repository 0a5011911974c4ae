package lease

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
)

// TestNpurunTime: npurun --time ends its command as a task's limit does:
// SIGTERM once the time has passed since the grant (a shell running it
// sees status 143), SIGKILL after [tasks] kill_grace (1s here) for a
// command that ignores SIGTERM (137); a limit beyond [tasks] max_time is
// refused (status 77).
func TestNpurunTime(t *testing.T) {
	harness.NeedRoot(t)
	b := harness.StartBroker(t, harness.TaskConfig(1)+"max_time = \"1h\"\n")
	run := func(script string) (string, time.Duration) {
		t.Helper()
		cmd := exec.Command("sh", "-c", script)
		cmd.Env = append(b.Env(), "NPURUN="+b.Bin.Npurun)
		t0 := time.Now()
		r := harness.RunTaskCmd(t, cmd)
		return strings.TrimSpace(r.Stdout) + r.Stderr, time.Since(t0)
	}
	for _, tc := range []struct {
		name, cmd, want string
		least, most     time.Duration
	}{
		{"SIGTERM", `"$NPURUN" --time 2s -- sleep 30; echo "status $?"`, "status 143", 2 * time.Second, 5 * time.Second},
		{"SIGKILL after the grace", `"$NPURUN" --time 2s -- sh -c 'trap "" TERM; sleep 30'; echo "status $?"`, "status 137", 3 * time.Second, 6 * time.Second},
	} {
		out, took := run(tc.cmd)
		if !strings.Contains(out, tc.want) || took < tc.least || took > tc.most {
			t.Errorf("%s: %q after %s; want %q after %s to %s", tc.name, out, took.Round(time.Millisecond), tc.want, tc.least, tc.most)
		}
	}
	if log := b.Log(); !strings.Contains(log, "time limit 2s reached") {
		t.Errorf("the broker's log does not say why it ended the leases:\n%s", log)
	}
	out, _ := run(`"$NPURUN" --time 2h -- true; echo "status $?"`)
	if !strings.Contains(out, "status 77") || !strings.Contains(out, "time limit 2h is longer than the 1h allowed") {
		t.Errorf("--time beyond max_time: %q", out)
	}
}
