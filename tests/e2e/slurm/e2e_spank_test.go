package slurm

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// jobLeaseStub stands in for the broker's side of a Slurm job's lease
// (the broker serves no Slurm node yet): it holds locked lock files for
// one job as a Prolog would have had the broker do, hands them to the
// extern step's slurm-hold and closes its own copies, and serves each
// task's slurm-task with copies taken from the extern step with
// pidfd_getfd (what the broker is to do, slurm-broker spec). Requests
// from anyone but root are refused, as the broker refuses them.
type jobLeaseStub struct {
	t       testing.TB
	dir     string // the lock files, npuN.lock
	devices []int  // physical ids, in the grant's order
	env     []string

	mu     sync.Mutex
	own    []int // locked descriptors, until the extern step holds them
	extern int   // the pid of the extern step that holds them
}

// newJobLeaseStub makes the lock files of devices in dir ("" for a
// directory of its own) and locks them.
func newJobLeaseStub(t testing.TB, dir string, devices []int, env []string) *jobLeaseStub {
	if dir == "" {
		dir = harness.SharedDir(t)
	}
	s := &jobLeaseStub{t: t, dir: dir, devices: devices, env: env}
	for _, id := range devices {
		fd, err := unix.Open(s.lockPath(id), unix.O_RDONLY|unix.O_CREAT|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
			t.Fatal(err)
		}
		s.own = append(s.own, fd)
	}
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		harness.CloseFDs(s.own)
		s.own = nil
	})
	return s
}

func (s *jobLeaseStub) lockPath(id int) string {
	return filepath.Join(s.dir, "npu"+strconv.Itoa(id)+".lock")
}

func (s *jobLeaseStub) handle(r harness.StubRequest) harness.StubAnswer {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.Cred.Uid != 0 {
		return harness.StubAnswer{Replies: []wire.Reply{{Type: wire.TypeError, Code: wire.CodeDenied, Message: "root only"}}}
	}
	var fds []int
	switch r.Req.Op {
	case wire.OpSlurmHold:
		if s.own == nil {
			return harness.StubAnswer{Replies: []wire.Reply{{Type: wire.TypeIgnore}}}
		}
		fds, s.own = s.own, nil // handed over: the job holds the lease alone
		s.extern = int(r.Cred.Pid)
		return harness.StubAnswer{Replies: []wire.Reply{{Type: wire.TypeGrant, Devices: s.devices, Vendor: "ascend"}}, FDs: fds}
	case wire.OpSlurmTask:
		if s.own != nil {
			for _, fd := range s.own {
				d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
				if err != nil {
					harness.CloseFDs(fds)
					return harness.StubAnswer{}
				}
				fds = append(fds, d)
			}
		} else if fds = s.fromExtern(); fds == nil {
			return harness.StubAnswer{Replies: []wire.Reply{{Type: wire.TypeIgnore}}}
		}
		return harness.StubAnswer{Replies: []wire.Reply{{Type: wire.TypeGrant, Devices: s.devices, Vendor: "ascend", Env: s.env}}, FDs: fds}
	}
	return harness.StubAnswer{Replies: []wire.Reply{{Type: wire.TypeError, Code: wire.CodeBadRequest, Message: "unknown op"}}}
}

// fromExtern takes copies of the lock descriptors the extern step holds,
// with pidfd_getfd; nil where it holds them no more.
func (s *jobLeaseStub) fromExtern() []int {
	pidfd, err := unix.PidfdOpen(s.extern, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(pidfd)
	var fds []int
	for _, id := range s.devices {
		target := -1
		entries, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", s.extern))
		for _, e := range entries {
			if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", s.extern, e.Name())); l == s.lockPath(id) {
				target, _ = strconv.Atoi(e.Name())
			}
		}
		fd := -1
		if target >= 0 {
			fd, err = unix.PidfdGetfd(pidfd, target, 0)
		}
		if target < 0 || err != nil {
			harness.CloseFDs(fds)
			return nil
		}
		fds = append(fds, fd)
	}
	return fds
}

// locked tells whether lock file path is locked now (a flock with
// LOCK_NB on a file of its own fails).
func locked(t testing.TB, path string) bool {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return true
	}
	return false
}

// awaitUnlocked waits, in flock as the broker's release watcher does (the
// release is an event), for lock file path to be free.
func awaitUnlocked(t testing.TB, path string, within time.Duration) {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- unix.Flock(fd, unix.LOCK_EX) }()
	select {
	case err := <-done:
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(within):
		t.Fatalf("%s still locked after %s; holders: %v", path, within, pathHolders(path))
	}
}

// pathHolders are the processes with path open, each as "PID CMDLINE".
func pathHolders(path string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fds, _ := os.ReadDir("/proc/" + e.Name() + "/fd")
		for _, f := range fds {
			if l, _ := os.Readlink("/proc/" + e.Name() + "/fd/" + f.Name()); l == path {
				out = append(out, strconv.Itoa(pid)+" "+harness.ProcCmdline(pid))
				break
			}
		}
	}
	return out
}

// spankJobScript is a batch script that reports what its batch step and
// an srun step inside it run with (the variables, and each NPURUN_LEASE
// descriptor: open on the lease's lock file with its flock), through the
// FIFO report, then waits until the FIFO proceed is opened and closed.
func spankJobScript(report, proceed string) string {
	check := `l=""; for p in $(echo "$NPURUN_LEASE" | tr , " "); do fd=${p#*:}; d=${p%%:*}; ` +
		`if [ "$fd" -ge 20 ] && grep -q "FLOCK.*WRITE" /proc/self/fdinfo/$fd 2>/dev/null; then l="$l $d:$(readlink /proc/self/fd/$fd)"; else l="$l $d:NOT-HELD"; fi; done; ` +
		`echo "devices=[$NPURUN_DEVICES] ascend=[$ASCEND_RT_VISIBLE_DEVICES] cuda=[$CUDA_VISIBLE_DEVICES] lease=[${l# }]"`
	return "#!/bin/sh\n" +
		"b=$(" + check + ")\n" +
		"s=$(srun -n1 sh -c '" + strings.ReplaceAll(check, "'", `'\''`) + "')\n" +
		"printf 'BATCH %s\\nSTEP %s\\n' \"$b\" \"$s\" > " + report + "\n" +
		"read x < " + proceed + "\n"
}

// TestSpankJobHoldsLease: with the plugin in Slurm's plugstack, a job's
// extern step holds its lease's descriptors for the job's life, and every
// task (the batch script, an srun step) holds copies of its own at 20 and
// above, named by NPURUN_LEASE, with the variables of the broker's answer
// set over Slurm's; the lease's lock is free once the job has ended,
// whether it ends by itself, by scancel, or goes on after a kill -9 of its
// extern step until its tasks end.
func TestSpankJobHoldsLease(t *testing.T) {
	plugin := harness.SpankPlugin(t)
	harness.NeedSlurm(t)
	u := harness.NewUser(t)
	env := []string{"NPURUN_DEVICES=6,5", "ASCEND_RT_VISIBLE_DEVICES=0,1"}
	var stub *jobLeaseStub
	var mu sync.Mutex
	broker := harness.StartStub(t, func(r harness.StubRequest) harness.StubAnswer {
		mu.Lock()
		s := stub
		mu.Unlock()
		return s.handle(r)
	})
	c := harness.StartSlurm(t, harness.SlurmOptions{Devices: 4, PlugStack: "required " + plugin + " socket=" + broker.Socket + " timeout=5\n"})

	for _, end := range []string{"normal", "scancel", "kill -9 extern"} {
		t.Run(end, func(t *testing.T) {
			s := newJobLeaseStub(t, "", []int{6, 5}, env)
			mu.Lock()
			stub = s
			mu.Unlock()
			dir := harness.SharedDir(t)
			report, proceed := filepath.Join(dir, "report"), filepath.Join(dir, "proceed")
			harness.MakeFIFO(t, report)
			harness.MakeFIFO(t, proceed)
			script := filepath.Join(dir, "job.sh")
			if err := os.WriteFile(script, []byte(spankJobScript(report, proceed)), 0o755); err != nil {
				t.Fatal(err)
			}
			before := len(broker.Requests())
			id := c.Sbatch(&u, "--gres=gpu:2", script)
			lines := readLines(t, harness.OpenFIFO(t, report, os.O_RDONLY), 2)
			lease := fmt.Sprintf("lease=[6:%s 5:%s]", s.lockPath(6), s.lockPath(5))
			for i, want := range []string{"BATCH devices=[6,5] ascend=[0,1] cuda=[0,1] " + lease, "STEP devices=[6,5] ascend=[0,1] cuda=[0,1] " + lease} {
				if lines[i] != want {
					t.Errorf("job %d reported\n%s\nwant\n%s", id, lines[i], want)
				}
			}
			// The extern step holds the lease, and the stub no copy.
			var extern string
			for _, h := range pathHolders(s.lockPath(6)) {
				if strings.HasSuffix(h, fmt.Sprintf("slurmstepd: [%d.extern]", id)) {
					extern = h
				}
			}
			if extern == "" {
				t.Fatalf("no extern step of job %d among the holders %v", id, pathHolders(s.lockPath(6)))
			}
			var ops []string
			for _, r := range broker.Requests()[before:] {
				ops = append(ops, fmt.Sprintf("%s job=%d uid=%d step=%d from-uid=%d", r.Req.Op, r.Req.Job.ID, r.Req.Job.UID, r.Req.Job.Step, r.Cred.Uid))
			}
			slices.Sort(ops)
			wantOps := []string{
				fmt.Sprintf("slurm-hold job=%d uid=%d step=0 from-uid=0", id, u.UID),
				fmt.Sprintf("slurm-task job=%d uid=%d step=0 from-uid=0", id, u.UID),
				fmt.Sprintf("slurm-task job=%d uid=%d step=%d from-uid=0", id, u.UID, uint32(wire.SlurmBatchStep)),
			}
			if !slices.Equal(ops, wantOps) {
				t.Errorf("the broker was asked\n%s\nwant\n%s", strings.Join(ops, "\n"), strings.Join(wantOps, "\n"))
			}
			switch end {
			case "normal":
				harness.OpenFIFO(t, proceed, os.O_WRONLY).Close()
			case "scancel":
				if out, err := c.Command("scancel", strconv.FormatUint(uint64(id), 10)).CombinedOutput(); err != nil {
					t.Fatalf("scancel: %v\n%s", err, out)
				}
			case "kill -9 extern":
				pid, _ := strconv.Atoi(strings.Fields(extern)[0])
				sleeper := externSleep(pid)
				if sleeper == 0 {
					t.Errorf("no sleep under the extern step %s", extern)
				}
				unix.Kill(pid, unix.SIGKILL)
				harness.AwaitReaped(pid, time.Now().Add(harness.EventTimeout))
				// The batch script holds copies: the lease goes on. The
				// extern step's sleep, which Slurm leaves running without
				// its step under proctrack/linuxproc, holds none (the
				// plugin keeps the step's copies close-on-exec): it would
				// hold the lease for ever.
				if !locked(t, s.lockPath(6)) || !locked(t, s.lockPath(5)) {
					t.Errorf("the lease ended with the extern step, while the job's script holds it: %v", pathHolders(s.lockPath(6)))
				}
				for _, h := range pathHolders(s.lockPath(6)) {
					if sleeper > 0 && strings.HasPrefix(h, strconv.Itoa(sleeper)+" ") {
						t.Errorf("the extern step's sleep holds the lease: %s", h)
					}
				}
				if sleeper > 0 {
					unix.Kill(sleeper, unix.SIGKILL)
				}
				harness.OpenFIFO(t, proceed, os.O_WRONLY).Close()
			}
			for _, d := range []int{6, 5} {
				awaitUnlocked(t, s.lockPath(d), 30*time.Second)
			}
			c.AwaitJobGone(id, 60*time.Second)
		})
	}
}

// TestSpankNoBroker: with no broker answering, the plugin fails no job:
// the job runs as Slurm made it, and slurmd's log says why the lease is
// missing, for the extern step and for the task.
func TestSpankNoBroker(t *testing.T) {
	plugin := harness.SpankPlugin(t)
	harness.NeedSlurm(t)
	nowhere := filepath.Join(harness.SharedDir(t), "none.sock")
	c := harness.StartSlurm(t, harness.SlurmOptions{Devices: 2, PlugStack: "required " + plugin + " socket=" + nowhere + "\n"})
	id := c.Sbatch(nil, "--wait", "--gres=gpu:1", "--wrap", `echo "devices=[$NPURUN_DEVICES] lease=[$NPURUN_LEASE] cuda=[$CUDA_VISIBLE_DEVICES]"`)
	// The task's own word goes to the job's standard error, here its
	// output, before the command's.
	want := fmt.Sprintf("slurmstepd-localhost: error: spank_npurun: job %d: task: connect %s: No such file or directory: the task runs without npurun's lease\n"+
		"devices=[] lease=[] cuda=[0]", id, nowhere)
	if got := strings.TrimSpace(c.JobOutput(id)); got != want {
		t.Errorf("job %d wrote\n%s\nwant\n%s", id, got, want)
	}
	log, _ := os.ReadFile(filepath.Join(c.Dir, "slurmd.log"))
	for _, want := range []string{
		fmt.Sprintf("[%d.extern] error: spank_npurun: job %d: connect %s: No such file or directory: the job runs without npurun's lease of its devices", id, id, nowhere),
		fmt.Sprintf("[%d.batch] error: spank_npurun: job %d: task: connect %s: No such file or directory: the task runs without npurun's lease", id, id, nowhere),
	} {
		if !strings.Contains(string(log), want) {
			t.Errorf("slurmd's log lacks\n%s", want)
		}
	}
}

// externSleep is the pid of the sleep that the extern step pid runs to
// be tracked by proctrack, 0 if none is found.
func externSleep(pid int) int {
	children, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	for _, f := range strings.Fields(string(children)) {
		if c, err := strconv.Atoi(f); err == nil && strings.HasPrefix(harness.ProcCmdline(c), "sleep ") {
			return c
		}
	}
	return 0
}

// readLines reads n lines from f, failing the test if they do not come
// within EventTimeout.
func readLines(t testing.TB, f *os.File, n int) []string {
	t.Helper()
	ch := make(chan []string, 1)
	go func() {
		var lines []string
		sc := bufio.NewScanner(f)
		for len(lines) < n && sc.Scan() {
			lines = append(lines, sc.Text())
		}
		ch <- lines
	}()
	select {
	case lines := <-ch:
		if len(lines) < n {
			t.Fatalf("read %d lines, want %d: %q", len(lines), n, lines)
		}
		return lines
	case <-time.After(harness.EventTimeout):
		t.Fatalf("no %d lines within %s", n, harness.EventTimeout)
		return nil
	}
}

// TestSpankSubleasesInJob: inside a two-device Slurm job, whose tasks hold
// the job's lease through the plugin, six npurun -n 1 run two at a time,
// one device each (each run marks its device O_EXCL), asking no broker.
func TestSpankSubleasesInJob(t *testing.T) {
	plugin := harness.SpankPlugin(t)
	harness.NeedSlurm(t)
	u := harness.NewUser(t)
	var stub atomic.Pointer[jobLeaseStub]
	broker := harness.StartStub(t, func(r harness.StubRequest) harness.StubAnswer { return stub.Load().handle(r) })
	// The lock files where a nested npurun looks for them: "locks" beside
	// the socket it is told of.
	locks := filepath.Join(filepath.Dir(broker.Socket), "locks")
	if err := os.Mkdir(locks, 0o755); err != nil {
		t.Fatal(err)
	}
	stub.Store(newJobLeaseStub(t, locks, []int{6, 5}, []string{"NPURUN_DEVICES=6,5", "ASCEND_RT_VISIBLE_DEVICES=0,1"}))
	c := harness.StartSlurm(t, harness.SlurmOptions{Devices: 4, PlugStack: "required " + plugin + " socket=" + broker.Socket + " timeout=5\n"})
	c.Env = append(c.Env, "NPURUN_SOCKET="+broker.Socket) // sbatch passes its environment on to the job
	w := harness.NewWorkload(t)
	bin := harness.Bins(t)
	script := "#!/bin/sh\n"
	for i := range 6 {
		script += fmt.Sprintf("%s -n 1 %s -markers %s -log %s -tag j%d -hold 300ms & pids=\"$pids $!\"\n", bin.Npurun, bin.Workload, w.Markers, w.Log, i)
	}
	script += "fail=0; for p in $pids; do wait $p || fail=1; done; exit $fail\n"
	path := filepath.Join(harness.SharedDir(t), "job.sh")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	before := len(broker.Requests())
	id := c.Sbatch(&u, "--wait", "--gres=gpu:2", path)
	runs := w.Runs(t)
	if len(runs) != 6 {
		t.Fatalf("%d runs, want 6: %v; job output:\n%s", len(runs), harness.Tags(runs), c.JobOutput(id))
	}
	used := map[string]int{}
	for _, r := range runs {
		used[r.Devices]++
		if r.UID != int(u.UID) {
			t.Errorf("%s ran as uid %d, want %d", r.Tag, r.UID, u.UID)
		}
	}
	if len(used) != 2 || used["5"] == 0 || used["6"] == 0 {
		t.Errorf("runs by device %v, want the job's devices 5 and 6 both used, no other", used)
	}
	for _, r := range broker.Requests()[before:] {
		if r.Req.Op != wire.OpSlurmHold && r.Req.Op != wire.OpSlurmTask {
			t.Errorf("the broker was asked %s from inside the job", r.Req.Op)
		}
	}
}
