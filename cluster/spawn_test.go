package cluster

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/policy"
)

// TestRun runs real commands standing for Slurm's: what they print, how
// they fail, one that hangs past its time, one that is not there.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	script := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	script("sbatch", `echo "4711;cl"; echo "sbatch: noise" >&2; pwd > "$OUT"`)
	script("scontrol", `echo "scontrol: error: Invalid job id specified" >&2; exit 1`)
	script("squeue", `exec sleep 30`)
	script("sinfo", `head -c 3000000 /dev/zero | tr '\0' x >&2; echo; echo "sinfo: error: Unable to contact slurm controller (connect failure)" >&2; exit 1`)
	out := filepath.Join(dir, "pwd")
	s := &Slurm{Env: append(os.Environ(), "OUT="+out)}
	s.Conf.Bin = dir

	id, _, err := s.Submit(&Request{N: 1, Pool: "p", Command: "true"}, dir, "true")
	if err != nil || id != 4711 {
		t.Fatalf("Submit = %d, %v; want 4711", id, err)
	}
	if got, _ := os.ReadFile(out); strings.TrimSpace(string(got)) != dir {
		t.Errorf("sbatch ran in %q, want %q", got, dir)
	}

	err = s.Hold(3)
	var ce *Error
	if !errors.As(err, &ce) || ce.Command != "scontrol" || ce.Msg != "Invalid job id specified" || ce.Down {
		t.Errorf("Hold = %#v, want scontrol's error, not down", err)
	}

	_, err = s.Nodes()
	if !errors.As(err, &ce) || !ce.Down || !strings.Contains(ce.Msg, "Unable to contact slurm controller") {
		t.Errorf("Nodes = %v, want the controller down, from the end of 3 MB of standard error", err)
	}

	s.Timeout = 200 * time.Millisecond
	t0 := time.Now()
	_, err = s.Jobs()
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "no answer within 200ms") {
		t.Errorf("Jobs = %v, want no answer within 200ms", err)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("Jobs took %v: the hanging squeue was not killed at its time", d)
	}

	s.Conf.Bin = filepath.Join(dir, "none")
	// Not there: no controller down (trying again will not help), but
	// what to install.
	if err := s.Cancel(1); err == nil || errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "scancel: not found in ") {
		t.Errorf("Cancel with no scancel = %v, want not found, not unavailable", err)
	}
}

// TestCommandMissingOrTooLong: a Slurm command that is not there is said
// to be missing, with what to install, and is no controller down; one
// whose answer passes the bound is killed and its answer refused.
func TestCommandMissingOrTooLong(t *testing.T) {
	dir := t.TempDir()
	s := &Slurm{Conf: policy.Cluster{Scheduler: "slurm", Bin: dir}}
	_, _, err := s.Submit(&Request{N: 1}, "", "true")
	if err == nil || errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "sbatch: not found in "+dir+" ([cluster] slurm_bin): install Slurm's client commands") {
		t.Errorf("sbatch missing: %v (unavailable: %v)", err, errors.Is(err, ErrUnavailable))
	}
	if _, err := s.Start("", "srun", [3]uintptr{0, 1, 2}); err == nil || !strings.Contains(err.Error(), "srun: not found in "+dir) {
		t.Errorf("srun missing: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "squeue"), []byte("#!/bin/sh\nexec head -c 5000000 /dev/zero\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	defer func(was int) { maxStdout = was }(maxStdout)
	maxStdout = 1 << 20
	if _, err := s.Jobs(); err == nil || !strings.Contains(err.Error(), "squeue: answered more than 1 MiB") {
		t.Errorf("squeue answering 5 MB: %v", err)
	}
}
