package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

const benchSrunSamples = 30

// benchJobStub stands in for the broker's side of Slurm jobs' leases for
// the benchmark, job after job: the Prolog's request locks a fresh lock
// file per device for the job, the extern step takes them, each task gets
// copies (from the broker's own copy, else from the extern step with
// pidfd_getfd), the Epilog's request forgets the job.
type benchJobStub struct {
	dir  string
	mu   sync.Mutex
	jobs map[uint32]*benchJob
}

type benchJob struct {
	devices []int
	paths   []string
	own     []int
	extern  int
}

func (s *benchJobStub) handle(r harness.StubRequest) harness.StubAnswer {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.Cred.Uid != 0 || r.Req.Job == nil {
		return harness.StubAnswer{Replies: []wire.Reply{{Type: wire.TypeError, Code: wire.CodeDenied, Message: "root only"}}}
	}
	ok := harness.StubAnswer{Replies: []wire.Reply{{Type: wire.TypeOK}}}
	ignore := harness.StubAnswer{Replies: []wire.Reply{{Type: wire.TypeIgnore}}}
	id := r.Req.Job.ID
	j := s.jobs[id]
	switch r.Req.Op {
	case wire.OpSlurmProlog:
		j = &benchJob{}
		for _, f := range strings.Split(r.Req.Job.GRES, ",") {
			d, _ := strconv.Atoi(f)
			p := filepath.Join(s.dir, fmt.Sprintf("job%d-npu%d.lock", id, d))
			fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
			if err != nil {
				return harness.StubAnswer{}
			}
			unix.Flock(fd, unix.LOCK_EX)
			j.devices, j.paths, j.own = append(j.devices, d), append(j.paths, p), append(j.own, fd)
		}
		s.jobs[id] = j
		return ok
	case wire.OpSlurmEpilog:
		if j != nil {
			harness.CloseFDs(j.own)
			for _, p := range j.paths {
				os.Remove(p)
			}
			delete(s.jobs, id)
		}
		return ok
	case wire.OpSlurmHold:
		if j == nil || j.own == nil {
			return ignore
		}
		fds := j.own
		j.own, j.extern = nil, int(r.Cred.Pid)
		return harness.StubAnswer{Replies: []wire.Reply{{Type: wire.TypeGrant, Devices: j.devices, Vendor: "ascend"}}, FDs: fds}
	case wire.OpSlurmTask:
		if j == nil {
			return ignore
		}
		var fds []int
		if j.own != nil {
			for _, fd := range j.own {
				d, _ := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
				fds = append(fds, d)
			}
		} else {
			fds = benchFromExtern(j.extern, j.paths)
		}
		if fds == nil {
			return ignore
		}
		var ids []string
		for _, d := range j.devices {
			ids = append(ids, strconv.Itoa(d))
		}
		env := []string{"NPURUN_DEVICES=" + strings.Join(ids, ","), "ASCEND_RT_VISIBLE_DEVICES=" + strings.Join(ids, ",")}
		return harness.StubAnswer{Replies: []wire.Reply{{Type: wire.TypeGrant, Devices: j.devices, Vendor: "ascend", Env: env}}, FDs: fds}
	}
	return harness.StubAnswer{Replies: []wire.Reply{{Type: wire.TypeError, Code: wire.CodeBadRequest, Message: "unknown op"}}}
}

// benchFromExtern takes copies of the descriptors of paths that process
// pid holds, with pidfd_getfd; nil where it holds one no more.
func benchFromExtern(pid int, paths []string) []int {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(pidfd)
	entries, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	var fds []int
	for _, p := range paths {
		got := -1
		for _, e := range entries {
			if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name())); l == p {
				n, _ := strconv.Atoi(e.Name())
				got, _ = unix.PidfdGetfd(pidfd, n, 0)
				break
			}
		}
		if got < 0 {
			harness.CloseFDs(fds)
			return nil
		}
		fds = append(fds, got)
	}
	return fds
}

// BenchmarkSlurmSrun: `srun --gres=gpu:1 /bin/true` on a private
// single-node Slurm, interleaved, in three setups: bare (Prolog and Epilog
// /bin/true, no SPANK plugin: switching the Prolog off takes an scontrol
// reconfigure, which would perturb the run), npurun's pieces with no
// broker (npurun-slurm as Prolog and Epilog, spank_npurun.so loaded, its
// socket absent: their cost when they cannot reach a broker), and the
// same against a stub of the broker's job-lease side (the Prolog through
// a /bin/sh wrapper that names the stub's socket, which slurmd's Prolog
// environment cannot), and against npubroker itself (split mode, every
// device Slurm's). Each sample waits for the node to be idle first.
// Target (issue 18): with the Prolog and plugin ≤ 1.1× without.
func BenchmarkSlurmSrun(b *testing.B) {
	benchNoNsPerOp(b)
	plugin := harness.SpankPlugin(b)
	harness.NeedSlurm(b)
	bin := harness.Bins(b)
	dir := harness.SharedDir(b)
	stub := &benchJobStub{dir: harness.SharedDir(b), jobs: map[uint32]*benchJob{}}
	broker := harness.StartStub(b, stub.handle)
	wrapper := filepath.Join(dir, "npurun-slurm-stub")
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\nexec "+bin.Slurm+" --socket "+broker.Socket+"\n"), 0o755); err != nil {
		b.Fatal(err)
	}
	prolog, epilog := filepath.Join(dir, "prolog"), filepath.Join(dir, "epilog")
	dev := harness.NewDevTree(b, 4)
	c := harness.StartSlurm(b, harness.SlurmOptions{Devices: 4, GresFirst: 0, DevDir: dev.Dir, Prolog: prolog, Epilog: epilog, PlugStack: "\n"})
	plugstack := filepath.Join(c.Dir, "plugstack.conf")
	// npubroker itself, every device Slurm's (split mode).
	real := harness.NewBroker(b, dev.Config("0-3", fmt.Sprintf("[slurm]\ngres_devices = \"0-3\"\nnode = %q\ngres_conf = %q\n", c.Node, filepath.Join(c.Dir, "gres.conf"))), "SLURM_CONF="+c.Conf)
	real.Start()
	realWrapper := filepath.Join(dir, "npurun-slurm-broker")
	if err := os.WriteFile(realWrapper, []byte("#!/bin/sh\nexec "+bin.Slurm+" --socket "+real.Socket+"\n"), 0o755); err != nil {
		b.Fatal(err)
	}
	setup := func(script, stack string) {
		for _, l := range []string{prolog, epilog} {
			os.Remove(l)
			if err := os.Symlink(script, l); err != nil {
				b.Fatal(err)
			}
		}
		if err := os.WriteFile(plugstack, []byte(stack), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	idle := func() {
		deadline := time.Now().Add(60 * time.Second)
		for {
			out, _ := c.Command("squeue", "-h", "-o", "%i").Output()
			st, _ := c.Command("sinfo", "-h", "-n", c.Node, "-o", "%t").Output()
			if strings.TrimSpace(string(out)) == "" && strings.TrimSpace(string(st)) == "idle" {
				return
			}
			if time.Now().After(deadline) {
				b.Fatalf("the node is not idle after 60s:\n%s", c.Logs())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	srun := func(script, stack string) func() time.Duration {
		return func() time.Duration {
			setup(script, stack)
			idle()
			cmd := c.Command("srun", "--gres=gpu:1", "/bin/true")
			t0 := time.Now()
			if out, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("srun: %v\n%s", err, out)
			}
			return time.Since(t0)
		}
	}
	nowhere := filepath.Join(dir, "none.sock")
	bare := &benchSide{name: "bare (Prolog /bin/true, no plugin)", sample: srun("/bin/true", "\n")}
	down := &benchSide{name: "npurun-slurm + plugin, no broker", sample: srun(bin.Slurm, "required "+plugin+" socket="+nowhere+"\n")}
	served := &benchSide{name: "npurun-slurm (sh wrapper) + plugin, stub broker", sample: srun(wrapper, "required "+plugin+" socket="+broker.Socket+"\n")}
	leased := &benchSide{name: "npurun-slurm (sh wrapper) + plugin, npubroker", sample: srun(realWrapper, "required "+plugin+" socket="+real.Socket+"\n")}
	benchInterleave(2, bare, down, served, leased)
	for _, s := range []*benchSide{bare, down, served, leased} {
		s.got = nil
	}
	benchInterleave(benchSrunSamples, bare, down, served, leased)
	// The served runs took their leases: the stub saw every job's requests.
	holds := 0
	for _, r := range broker.Requests() {
		if r.Req.Op == wire.OpSlurmHold {
			holds++
		}
	}
	if holds < benchSrunSamples {
		b.Errorf("the stub was asked to hold %d times for %d served runs", holds, benchSrunSamples)
	}
	// And npubroker leased the jobs of its runs.
	if leases := strings.Count(real.Log(), " holds npu "); leases < benchSrunSamples {
		b.Errorf("npubroker leased %d jobs for %d runs:\n%s", leases, benchSrunSamples, real.Log())
	}
	b.ReportMetric(benchMs(bare.p50()), "bare-p50-ms")
	b.ReportMetric(benchMs(down.p50()), "down-p50-ms")
	b.ReportMetric(benchMs(served.p50()), "served-p50-ms")
	b.ReportMetric(float64(down.p50())/float64(bare.p50()), "ratio-down")
	b.ReportMetric(float64(served.p50())/float64(bare.p50()), "ratio-served")
	b.ReportMetric(benchMs(leased.p50()), "npubroker-p50-ms")
	b.ReportMetric(float64(leased.p50())/float64(bare.p50()), "ratio-npubroker")
	benchSummary(b, fmt.Sprintf("srun --gres=gpu:1 /bin/true, %d runs each, interleaved (target ≤ 1.1× bare)", benchSrunSamples), [][]string{
		{"", "p10 ms", "p50 ms", "p90 ms"},
		bare.row(), down.row(), served.row(), leased.row(),
		{"no broker / bare, p50", ratio(down, bare)},
		{"stub broker / bare, p50", ratio(served, bare)},
		{"npubroker / bare, p50", ratio(leased, bare)},
	})
}

// BenchmarkSlurmAllocate: allocate mode, `npurun -- /bin/true` on a free
// Slurm device (a placeholder allocation, its grant, its end) beside
// `srun --gres=gpu:1 /bin/true`, interleaved, each after the node is
// idle. Target (issue 18): ≤ 1.0× srun.
func BenchmarkSlurmAllocate(b *testing.B) {
	benchNoNsPerOp(b)
	n := harness.StartSlurmNode(b, harness.SlurmNodeOptions{Devices: 2, Slurm: 2, Mode: "allocate"})
	idle := func() {
		deadline := time.Now().Add(60 * time.Second)
		for {
			out, _ := n.C.Command("squeue", "-h", "-o", "%i").Output()
			if strings.TrimSpace(string(out)) == "" {
				return
			}
			if time.Now().After(deadline) {
				b.Fatalf("jobs left after 60s:\n%s", out)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	npurun := &benchSide{name: "npurun -- /bin/true (allocate)", sample: func() time.Duration {
		idle()
		return benchTimeRun(b, n.B.Npurun("--", "/bin/true"))
	}}
	srun := &benchSide{name: "srun --gres=gpu:1 /bin/true", sample: func() time.Duration {
		idle()
		return benchTimeRun(b, n.C.Command("srun", "--gres=gpu:1", "/bin/true"))
	}}
	benchInterleave(2, npurun, srun)
	npurun.got, srun.got = nil, nil
	benchInterleave(benchSrunSamples, npurun, srun)
	b.ReportMetric(float64(npurun.p50())/float64(srun.p50()), "ratio-srun")
	benchSummary(b, fmt.Sprintf("allocate mode, %d runs each, interleaved (target ≤ 1.0× srun)", benchSrunSamples), [][]string{
		{"", "p10 ms", "p50 ms", "p90 ms"}, npurun.row(), srun.row(), {"npurun / srun, p50", ratio(npurun, srun)},
	})
}
