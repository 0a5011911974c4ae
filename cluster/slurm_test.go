package cluster

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/npurun/npurun/policy"
)

func TestArgs(t *testing.T) {
	s := &Slurm{Conf: policy.Cluster{Scheduler: "slurm", GRES: "npu", Partition: "npu", Shares: policy.SharesShard, ShardMem: 4096}}
	for _, tc := range []struct {
		name string
		r    Request
		want []string
		err  bool
	}{
		{"none", Request{}, []string{"--partition=npu"}, false},
		{"devices", Request{N: 2}, []string{"--gres=npu:2", "--partition=npu"}, false},
		{"all", Request{N: 1, TimeSec: 61, After: []uint64{3, 4}, Name: "x", Pool: "big", CPUs: 4, Hold: true, Log: "/l", Command: "a\nb"},
			[]string{"--gres=npu:1", "--time=2", "--dependency=afterok:3:4", "--kill-on-invalid-dep=yes", "--job-name=x", "--partition=big", "--cpus-per-task=4", "--hold", "--output=/l", "--comment=a b"}, false},
		{"share", Request{N: 1, Mem: 5000}, []string{"--gres=shard:2", "--partition=npu"}, false},
		{"share of two", Request{N: 2, Mem: 5000}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.Args(&tc.r)
			if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
				t.Errorf("Args = %q, %v; want %q (error %v)", got, err, tc.want, tc.err)
			}
		})
	}
	if c := s.Command(&Request{N: 1, Mem: 5000}, []string{"x"}); !slices.Equal(c, []string{"x"}) {
		t.Errorf("Command with shard shares = %q, want the command alone", c)
	}
	s.Conf.Shares = policy.SharesNone
	if _, err := s.Args(&Request{N: 1, Mem: 100}); err == nil {
		t.Error("--mem taken where the nodes take no shares")
	}
	// shares = "npurun": no GRES; the command runs under the node's npurun.
	s.Conf.Shares = policy.SharesNpurun
	r := Request{N: 2, Mem: 5000}
	if got, err := s.Args(&r); err != nil || !slices.Equal(got, []string{"--partition=npu"}) {
		t.Errorf("Args with npurun shares = %q, %v; want no GRES", got, err)
	}
	if c := s.Command(&r, []string{"python", "a b"}); !slices.Equal(c, []string{"npurun", "--mem=5000M", "-n", "2", "--", "python", "a b"}) {
		t.Errorf("Command with npurun shares = %q", c)
	}
	if c := s.Command(&Request{N: 2}, []string{"x"}); !slices.Equal(c, []string{"x"}) {
		t.Errorf("Command without --mem = %q, want the command alone", c)
	}
}

func TestParseJobs(t *testing.T) {
	data := `{"errors":[],"jobs":[
{"job_id":5,"user_name":"alice","user_id":1001,"name":"wrap","job_state":"FAILED","state_reason":"NonZeroExitCode","nodes":"n1","gres_detail":["npu:2(IDX:1,3)"],"tres_per_node":"gres:npu:2","partition":"npu","comment":"python train.py","current_working_directory":"/home/a","standard_output":"/home/a/o-%j-%u.out","submit_time":100,"start_time":110,"end_time":120,"exit_code":768,"time_limit":60,"priority":10},
{"job_id":6,"user_name":"alice","user_id":1001,"name":"n","job_state":"PENDING","state_reason":"JobHeldUser","nodes":"","gres_detail":[],"partition":"npu","current_working_directory":"/home/a","submit_time":100,"start_time":0,"end_time":0,"exit_code":0,"time_limit":4294967294,"priority":0},
{"job_id":7,"user_name":"bob","user_id":1002,"name":"n","job_state":"PENDING","state_reason":"Priority","partition":"npu","submit_time":100,"priority":5},
{"job_id":8,"user_name":"bob","user_id":1002,"name":"n","job_state":"PENDING","state_reason":"Resources","partition":"npu","submit_time":100,"priority":9}]}`
	jobs, err := parseJobs([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	j := jobs[0]
	if j.ExitStatus() != 3 || !j.Over() || j.Node != "n1" || !slices.Equal(j.Devices, []int{1, 3}) || j.Output != "/home/a/o-5-alice.out" || j.Command != "python train.py" || j.TimeSec != 3600 {
		t.Errorf("job 5 read as %+v", j)
	}
	if !jobs[1].Held || jobs[1].Over() || jobs[1].Output != "/home/a/slurm-6.out" || jobs[1].TimeSec != 0 {
		t.Errorf("job 6 read as %+v", jobs[1])
	}
	if p := Place(jobs, 7); p != 2 {
		t.Errorf("job 7 is %d in line, want 2 (job 8 first by priority, 6 held)", p)
	}
	if p := Place(jobs, 5); p != 0 {
		t.Errorf("an ended job has place %d", p)
	}
	if _, err := parseJobs([]byte(`{"errors":[{"error":"x","description":"y"}],"jobs":[]}`)); err == nil {
		t.Error("squeue's errors taken for no jobs")
	}
}

func TestCommandError(t *testing.T) {
	e := commandError("sbatch", "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)\n")
	if !errors.Is(e, ErrUnavailable) || e.Msg != "Batch job submission failed: Unable to contact slurm controller (connect failure)" {
		t.Errorf("got %+v", e)
	}
	e = commandError("sbatch", "sbatch: error: Invalid generic resource (gres) specification\n")
	if errors.Is(e, ErrUnavailable) {
		t.Errorf("a refused request taken for a controller down: %+v", e)
	}
}

func TestShellJoin(t *testing.T) {
	if got := ShellJoin([]string{"python", "a b.py", "it's", "", "--x=1"}); got != `python 'a b.py' 'it'\''s' '' --x=1` {
		t.Errorf("got %s", got)
	}
}

func TestParseNodes(t *testing.T) {
	nodes := parseNodes([]byte("n1|mixed|npu*|npu:4|npu:2|none\nn2|down|npu*|npu:4|npu:0|test\nn2|down|other|npu:4|npu:0|test\n"))
	if len(nodes) != 2 || nodes[0].Down() || !nodes[1].Down() || nodes[1].Reason != "test" || nodes[0].Partition != "npu" {
		t.Errorf("got %+v", nodes)
	}
}

// TestLoad: a [cluster] table is a login node's; none, no file or a file
// the caller may not read is a box's; a bad table is an error.
func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if s, err := Load(write("login", "[cluster]\nscheduler = \"slurm\"\ngres_name = \"npu\"\n", 0o644)); err != nil || s == nil || s.Conf.GRES != "npu" {
		t.Errorf("login: %+v, %v", s, err)
	}
	if s, err := Load(write("box", "[devices]\nvendor = \"auto\"\n", 0o644)); err != nil || s != nil {
		t.Errorf("box: %+v, %v", s, err)
	}
	if s, err := Load(filepath.Join(dir, "none")); err != nil || s != nil {
		t.Errorf("no file: %+v, %v", s, err)
	}
	if _, err := Load(write("bad", "[cluster]\nscheduler = \"pbs\"\n", 0o644)); err == nil {
		t.Error("a bad [cluster] taken")
	}
	if os.Geteuid() != 0 {
		if s, err := Load(write("private", "[cluster]\nscheduler = \"slurm\"\n", 0o000)); err != nil || s != nil {
			t.Errorf("unreadable: %+v, %v", s, err)
		}
	}
}

// TestCommentWords: a submission's token and share go into its job's comment,
// before the command, and come back out of squeue --json apart from it.
func TestCommentWords(t *testing.T) {
	s := &Slurm{Conf: policy.Cluster{Scheduler: "slurm", GRES: "gpu", Shares: policy.SharesNpurun}}
	got, err := s.Args(&Request{N: 1, Command: "python  train.py", Token: "run-7"})
	if err != nil || !slices.Contains(got, "--comment=npurun-token=run-7 python train.py") {
		t.Errorf("Args with a token = %q, %v", got, err)
	}
	got, err = s.Args(&Request{N: 2, Mem: 6144, Command: "x", Token: "t"})
	if err != nil || !slices.Contains(got, "--comment=npurun-token=t npurun-mem=6144 npurun-n=2 x") {
		t.Errorf("Args of a share = %q, %v", got, err)
	}
	jobs, err := parseJobs([]byte(`{"jobs":[{"job_id":9,"user_id":1001,"job_state":"PENDING","comment":"npurun-token=run-7 python train.py"},{"job_id":10,"user_id":1001,"job_state":"PENDING","comment":"npurun-token=t2 "},` +
		`{"job_id":11,"user_id":1001,"job_state":"PENDING","comment":"npurun-mem=6144 npurun-n=1 npurun-unknown=1 python npurun-x"}]}`))
	if err != nil || len(jobs) != 3 {
		t.Fatalf("parseJobs: %v, %v", jobs, err)
	}
	if jobs[0].Token != "run-7" || jobs[0].Command != "python train.py" {
		t.Errorf("job 9 read as token %q, command %q", jobs[0].Token, jobs[0].Command)
	}
	if jobs[1].Token != "t2" {
		t.Errorf("job 10 read as token %q", jobs[1].Token)
	}
	if j := jobs[2]; j.Token != "" || j.Mem != 6144 || j.MemN != 1 || j.Command != "python npurun-x" {
		t.Errorf("job 11 read as %+v", j)
	}
}

// TestPlaces: each waiting job's place, sorted once per partition, is the
// count of the jobs not held ahead of it in its partition's line, plus one.
func TestPlaces(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	var jobs []Job
	for id := range 400 {
		st := StatePending
		if r.IntN(4) == 0 {
			st = StateRunning
		}
		jobs = append(jobs, Job{ID: uint64(id + 1), State: st, Held: r.IntN(5) == 0, Priority: int64(r.IntN(6)), Partition: []string{"a", "b"}[r.IntN(2)]})
	}
	places := Places(jobs)
	for i := range jobs {
		me := &jobs[i]
		want := 0
		if me.State == StatePending {
			want = 1
			for k := range jobs {
				j := &jobs[k]
				if j != me && j.State == StatePending && !j.Held && j.Partition == me.Partition && (j.Priority > me.Priority || j.Priority == me.Priority && j.ID < me.ID) {
					want++
				}
			}
		}
		if places[me.ID] != want {
			t.Fatalf("job %+v: place %d, want %d", *me, places[me.ID], want)
		}
	}
}
