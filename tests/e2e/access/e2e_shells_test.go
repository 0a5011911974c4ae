package access

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// sleeperPID reads the pid out of the "SLEEPER=[PID]" that output holds.
func sleeperPID(t *testing.T, output string) int {
	t.Helper()
	_, rest, ok := strings.Cut(output, "SLEEPER=[")
	end := strings.IndexByte(rest, ']')
	if !ok || end < 0 {
		t.Fatalf("no SLEEPER=[PID] in:\n%s", output)
	}
	pid, err := strconv.Atoi(rest[:end])
	if err != nil {
		t.Fatalf("no SLEEPER=[PID] in:\n%s", output)
	}
	return pid
}

// sleeper is a shell command that leaves a process running in a session
// of its own (setsid -f), as a user does with `setsid nohup CMD &`, and
// prints its pid as SLEEPER=[PID].
const sleeper = `setsid -f sh -c 'echo "SLEEPER=[$$]"; exec sleep 1000 </dev/null >/dev/null 2>&1'`

// TestLeaseInShells: npurun SHELL, for bash, zsh and fish as login
// shells (-l -i, where bash marks descriptors 3 to 19 close-on-exec) and
// as interactive ones (-i): an npurun that the shell starts runs in the
// lease (the only device is taken, so asking the broker again would be
// refused), and a process the shell leaves running keeps the device after
// the shell has exited, until it ends.
func TestLeaseInShells(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(1))
	for _, sh := range loginShells {
		for _, mode := range []struct {
			name  string
			flags []string
		}{{"login", []string{"-l", "-i"}}, {"interactive", []string{"-i"}}} {
			t.Run(sh.name+" "+mode.name, func(t *testing.T) {
				path, ok := shellPath(t, sh.name)
				if !ok {
					t.Skipf("no %s here", sh.name)
				}
				script := b.Bin.Npurun + ` -v --no-wait sh -c 'echo "NESTED=[$NPURUN_DEVICES]"'; echo "RC=[` + sh.status + `]"; ` + sleeper
				cmd := b.Npurun(append(append([]string{path}, mode.flags...), "-c", script)...)
				cmd.Env = append(cmd.Env, "HOME="+harness.ShellHome(t))
				code, out := harness.ExitCode(t, cmd)
				pid := sleeperPID(t, out)
				t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
				if code != 0 || !strings.Contains(out, "RC=[0]") || !strings.Contains(out, "NESTED=[0]") || !strings.Contains(out, "inside a lease") {
					t.Errorf("npurun in %s %s: exit %d, want the nested npurun run in the lease (RC=[0], NESTED=[0]); output:\n%s",
						sh.name, strings.Join(mode.flags, " "), code, out)
				}
				// The shell is gone; the process it left holds the lease.
				if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "-d", "0", "true")); code != 75 {
					t.Fatalf("npu 0 after the shell exited, its sleeper (pid %d) running: exit %d, want 75 (held); output:\n%s", pid, code, out)
				}
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				harness.WaitFree(t, b, 0)
			})
		}
	}
}

// TestTaskLeaseInLoginShell: a task whose command is a login bash (bash
// -l -i marks descriptors 3 to 19 close-on-exec) keeps its lease for
// what it runs: an npurun in it runs in the task's lease.
func TestTaskLeaseInLoginShell(t *testing.T) {
	b := harness.StartBroker(t, harness.TaskConfig(1))
	dir := harness.SharedDir(t)
	log := filepath.Join(dir, "log")
	submit := b.TaskSubmit("--json", "--log", log, "--", "bash", "-l", "-i", "-c",
		b.Bin.Npurun+` -v --no-wait sh -c 'echo "NESTED=[$NPURUN_DEVICES]"'`)
	submit.Env = append(submit.Env, "HOME="+harness.ShellHome(t))
	submit.Dir = dir
	r := harness.RunTaskCmd(t, submit)
	if r.Code != 0 {
		t.Fatalf("task-submit: %s", r)
	}
	var task struct {
		ID uint64 `json:"id"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &task); err != nil || task.ID == 0 {
		t.Fatalf("task-submit --json printed %q: %v", r.Stdout, err)
	}
	id := harness.IDStr(task.ID)
	w := harness.WaitTask(t, b, task.ID)
	text, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if w.Code != 0 || !strings.Contains(string(text), "NESTED=[0]") || !strings.Contains(string(text), "inside a lease") {
		t.Errorf("task %s, bash -l -i running npurun: wait %s; want the npurun run in the task's lease; log:\n%s", id, fmt.Sprint(w), text)
	}
}

// TestNestedLeasePlaced: an npurun inside a lease whose descriptor lies
// below 20 (as an older npurun placed it) places it again at 20 and above
// for its command, so that a login bash it runs keeps it for an npurun
// below.
func TestNestedLeasePlaced(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(1))
	// Under the lease: move its descriptor to 3, then npurun bash -l -i.
	script := `fd=${NPURUN_LEASE#*:}
exec 3<&"$fd"
eval "exec $fd<&-"
export NPURUN_LEASE=0:3
exec "$NPURUN" -v bash -l -i -c "\"\$NPURUN\" -v --no-wait sh -c 'echo NESTED=[\$NPURUN_DEVICES] \$NPURUN_LEASE'"`
	cmd := b.Npurun("bash", "-c", script)
	cmd.Env = append(cmd.Env, "HOME="+harness.ShellHome(t), "NPURUN="+b.Bin.Npurun)
	code, out := harness.ExitCode(t, cmd)
	// Both npuruns below the first say they run inside its lease.
	if code != 0 || strings.Count(out, "inside a lease") != 2 || !strings.Contains(out, "NESTED=[0]") {
		t.Fatalf("exit %d, want the innermost npurun run in the lease, placed again at 20 or above; output:\n%s", code, out)
	}
}

// TestPAMLeaseInLoginShell: pam_npurun.so in lease mode (login, su -l)
// holds the login lease in the PAM process and passes its descriptors to
// the session's shell; a login bash that runs npurun keeps them, and the
// npurun runs in the login lease.
func TestPAMLeaseInLoginShell(t *testing.T) {
	dev := harness.NewDevTree(t, 2)
	student := harness.NewUser(t)
	b := harness.StartBroker(t, restrictConf(dev, []harness.TestUser{student}, ""))
	conf := harness.PAMService(t, "npurun-login", "required", "socket="+b.Socket+" lease")
	// As login(1) would run the account's shell: a login bash on the
	// session's environment. -d 0 is the login lease's device, held: asked
	// of the broker, it is busy.
	script := `exec bash -l -i -c '` + b.Bin.Npurun + ` -v --no-wait -d 0 sh -c "echo NESTED=[\$NPURUN_DEVICES]"'`
	cmd := exec.Command(harness.PAMBins(t).Helper, "-confdir", conf, "-service", "npurun-login", "-user", student.Name, "-tty", "tty7", "-run", script)
	cmd.Env = append(harness.PAMHostEnv(t), "NPURUN_SOCKET="+b.Socket, "HOME=/")
	code, out := harness.ExitCode(t, cmd)
	if code != 0 || !strings.Contains(out, "open ok") || !strings.Contains(out, "NESTED=[0]") || !strings.Contains(out, "inside a lease") || !strings.Contains(out, "ran exit 0") {
		t.Fatalf("pamhelper: exit %d, want the login bash's npurun run in the session's lease; output:\n%s", code, out)
	}
}
