package cluster

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestNotifyScript runs the batch script of a task with a notify command
// by /bin/sh, as Slurm's batch step would, and reads what the notify
// command was told, and how the script ended.
func TestNotifyScript(t *testing.T) {
	for _, tc := range []struct {
		name, cmd           string
		term                bool // SIGTERM to the script's process group once the command runs (scancel)
		state, exit, signal string
		status              string // how the script ended
	}{
		{"done", "echo out", false, "done", "0", "", "exit status 0"},
		{"failed", "exit 3", false, "failed", "3", "", "exit status 3"},
		{"killed", "kill -KILL $$", false, "failed", "137", "SIGKILL", "signal: killed"},
		{"cancelled", "touch started; sleep 30", true, "cancelled", "143", "SIGTERM", "signal: terminated"},
		// Slurm's SIGTERM may reach the command and end it before the
		// script has it.
		{"terminated", "kill -TERM $$", false, "cancelled", "143", "SIGTERM", "signal: terminated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			told := filepath.Join(dir, "told")
			script := notifyScript(tc.cmd, "env | grep ^NPURUN_TASK_ | sort > "+ShellJoin([]string{told}), "my job's", "")
			cmd := exec.Command("/bin/sh", "-c", script)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "SLURM_JOB_ID=77")
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if tc.term {
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
					if _, err := os.Stat(filepath.Join(dir, "started")); err == nil {
						break
					}
					if time.Now().After(deadline) {
						t.Fatal("the command did not start within 10s")
					}
				}
				syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
			}
			err := cmd.Wait()
			var ee *exec.ExitError
			got := "exit status 0"
			if errors.As(err, &ee) {
				got = ee.ProcessState.String()
			} else if err != nil {
				t.Fatal(err)
			}
			if got != tc.status {
				t.Errorf("the script ended %q, not %q (as its command did)", got, tc.status)
			}
			data, err := os.ReadFile(told)
			if err != nil {
				t.Fatalf("the notify command did not run: %v", err)
			}
			want := strings.Join([]string{
				"NPURUN_TASK_EXIT=" + tc.exit,
				"NPURUN_TASK_ID=77",
				"NPURUN_TASK_LOG=" + dir + "/slurm-77.out",
				"NPURUN_TASK_NAME=my job's",
				"NPURUN_TASK_SIGNAL=" + tc.signal,
				"NPURUN_TASK_STATE=" + tc.state,
			}, "\n") + "\n"
			if string(data) != want {
				t.Errorf("the notify command was told\n%s\nnot\n%s", data, want)
			}
		})
	}
}
