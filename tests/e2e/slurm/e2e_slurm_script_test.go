package slurm

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// slurmScriptEnv is the environment slurmd gives its Prolog (and, with
// epilog_slurmd, its Epilog) for job 42 of alice on gres positions 0,1.
func slurmScriptEnv(context, gres string) []string {
	env := []string{"PATH=/usr/bin:/bin", "SLURM_SCRIPT_CONTEXT=" + context, "SLURM_JOB_ID=42", "SLURM_JOB_UID=1001",
		"SLURM_JOB_USER=alice", "SLURMD_NODENAME=box"}
	if gres != "" {
		env = append(env, "SLURM_JOB_GPUS="+gres, "CUDA_VISIBLE_DEVICES="+gres)
	}
	return env
}

// runScript runs npurun-slurm with env and args; it returns the exit
// status, standard error and how long it took.
func runScript(t *testing.T, env []string, args ...string) (int, string, time.Duration) {
	t.Helper()
	cmd := exec.Command(harness.Bins(t).Slurm, args...)
	cmd.Env = env
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), took
}

// TestSlurmScriptTellsBroker: as the Prolog, npurun-slurm sends the job
// as slurmd describes it (id, uid, user, gres positions) and logs the
// broker's answer; as the Epilog, the job's end. SLURM_SCRIPT_CONTEXT
// picks which, since slurm.conf's Prolog= takes no arguments.
func TestSlurmScriptTellsBroker(t *testing.T) {
	stub := harness.StartStub(t, func(r harness.StubRequest) harness.StubAnswer {
		if r.Req.Op == wire.OpSlurmProlog {
			return harness.StubAnswer{Replies: []wire.Reply{{Type: wire.TypeQueued, Reason: "npu 5 still held by job 41"},
				{Type: wire.TypeOK, Devices: []int{4, 5}, Message: "job 42 of alice holds npu 4-5"}}}
		}
		return harness.StubAnswer{Replies: []wire.Reply{{Type: wire.TypeOK, Message: "job 42's lease of npu 4-5 ended"}}}
	})
	env := append(slurmScriptEnv("prolog_slurmd", "0,1"), "NPURUN_SOCKET="+stub.Socket)
	code, out, _ := runScript(t, env)
	if code != 0 || out != "npurun-slurm: job 42 of alice holds npu 4-5\n" {
		t.Errorf("prolog: exit %d, output %q", code, out)
	}
	env = append(slurmScriptEnv("epilog_slurmd", "0,1"), "NPURUN_SOCKET="+stub.Socket)
	code, out, _ = runScript(t, env)
	if code != 0 || out != "npurun-slurm: job 42's lease of npu 4-5 ended\n" {
		t.Errorf("epilog: exit %d, output %q", code, out)
	}
	// A job without devices is none of npurun's: nothing is asked.
	env = append(slurmScriptEnv("prolog_slurmd", ""), "NPURUN_SOCKET="+stub.Socket)
	if code, out, _ = runScript(t, env); code != 0 || out != "" {
		t.Errorf("prolog of a job without gres: exit %d, output %q", code, out)
	}
	reqs := stub.Requests()
	if len(reqs) != 2 {
		t.Fatalf("the stub got %d requests, want 2: %+v", len(reqs), reqs)
	}
	want := []wire.SlurmJob{{ID: 42, UID: 1001, User: "alice", GRES: "0,1"}, {ID: 42, UID: 1001, GRES: "0,1"}}
	for i, op := range []string{wire.OpSlurmProlog, wire.OpSlurmEpilog} {
		r := reqs[i].Req
		if r.V != wire.Version || r.Op != op || r.Job == nil || *r.Job != want[i] {
			t.Errorf("request %d: %+v (job %+v), want op %s, job %+v", i, r, r.Job, op, want[i])
		}
	}
}

// TestSlurmScriptNeverFails: whatever npurun's trouble — no broker, a
// broker that refuses or does not answer, a broken environment, a wrong
// argument in slurm.conf — the Prolog and Epilog exit 0 (a failed Prolog
// drains the node), within their time limit, saying why; outside a
// Prolog or Epilog a wrong argument is a usage error.
func TestSlurmScriptNeverFails(t *testing.T) {
	refusing := harness.StartStub(t, func(harness.StubRequest) harness.StubAnswer {
		return harness.StubAnswer{Replies: []wire.Reply{{Type: wire.TypeError, Code: wire.CodeBadRequest, Message: `unknown op "slurm-prolog"`}}}
	})
	silent := harness.StartStub(t, func(harness.StubRequest) harness.StubAnswer { return harness.StubAnswer{} })
	nowhere := filepath.Join(t.TempDir(), "none.sock")
	for _, tc := range []struct {
		name  string
		env   []string
		args  []string
		code  int
		want  string
		under time.Duration
	}{
		{"no broker", slurmScriptEnv("prolog_slurmd", "0,1"), []string{"--socket", nowhere}, 0,
			"npurun-slurm: job 42 of alice on gres 0,1: no broker at " + nowhere + ": no such file: the job runs without npurun's lease\n", 5 * time.Second},
		{"refused", slurmScriptEnv("prolog_slurmd", "0,1"), []string{"--socket=" + refusing.Socket}, 0,
			`npurun-slurm: job 42 of alice on gres 0,1: the broker refused: unknown op "slurm-prolog": the job runs without npurun's lease` + "\n", 5 * time.Second},
		{"silent", slurmScriptEnv("prolog_slurmd", "0,1"), []string{"prolog", "--socket", silent.Socket, "--timeout", "1s"}, 0,
			"npurun-slurm: job 42 of alice on gres 0,1: no answer from the broker at " + silent.Socket + " within 1s: the job runs without npurun's lease\n", 4 * time.Second},
		{"silent epilog", slurmScriptEnv("epilog_slurmd", "0,1"), []string{"--socket", silent.Socket, "--timeout", "1s"}, 0,
			"npurun-slurm: end of job 42: no answer from the broker at " + silent.Socket + " within 1s\n", 4 * time.Second},
		{"no job id", []string{"SLURM_SCRIPT_CONTEXT=prolog_slurmd", "SLURM_JOB_GPUS=0"}, []string{"--socket", nowhere}, 0,
			`npurun-slurm: SLURM_JOB_ID="" is not a job id: not run by slurmd as its Prolog or Epilog?` + "\n", 5 * time.Second},
		{"bad argument in slurmd", slurmScriptEnv("prolog_slurmd", "0,1"), []string{"--sockt", nowhere}, 0,
			`npurun-slurm: unknown argument "--sockt"` + "\n", 5 * time.Second},
		{"bad argument by hand", []string{"PATH=/usr/bin:/bin"}, []string{"--timeout", "soon"}, 2,
			`npurun-slurm: --timeout "soon": want a duration such as 30s`, 5 * time.Second},
		{"by hand, no mode", []string{"PATH=/usr/bin:/bin"}, nil, 2,
			`npurun-slurm: prolog or epilog? (SLURM_SCRIPT_CONTEXT is "")`, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, took := runScript(t, tc.env, tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d; output:\n%s", code, tc.code, out)
			}
			if tc.code == 0 && out != tc.want || tc.code != 0 && !strings.HasPrefix(out, tc.want) {
				t.Errorf("output:\n%q\nwant:\n%q", out, tc.want)
			}
			if tc.code != 0 && !strings.Contains(out, "Usage:") {
				t.Errorf("a usage error without the usage:\n%s", out)
			}
			if took > tc.under {
				t.Errorf("took %s, want under %s", took, tc.under)
			}
		})
	}
	// The current broker, which serves no Slurm node yet, answers the
	// Prolog with an error: the job runs on.
	b := harness.StartBroker(t, harness.FakeConfig(2))
	code, out, _ := runScript(t, append(slurmScriptEnv("prolog_slurmd", "0"), "NPURUN_SOCKET="+b.Socket))
	if code != 0 || !strings.Contains(out, "npurun-slurm: job 42 of alice on gres 0: the broker refused:") {
		t.Errorf("prolog against a broker without Slurm: exit %d, output %q", code, out)
	}
}
