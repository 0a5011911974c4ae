package slurm

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// TestSlurmHarness: the private Slurm runs an sbatch --gres=gpu:2 job,
// whose Prolog (root, in slurmd, before the job) sees the job's devices as
// gres.conf positions, and the job itself sees them too; the cluster
// stops leaving nothing behind.
func TestSlurmHarness(t *testing.T) {
	harness.NeedSlurm(t)
	dir := harness.SharedDir(t)
	prolog := filepath.Join(dir, "prolog.sh")
	if err := os.WriteFile(prolog, []byte("#!/bin/sh\nenv > "+dir+"/prolog.$SLURM_JOB_ID\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := harness.StartSlurm(t, harness.SlurmOptions{Devices: 4, GresType: "910b", Prolog: prolog})
	u := harness.NewUser(t)
	id := c.Sbatch(&u, "--wait", "--gres=gpu:2", "--wrap", "echo JOB uid=$(id -u) gpus=$SLURM_JOB_GPUS cuda=$CUDA_VISIBLE_DEVICES")
	penv, err := os.ReadFile(filepath.Join(dir, "prolog."+strconv.FormatUint(uint64(id), 10)))
	if err != nil {
		t.Fatalf("the Prolog left nothing: %v\n%s", err, c.Logs())
	}
	for _, want := range []string{"SLURM_JOB_GPUS=0,1\n", "SLURM_SCRIPT_CONTEXT=prolog_slurmd\n", fmt.Sprintf("SLURM_JOB_UID=%d\n", u.UID),
		"SLURM_JOB_USER=" + u.Name + "\n", fmt.Sprintf("SLURM_JOB_ID=%d\n", id)} {
		if !bytes.Contains(penv, []byte(want)) {
			t.Errorf("the Prolog's environment lacks %q:\n%s", want, penv)
		}
	}
	if got, want := strings.TrimSpace(c.JobOutput(id)), fmt.Sprintf("JOB uid=%d gpus=0,1 cuda=0,1", u.UID); got != want {
		t.Errorf("the job wrote %q, want %q", got, want)
	}
	c.Stop()
	for _, d := range c.Daemons {
		select {
		case <-d.Done:
		default:
			t.Errorf("%s still runs after the cluster stopped", d.Name)
		}
	}
	c.Daemons = nil
}
