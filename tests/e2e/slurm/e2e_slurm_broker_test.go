package slurm

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// jobLease returns the lease of Slurm job id on the board, nil if none.
func jobLease(board *wire.Board, id uint32) (*wire.LeaseInfo, []int) {
	var lease *wire.LeaseInfo
	var devices []int
	for _, d := range board.Devices {
		if d.Lease != nil && d.Lease.SlurmJob == id {
			lease = d.Lease
			devices = append(devices, d.ID)
		}
	}
	return lease, devices
}

// TestSlurmNodeJobLeaseStatus: an sbatch --gres=gpu:2 job's devices are a
// lease of kind slurm in status --json, with the job's id and user, and
// the job's processes (its extern step's slurmstepd, its batch script) as
// holders; the devices are free once it ends, and usage counts the job's
// device time under kind slurm.
func TestSlurmNodeJobLeaseStatus(t *testing.T) {
	n := harness.StartSlurmNode(t, harness.SlurmNodeOptions{Devices: 4, Slurm: 2, Mode: "split"})
	u := harness.NewUser(t)
	dir := harness.SharedDir(t)
	running, proceed := filepath.Join(dir, "running"), filepath.Join(dir, "proceed")
	harness.MakeFIFO(t, running)
	harness.MakeFIFO(t, proceed)
	id := n.C.Sbatch(&u, "--gres=gpu:2", "--wrap", "echo $$ > "+running+"; read x < "+proceed)
	pid, err := strconv.Atoi(strings.TrimSpace(readLines(t, harness.OpenFIFO(t, running, os.O_RDONLY), 1)[0]))
	if err != nil {
		t.Fatal(err)
	}
	board := n.AwaitBoard(t, "the job's lease with its script as a holder", func(b *wire.Board) bool {
		l, _ := jobLease(b, id)
		return l != nil && slices.Contains(harness.HolderPIDs(b, 2), pid)
	})
	l, devices := jobLease(board, id)
	if l.Kind != wire.KindSlurm || l.User != u.Name || l.UID != u.UID || !slices.Equal(devices, []int{2, 3}) {
		t.Errorf("job %d's lease: kind %q user %q uid %d on %v; want slurm, %s, %d, [2 3]", id, l.Kind, l.User, l.UID, devices, u.Name, u.UID)
	}
	for _, d := range devices {
		if st := harness.Device(t, board, d).State; st != wire.DeviceSlurm {
			t.Errorf("npu%d is %q, want %q", d, st, wire.DeviceSlurm)
		}
	}
	extern := false
	for _, h := range l.Holders {
		if h.UID == 0 && strings.Contains(h.Command, fmt.Sprintf("[%d.extern]", id)) {
			extern = true
		}
	}
	if !extern {
		t.Errorf("the extern step is not among the holders: %+v", l.Holders)
	}
	if len(board.Unleased) > 0 {
		t.Errorf("unleased use reported during a Slurm job: %+v", board.Unleased)
	}
	harness.OpenFIFO(t, proceed, os.O_WRONLY).Close()
	n.C.AwaitJobGone(id, 60*time.Second)
	n.AwaitBoard(t, "the job's devices free", func(b *wire.Board) bool {
		return harness.Device(t, b, 2).State == wire.DeviceFree && harness.Device(t, b, 3).State == wire.DeviceFree
	})
	usage := exec.Command(n.B.Bin.Broker, "usage", "--since", "1h", "--json")
	usage.Env = n.B.Env()
	out, err := usage.Output()
	if err != nil {
		t.Fatal(err)
	}
	var rep wire.UsageReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range rep.Rows {
		found = found || (r.User == u.Name && r.Kind == wire.KindSlurm && r.DeviceSeconds > 0)
	}
	if !found {
		t.Errorf("usage has no slurm row for %s: %s", u.Name, out)
	}
}

// TestSlurmNodeSplitMixed: split mode, a minute of jobs and npurun
// commands side by side, each run marking its devices O_EXCL: no device
// used twice, npurun never on Slurm's devices, jobs only on them.
func TestSlurmNodeSplitMixed(t *testing.T) {
	n := harness.StartSlurmNode(t, harness.SlurmNodeOptions{Devices: 4, Slurm: 2, Mode: "split"})
	u := harness.NewUser(t)
	w := harness.NewWorkload(t)
	bin := harness.Bins(t)
	deadline := time.Now().Add(time.Minute)
	var ids []uint32
	var procs []*harness.Proc
	for i := 0; time.Now().Before(deadline); i++ {
		ids = append(ids, n.C.Sbatch(&u, fmt.Sprintf("--gres=gpu:%d", 1+i%2), "--wrap",
			fmt.Sprintf("%s %s -markers %s -log %s -tag job%d -hold 500ms", bin.Npurun, bin.Workload, w.Markers, w.Log, i)))
		procs = append(procs, harness.StartProc(t, fmt.Sprintf("npurun%d", i), u.As(n.B.Npurun(append([]string{"-n", strconv.Itoa(1 + i%2)}, w.Args(n.B, fmt.Sprintf("npurun%d", i), 300*time.Millisecond)...)...), n.B.Dir)))
		time.Sleep(time.Second) // the load's pace, not a synchronisation
	}
	for _, p := range procs {
		p.MustSucceed()
	}
	for _, id := range ids {
		n.C.AwaitJobGone(id, 5*time.Minute)
		if out := n.C.JobOutput(id); strings.Contains(out, "npurun:") {
			t.Errorf("job %d: %s", id, out)
		}
	}
	runs := w.Runs(t)
	if len(runs) != 2*len(ids) {
		t.Errorf("%d runs, want %d", len(runs), 2*len(ids))
	}
	for _, r := range runs {
		job := strings.HasPrefix(r.Tag, "job")
		for _, d := range strings.Split(r.Devices, ",") {
			if slurmDev := d == "2" || d == "3"; slurmDev != job {
				t.Errorf("%s ran on device %s", r.Tag, d)
			}
		}
	}
}

// TestSlurmNodeRelease: the lease ends when the job ends however it ends:
// normal end, scancel, its time limit, kill -9 of its step daemons; the
// Epilog's end is idempotent (run again by hand, it changes nothing).
func TestSlurmNodeRelease(t *testing.T) {
	n := harness.StartSlurmNode(t, harness.SlurmNodeOptions{Devices: 2, Slurm: 2, Mode: "split"})
	for _, end := range []string{"normal", "scancel", "time limit", "kill -9 steps"} {
		t.Run(end, func(t *testing.T) {
			args := []string{"--gres=gpu:2", "--wrap", "sleep 600"}
			if end == "normal" {
				args = []string{"--gres=gpu:2", "--wrap", "sleep 3"}
			}
			if end == "time limit" {
				args = append(args, "--time=1")
			}
			id := n.C.Sbatch(nil, args...)
			board := n.AwaitBoard(t, "the job's lease", func(b *wire.Board) bool { l, _ := jobLease(b, id); return l != nil })
			switch end {
			case "scancel":
				if out, err := n.C.Command("scancel", strconv.FormatUint(uint64(id), 10)).CombinedOutput(); err != nil {
					t.Fatalf("scancel: %v\n%s", err, out)
				}
			case "kill -9 steps":
				// Every step daemon of the job: the extern step's holds
				// the lease, the batch step's does not (its script does).
				board = n.AwaitBoard(t, "the job's extern step and script holding its lease", func(b *wire.Board) bool {
					l, _ := jobLease(b, id)
					return l != nil && slices.ContainsFunc(l.Holders, func(h wire.Holder) bool { return strings.Contains(h.Command, fmt.Sprintf("[%d.extern]", id)) }) &&
						slices.ContainsFunc(l.Holders, func(h wire.Holder) bool { return strings.Contains(h.Command, "slurm_script") })
				})
				l, _ := jobLease(board, id)
				daemons := stepDaemons(id)
				if !slices.ContainsFunc(l.Holders, func(h wire.Holder) bool { return slices.Contains(daemons, h.PID) }) || len(daemons) < 2 {
					t.Fatalf("job %d's step daemons %v: the extern step's should hold its lease: %+v", id, daemons, l.Holders)
				}
				for _, pid := range daemons {
					unix.Kill(pid, unix.SIGKILL)
				}
				// Slurm ends a job whose steps are gone when the node
				// next registers and the job, older than BatchStartTimeout
				// and MessageTimeout, is not found there: by itself every
				// 20 pings of SlurmdTimeout/3 (over half an hour by
				// default); scontrol reconfigure has slurmd register now.
				// Asked every 5 s (a pace, not a synchronisation) until
				// the job leaves RUNNING; the lease must end with it.
				deadline := time.Now().Add(2 * time.Minute)
				for n.C.JobState(id) == "RUNNING" && time.Now().Before(deadline) {
					n.C.Command("scontrol", "reconfigure").Run()
					time.Sleep(5 * time.Second)
				}
			}
			within := 30 * time.Second
			if end == "time limit" || end == "kill -9 steps" {
				within = 3 * time.Minute
			}
			w := harness.WatchBoards(t, n.B, nil)
			w.NextWithin(within, "the job's devices free", func(b *wire.Board) bool {
				return harness.Device(t, b, 0).State == wire.DeviceFree && harness.Device(t, b, 1).State == wire.DeviceFree
			})
			// The Epilog again: nothing to end, nothing changes.
			cmd := exec.Command(n.B.Bin.Slurm, "epilog", "--socket", n.B.Socket)
			cmd.Env = append(os.Environ(), "SLURM_JOB_ID="+strconv.FormatUint(uint64(id), 10), "SLURM_JOB_UID=0", "SLURM_JOB_GPUS=0,1")
			out, err := cmd.CombinedOutput()
			if err != nil || strings.Contains(string(out), "refused") {
				t.Errorf("a second epilog: %v\n%s", err, out)
			}
		})
	}
}

// stepDaemons are the slurmstepd processes of job id ("slurmstepd:
// [ID.extern]", "[ID.batch]", …).
func stepDaemons(id uint32) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err == nil && strings.HasPrefix(harness.ProcCmdline(pid), fmt.Sprintf("slurmstepd: [%d.", id)) {
			out = append(out, pid)
		}
	}
	return out
}

// TestSlurmNodeRestricted: a restricted user's job opens its devices and
// no other (the ACL entries, as for any lease), and loses them at its end.
func TestSlurmNodeRestricted(t *testing.T) {
	student := harness.NewUser(t)
	n := harness.StartSlurmNode(t, harness.SlurmNodeOptions{Devices: 4, Slurm: 2, Mode: "split", Config: fmt.Sprintf("[restrict]\nusers = [%q]\n", student.Name)})
	open := func(d int) string {
		return fmt.Sprintf(`(exec 3<>%s) 2>/dev/null && echo open%d=yes || echo open%d=no`, n.Dev.Node(fmt.Sprintf("davinci%d", d)), d, d)
	}
	id := n.C.Sbatch(&student, "--wait", "--gres=gpu:1", "--wrap", strings.Join([]string{open(0), open(1), open(2), open(3), `echo on=$NPURUN_DEVICES`}, "; "))
	out := n.C.JobOutput(id)
	var on string
	for _, l := range strings.Split(out, "\n") {
		on = strings.TrimPrefix(l, "on=")
		if on != l {
			break
		}
	}
	for d := range 4 {
		want := "no"
		if strconv.Itoa(d) == on {
			want = "yes"
		}
		if !strings.Contains(out, fmt.Sprintf("open%d=%s", d, want)) {
			t.Errorf("job on device %q: open%d should be %s:\n%s", on, d, want, out)
		}
	}
	if on != "2" && on != "3" {
		t.Errorf("the job ran on %q, not one of Slurm's devices", on)
	}
	n.AwaitBoard(t, "the job's devices free", func(b *wire.Board) bool {
		return harness.Device(t, b, 2).State == wire.DeviceFree && harness.Device(t, b, 3).State == wire.DeviceFree
	})
	for _, d := range []int{2, 3} {
		if harness.CanOpen(t, student, n.Dev.Node(fmt.Sprintf("davinci%d", d))) {
			t.Errorf("the student opens davinci%d after the job", d)
		}
	}
}

// TestSlurmNodeBrokerRestart: a broker restart (kill -9) during a job
// keeps the job's lease: the new broker shows it, kind slurm, with its
// job id and user, and frees it when the job ends.
func TestSlurmNodeBrokerRestart(t *testing.T) {
	n := harness.StartSlurmNode(t, harness.SlurmNodeOptions{Devices: 2, Slurm: 2, Mode: "split"})
	u := harness.NewUser(t)
	dir := harness.SharedDir(t)
	proceed := filepath.Join(dir, "proceed")
	harness.MakeFIFO(t, proceed)
	id := n.C.Sbatch(&u, "--gres=gpu:2", "--wrap", "read x < "+proceed)
	n.AwaitBoard(t, "the job's lease", func(b *wire.Board) bool { l, _ := jobLease(b, id); return l != nil })
	n.B.Kill()
	n.B.Start()
	board := n.AwaitBoard(t, "the job's lease after the restart", func(b *wire.Board) bool { l, _ := jobLease(b, id); return l != nil })
	if l, devices := jobLease(board, id); l.Kind != wire.KindSlurm || l.User != u.Name || !slices.Equal(devices, []int{0, 1}) {
		t.Errorf("after the restart: %+v on %v", l, devices)
	}
	harness.OpenFIFO(t, proceed, os.O_WRONLY).Close()
	n.AwaitBoard(t, "the job's devices free", func(b *wire.Board) bool {
		return harness.Device(t, b, 0).State == wire.DeviceFree && harness.Device(t, b, 1).State == wire.DeviceFree
	})
}

// TestSlurmNodeRestartNoRecord: a broker that starts with neither the
// job's record nor the accounting log (both lost) finds the job's lease
// by its holders: the job's extern step, a root "slurmstepd: [N.extern]",
// names the job, its batch script the user; it shows the lease as the
// job's and frees it at the job's end.
func TestSlurmNodeRestartNoRecord(t *testing.T) {
	n := harness.StartSlurmNode(t, harness.SlurmNodeOptions{Devices: 2, Slurm: 2, Mode: "split"})
	u := harness.NewUser(t)
	proceed := filepath.Join(harness.SharedDir(t), "proceed")
	harness.MakeFIFO(t, proceed)
	id := n.C.Sbatch(&u, "--gres=gpu:2", "--wrap", "read x < "+proceed)
	n.AwaitBoard(t, "the job's lease held by its extern step and its batch script", func(b *wire.Board) bool {
		l, _ := jobLease(b, id)
		return l != nil && slices.ContainsFunc(l.Holders, func(h wire.Holder) bool { return strings.Contains(h.Command, fmt.Sprintf("[%d.extern]", id)) }) &&
			slices.ContainsFunc(l.Holders, func(h wire.Holder) bool { return h.UID == u.UID })
	})
	n.B.Kill()
	lost, _ := filepath.Glob(filepath.Join(n.B.StateDir, "usage.log*"))
	jobs, _ := filepath.Glob(filepath.Join(n.B.StateDir, "slurm", "jobs", "*"))
	if len(lost) == 0 || len(jobs) != 1 {
		t.Fatalf("no accounting log (%v) or not one job record (%v) to lose", lost, jobs)
	}
	for _, f := range append(lost, jobs...) {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	logAt := n.B.LogLen()
	n.B.Start()
	n.B.WaitLog(logAt, fmt.Sprintf("npu 0-1 is held by job %d of %s, whose lease has no record: taken up as the job's", id, u.Name))
	board := n.AwaitBoard(t, "the job's lease after the restart", func(b *wire.Board) bool { l, _ := jobLease(b, id); return l != nil })
	if l, devices := jobLease(board, id); l.Kind != wire.KindSlurm || l.User != u.Name || l.UID != u.UID || !slices.Equal(devices, []int{0, 1}) {
		t.Errorf("after the restart: %+v on %v, want job %d of %s on [0 1]", l, devices, id, u.Name)
	}
	harness.OpenFIFO(t, proceed, os.O_WRONLY).Close()
	n.AwaitBoard(t, "the job's devices free", func(b *wire.Board) bool {
		return harness.Device(t, b, 0).State == wire.DeviceFree && harness.Device(t, b, 1).State == wire.DeviceFree
	})
}

// TestSlurmNodeRestartHeldAlone: without the plugin no extern step takes
// a job's lease, and the broker holds it itself from the Prolog to the
// Epilog. Killed (-9), it takes its copy with it: the next broker locks
// the job's devices again from the job's record, and the Epilog ends the
// lease.
func TestSlurmNodeRestartHeldAlone(t *testing.T) {
	n := harness.StartSlurmNode(t, harness.SlurmNodeOptions{Devices: 2, Slurm: 2, Mode: "split", NoPlugin: true})
	u := harness.NewUser(t)
	proceed := filepath.Join(harness.SharedDir(t), "proceed")
	harness.MakeFIFO(t, proceed)
	id := n.C.Sbatch(&u, "--gres=gpu:1", "--wrap", "read x < "+proceed)
	board := n.AwaitBoard(t, "the job's lease", func(b *wire.Board) bool { l, _ := jobLease(b, id); return l != nil })
	_, devices := jobLease(board, id)
	n.B.Kill()
	logAt := n.B.LogLen()
	n.B.Start()
	n.B.WaitLog(logAt, fmt.Sprintf("job %d of %s: %s locked again for its lease (the broker held it alone before this start)", id, u.Name, fmt.Sprintf("npu %d", devices[0])))
	board = n.AwaitBoard(t, "the job's lease after the restart", func(b *wire.Board) bool { l, _ := jobLease(b, id); return l != nil })
	if l, again := jobLease(board, id); l.Kind != wire.KindSlurm || l.User != u.Name || !slices.Equal(again, devices) {
		t.Errorf("after the restart: %+v on %v, want %s's on %v", l, again, u.Name, devices)
	}
	harness.OpenFIFO(t, proceed, os.O_WRONLY).Close()
	n.AwaitBoard(t, "the job's device free after its Epilog", func(b *wire.Board) bool {
		return harness.Device(t, b, devices[0]).State == wire.DeviceFree
	})
}

// TestSlurmNodeAllocate: allocate mode. An npurun for Slurm's devices
// waits, as a placeholder Slurm allocation that squeue shows, while a job
// holds every device, says Slurm's state, and starts when the job ends; a
// job waits while the npurun holds; the placeholder is gone after.
func TestSlurmNodeAllocate(t *testing.T) {
	n := harness.StartSlurmNode(t, harness.SlurmNodeOptions{Devices: 2, Slurm: 2, Mode: "allocate"})
	u := harness.NewUser(t)
	dir := harness.SharedDir(t)
	proceed := filepath.Join(dir, "proceed")
	harness.MakeFIFO(t, proceed)
	job := n.C.Sbatch(&u, "--gres=gpu:2", "--wrap", "read x < "+proceed)
	n.C.AwaitJobState(job, "RUNNING", time.Minute)
	p := harness.StartProc(t, "npurun", u.As(n.B.Npurun("-v", "-n", "1", "sh", "-c", `echo "ON $NPURUN_DEVICES"; read x; exit 0`), n.B.Dir))
	line := p.WaitLine("npurun: waiting for")
	if !strings.Contains(line, "Slurm job") || !strings.Contains(line, "PENDING") {
		t.Errorf("the progress line does not show Slurm's state: %s", line)
	}
	out, _ := n.C.Command("squeue", "-h", "-o", "%i %j %u %T").Output()
	var placeholder string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		if len(f) == 4 && strings.HasPrefix(f[1], "npurun") && f[2] == u.Name && f[3] == "PENDING" {
			placeholder = f[0]
		}
	}
	if placeholder == "" {
		t.Fatalf("no pending placeholder of %s in squeue:\n%s", u.Name, out)
	}
	harness.OpenFIFO(t, proceed, os.O_WRONLY).Close()
	on := p.WaitLine("ON ")
	// A job now waits while the npurun holds its device.
	job2 := n.C.Sbatch(&u, "--gres=gpu:2", "--wrap", "true")
	time.Sleep(3 * time.Second) // a few of the scheduler's cycles: the job must still wait
	if st := n.C.JobState(job2); st != "PENDING" {
		t.Errorf("job %d is %s while npurun holds %s", job2, st, on)
	}
	p.Stdin.Close()
	p.MustSucceed()
	pid, _ := strconv.ParseUint(placeholder, 10, 32)
	n.C.AwaitJobGone(uint32(pid), time.Minute)
	n.C.AwaitJobGone(job2, 2*time.Minute)
}

// TestSlurmNodeAllocateTask: allocate mode, a task for Slurm's devices
// waits as a placeholder allocation of its user named after it, with its
// time limit (rounded up to minutes), which
// show tells with Slurm's state, while a job holds every device; held,
// it lets go of its placeholder, and gets another once released; it runs
// on the device Slurm gives the placeholder once the job ends, and the
// placeholder is gone after the task.
func TestSlurmNodeAllocateTask(t *testing.T) {
	harness.NeedRoot(t)
	// Made before the broker, so removed after it stops: the task's
	// idle supervisor runs as u until then.
	u := harness.NewUser(t)
	n := harness.StartSlurmNode(t, harness.SlurmNodeOptions{Devices: 2, Slurm: 2, Mode: "allocate"})
	dir := harness.SharedDir(t)
	os.Chmod(dir, 0o777)
	proceed, out := filepath.Join(dir, "proceed"), filepath.Join(dir, "out")
	harness.MakeFIFO(t, proceed)
	job := n.C.Sbatch(&u, "--gres=gpu:2", "--wrap", "read x < "+proceed)
	n.C.AwaitJobState(job, "RUNNING", time.Minute)
	id := harness.SubmitTask(t, n.B, &u, dir, "--time", "90s", "--log", filepath.Join(dir, "task.log"), "--", "sh", "-c", "echo ON=$NPURUN_DEVICES > "+out)
	name := fmt.Sprintf("npurun-task-%d", id)
	// pending is the task's pending placeholder in Slurm's queue, other
	// than not, and its time limit.
	pending := func(not string) (string, string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) { // polling Slurm's queue
			sq, _ := n.C.Command("squeue", "-h", "-o", "%i %j %u %T %l").Output()
			for _, l := range strings.Split(strings.TrimSpace(string(sq)), "\n") {
				if f := strings.Fields(l); len(f) == 5 && f[0] != not && f[1] == name && f[2] == u.Name && f[3] == "PENDING" {
					return f[0], f[4]
				}
			}
		}
		t.Fatalf("no pending placeholder %s of %s in squeue", name, u.Name)
		return "", ""
	}
	placeholder, limit := pending("")
	if limit != "2:00" {
		t.Errorf("placeholder %s of a task of --time 90s: time limit %s, want 2:00 (minutes, rounded up)", placeholder, limit)
	}
	// Held by its owner, the task lets go of its placeholder (Slurm
	// would give it devices it refuses); released, it gets another.
	if r := harness.RunTaskCmd(t, u.As(n.B.TaskSubmit("hold", harness.IDStr(id)), dir)); r.Code != 0 {
		t.Fatalf("task-submit hold %d: %s", id, r)
	}
	first, _ := strconv.ParseUint(placeholder, 10, 32)
	n.C.AwaitJobGone(uint32(first), time.Minute)
	if r := harness.RunTaskCmd(t, u.As(n.B.TaskSubmit("release", harness.IDStr(id)), dir)); r.Code != 0 {
		t.Fatalf("task-submit release %d: %s", id, r)
	}
	placeholder, _ = pending(placeholder)
	deadline := time.Now().Add(30 * time.Second)
	ti := harness.ShowTask(t, n.B, id)
	for !strings.Contains(ti.Reason, "PENDING") && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond) // the broker asks squeue every poll_interval
		ti = harness.ShowTask(t, n.B, id)
	}
	if ti.State != wire.StatePending || !strings.Contains(ti.Reason, "Slurm job "+placeholder) || !strings.Contains(ti.Reason, "PENDING") {
		t.Errorf("task %d while the job holds every device: %s, %q", id, ti.State, ti.Reason)
	}
	harness.OpenFIFO(t, proceed, os.O_WRONLY).Close()
	if r := harness.WaitTask(t, n.B, id); r.Code != 0 {
		t.Fatalf("task %d: %s", id, r)
	}
	got, _ := os.ReadFile(out)
	if s := strings.TrimSpace(string(got)); s != "ON=0" && s != "ON=1" {
		t.Errorf("task %d ran on %q", id, s)
	}
	pid, _ := strconv.ParseUint(placeholder, 10, 32)
	n.C.AwaitJobGone(uint32(pid), time.Minute)
}

// TestSlurmNodeAllocateTimeLimit: a placeholder that Slurm ends by its
// time limit ends the npurun command (SIGTERM, then SIGKILL after
// kill_grace), so that nothing runs on a device Slurm gives another; npurun
// says so and exits 143.
func TestSlurmNodeAllocateTimeLimit(t *testing.T) {
	n := harness.StartSlurmNode(t, harness.SlurmNodeOptions{Devices: 1, Slurm: 1, Mode: "allocate", Partition: "DefaultTime=1", Config: "[tasks]\nkill_grace = \"5s\"\n"})
	p := harness.StartProc(t, "npurun", n.B.Npurun("sh", "-c", `echo "ON $$"; trap "" TERM; sleep 600`))
	pid, err := strconv.Atoi(strings.TrimPrefix(p.WaitLine("ON "), "ON "))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	select {
	case <-p.Done:
	case <-time.After(4 * time.Minute):
		t.Fatalf("the command outlived its placeholder's time limit by minutes:\n%s", p.Output())
	}
	<-p.OutDone
	if code, _ := p.Wait(); code != 143 || !strings.Contains(p.Output(), "the command was ended: Slurm ") {
		t.Errorf("npurun whose placeholder reached its time limit: exit %d, want 143 and a word:\n%s", code, p.Output())
	}
	if !harness.ProcGone(t, pid, "") {
		t.Errorf("the command (pid %d, ignoring SIGTERM) outlived its lease", pid)
	}
	t.Logf("ended %s after its start", time.Since(start))
}

// TestSlurmNodeAllocateCancel: allocate mode, scancel of the placeholder
// job an npurun's devices are held through ends its command, and npurun
// says so on its terminal ("slurm job N: the command was ended: Slurm
// ended job N ...", the broker's reason) and exits 143
// (exitcode.SlurmEnded), where it used to vanish with its command without a
// word.
func TestSlurmNodeAllocateCancel(t *testing.T) {
	n := harness.StartSlurmNode(t, harness.SlurmNodeOptions{Devices: 1, Slurm: 1, Mode: "allocate", Config: "[tasks]\nkill_grace = \"5s\"\n"})
	u := harness.NewUser(t)
	p := harness.StartProc(t, "npurun", u.As(n.B.Npurun("sh", "-c", `echo "ON $NPURUN_DEVICES"; exec sleep 600`), n.B.Dir))
	p.WaitLine("ON 0")
	board := n.AwaitBoard(t, "the npurun's lease with its placeholder job", func(b *wire.Board) bool {
		return len(b.Devices) == 1 && b.Devices[0].Lease != nil && b.Devices[0].Lease.SlurmJob != 0
	})
	job := board.Devices[0].Lease.SlurmJob
	if out, err := n.C.Command("scancel", strconv.FormatUint(uint64(job), 10)).CombinedOutput(); err != nil {
		t.Fatalf("scancel %d: %v\n%s", job, err, out)
	}
	select {
	case <-p.Done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("npurun outlived its cancelled placeholder job %d by minutes:\n%s", job, p.Output())
	}
	<-p.OutDone
	code, _ := p.Wait()
	if want := fmt.Sprintf("npurun: slurm job %d: the command was ended: Slurm ", job); code != 143 || !strings.Contains(p.Output(), want) {
		t.Errorf("npurun after scancel of its placeholder job: exit %d, want 143 and %q:\n%s", code, want, p.Output())
	}
	n.C.AwaitJobGone(job, time.Minute)
	// The device is Slurm's to give again: the next npurun gets it.
	if code, out := harness.ExitCode(t, n.B.Npurun("-n", "1", "--timeout", "1m", "true")); code != 0 {
		t.Errorf("npurun after the cancelled one: exit %d: %s", code, out)
	}
}

// TestSlurmNodeSubleases: npurun -n 1 inside a 2-device job, with the real
// broker: six run two at a time on the job's devices.
func TestSlurmNodeSubleases(t *testing.T) {
	n := harness.StartSlurmNode(t, harness.SlurmNodeOptions{Devices: 4, Slurm: 2, Mode: "split"})
	u := harness.NewUser(t)
	w := harness.NewWorkload(t)
	bin := harness.Bins(t)
	script := ""
	for i := range 6 {
		script += fmt.Sprintf("%s -n 1 %s -markers %s -log %s -tag j%d -hold 300ms & pids=\"$pids $!\"; ", bin.Npurun, bin.Workload, w.Markers, w.Log, i)
	}
	id := n.C.Sbatch(&u, "--wait", "--gres=gpu:2", "--wrap", script+"for p in $pids; do wait $p || exit 1; done")
	runs := w.Runs(t)
	used := map[string]int{}
	for _, r := range runs {
		used[r.Devices]++
	}
	if len(runs) != 6 || len(used) != 2 || used["2"] == 0 || used["3"] == 0 {
		t.Errorf("job %d: runs %v by device %v; output:\n%s", id, harness.Tags(runs), used, n.C.JobOutput(id))
	}
}
