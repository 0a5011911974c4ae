package lease

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// TestLeaseLooksUpNoShell: an npurun's request, on its way to a grant,
// makes the broker ask the user database for the user's name and groups
// but not for their login shell, which only a task's --run needs and which
// costs a getent, a fork and an exec: 3 ms of the start of every npurun
// whose user the broker had not seen for 30 s (issue 9). A task's --run
// still runs in the shell getent names.
func TestLeaseLooksUpNoShell(t *testing.T) {
	real, err := exec.LookPath("getent")
	if err != nil {
		t.Skip("no getent here")
	}
	dir := harness.SharedDir(t)
	calls := filepath.Join(dir, "getent-calls")
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	wrapper := "#!/bin/sh\necho \"$*\" >> " + calls + "\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "getent"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	b := harness.StartBrokerEnv(t, harness.FakeConfig(1), "PATH="+bin+":"+os.Getenv("PATH"))
	if code, out := harness.ExitCode(t, b.Npurun("true")); code != 0 {
		t.Fatalf("npurun true: exit %d: %s", code, out)
	}
	if got, err := os.ReadFile(calls); err == nil {
		t.Errorf("the broker ran getent %q for an npurun's lease", strings.TrimSpace(string(got)))
	}

	id := harness.SubmitTask(t, b, nil, dir, "--log", filepath.Join(dir, "log"), "--run", "true")
	if r := harness.WaitTask(t, b, id); r.Code != 0 {
		t.Fatalf("task %d: %s", id, r)
	}
	got, err := os.ReadFile(calls)
	if err != nil || !strings.Contains(string(got), "passwd "+harness.Me(t)) {
		t.Errorf("the broker did not ask getent for %s's shell for a --run task (calls: %q, %v)", harness.Me(t), got, err)
	}
}
