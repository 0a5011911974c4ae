package shim

import (
	"io"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/npurun/npurun/internal/exitcode"
	"github.com/npurun/npurun/wire"
)

// TestWaitChildEndedReason: when the broker ends the lease of a
// placeholder job's npurun, npurun says the broker's reason (Slurm gave
// the devices to another job, say), where it used to say "was cancelled
// (scancel, its time limit or preemption)" whatever the reason; a broker
// that gives none is still told by the old word. The exit status is
// exitcode.SlurmEnded either way.
func TestWaitChildEndedReason(t *testing.T) {
	for _, c := range []struct {
		name  string
		ended wire.Reply
		want  string
		not   string
	}{
		{"the broker's reason", wire.Reply{Type: wire.TypeEnded, SlurmJob: 12, Message: "Slurm gave its devices to job 13 of bob"},
			"npurun: slurm job 12: the command was ended: Slurm gave its devices to job 13 of bob\n", "cancelled"},
		{"no reason", wire.Reply{Type: wire.TypeEnded, SlurmJob: 12},
			"npurun: slurm job 12 was cancelled (scancel, its time limit or preemption): the command was ended\n", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{})
			if err != nil {
				t.Fatal(err)
			}
			got, code := captureStderr(t, func() int { return waitChild(pid, &c.ended) })
			if code != exitcode.SlurmEnded || got != c.want || (c.not != "" && strings.Contains(got, c.not)) {
				t.Errorf("waitChild: exit %d, said %q; want %d, %q", code, got, exitcode.SlurmEnded, c.want)
			}
		})
	}
}

// captureStderr runs f with os.Stderr a pipe, and returns what f wrote
// there and what it returned.
func captureStderr(t *testing.T, f func() int) (string, int) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	saved := os.Stderr
	os.Stderr = w
	code := f()
	os.Stderr = saved
	w.Close()
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}
