package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

const (
	benchTaskConns          = 16
	benchTaskSubmitTotal    = 5000
	benchTaskSeqFor         = 1500 * time.Millisecond
	benchTaskSeqMax         = 1000
	benchTaskStartSamples   = 40
	benchTaskHandoffSamples = 60
	benchTaskListTasks      = 10000
	benchTaskListRuns       = 10
)

// benchTaskConfig: one fake device, one CPU slot, and no cap on one
// user's waiting tasks (the default is 1,000).
var benchTaskConfig = harness.FakeConfig(1) + "[tasks]\ncpu_slots = 1\n[limits]\nmax_queued_tasks = 0\n"

// benchTaskSub is a submission as task-submit makes it (this process's
// environment and directory), logging under logDir.
func benchTaskSub(b *testing.B, logDir string, argv ...string) *wire.Submission {
	cwd, _ := os.Getwd() // may be called off the benchmark's goroutine: no b.Fatal
	return &wire.Submission{Argv: argv, Cwd: cwd, Env: os.Environ(), Log: filepath.Join(logDir, "task.log")}
}

// benchTaskLogs hands out a log path per task in a temporary directory.
type benchTaskLogs struct {
	dir string
	n   atomic.Int64
}

func (l *benchTaskLogs) next() string {
	return filepath.Join(l.dir, strconv.FormatInt(l.n.Add(1), 10)+".log")
}

// benchTaskHoldDevice takes br's only device with a lease of this process,
// so that device tasks stay pending. It arranges for br to be stopped
// before the lease is released, so that none of them ever runs.
func benchTaskHoldDevice(b *testing.B, br *harness.Broker) {
	c := br.Dial()
	if err := c.Send(&wire.Request{Op: wire.OpAcquire, N: 1}); err != nil {
		b.Fatal(err)
	}
	r, fds, err := c.Recv(10 * time.Second)
	if err != nil || r.Type != wire.TypeGrant {
		b.Fatalf("holder: %v %v", r, err)
	}
	b.Cleanup(func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	})
	b.Cleanup(br.Stop) // runs first: before the lease and its connection go
}

// benchTaskSubmitAll submits total tasks (made by mk) from conns
// concurrently and returns the time it took and each submission's latency.
func benchTaskSubmitAll(b *testing.B, conns []*wire.Conn, total int, mk func() *wire.Submission) (time.Duration, []time.Duration) {
	var next atomic.Int64
	lats := make([][]time.Duration, len(conns))
	errs := make(chan error, len(conns))
	var wg sync.WaitGroup
	t0 := time.Now()
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(total) {
				s := mk()
				t := time.Now()
				if _, err := c.Submit(s); err != nil {
					errs <- err
					return
				}
				lats[i] = append(lats[i], time.Since(t))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	close(errs)
	for err := range errs {
		b.Fatalf("submit: %v", err)
	}
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	return elapsed, all
}

// BenchmarkTaskSubmit: acknowledged (so durable) submissions per second,
// one client submitting sequentially and 16 concurrently. The tasks never
// run: the blocked ones wait --after a gate task, which is pending behind
// a lease this process holds; the pending ones queue behind that lease.
func BenchmarkTaskSubmit(b *testing.B) {
	benchNoNsPerOp(b)
	br := harness.StartBroker(b, benchTaskConfig)
	benchTaskHoldDevice(b, br)
	pid := benchBrokerPID(b, br)
	logs := b.TempDir()
	c0 := br.Dial()
	gate, err := c0.Submit(benchTaskSub(b, logs, "true"))
	if err != nil {
		b.Fatal(err)
	}
	blocked := func() *wire.Submission {
		s := benchTaskSub(b, logs, "true")
		s.After = []uint64{gate.ID}
		return s
	}
	pending := func() *wire.Submission { return benchTaskSub(b, logs, "true") }
	for range 20 { // warm up
		if _, err := c0.Submit(blocked()); err != nil {
			b.Fatal(err)
		}
	}

	// One client, one submission at a time: one fdatasync each.
	var seq []time.Duration
	t0 := time.Now()
	for time.Since(t0) < benchTaskSeqFor && len(seq) < benchTaskSeqMax {
		s := blocked()
		t := time.Now()
		if _, err := c0.Submit(s); err != nil {
			b.Fatal(err)
		}
		seq = append(seq, time.Since(t))
	}
	seqRate := float64(len(seq)) / time.Since(t0).Seconds()

	conns := make([]*wire.Conn, benchTaskConns)
	for i := range conns {
		conns[i] = br.Dial()
	}
	cpu0 := benchCPU(b, pid)
	blkTime, blkLat := benchTaskSubmitAll(b, conns, benchTaskSubmitTotal, blocked)
	cpuBlk := benchCPU(b, pid) - cpu0
	blkRate := float64(benchTaskSubmitTotal) / blkTime.Seconds()

	cpu0 = benchCPU(b, pid)
	penTime, penLat := benchTaskSubmitAll(b, conns, benchTaskSubmitTotal, pending)
	cpuPen := benchCPU(b, pid) - cpu0
	penRate := float64(benchTaskSubmitTotal) / penTime.Seconds()

	var journal int64
	if st, err := os.Stat(filepath.Join(br.StateDir, "journal")); err == nil {
		journal = st.Size()
	}
	b.ReportMetric(blkRate, "submits/s")
	b.ReportMetric(penRate, "pending-submits/s")
	b.ReportMetric(seqRate, "seq-submits/s")
	b.ReportMetric(benchMs(benchQuantile(seq, .5)), "seq-p50-ms")
	us := func(d time.Duration, n int) string { return fmt.Sprintf("%.0f", float64(d.Microseconds())/float64(n)) }
	benchSummary(b, fmt.Sprintf("durable submissions, --after a pending task or pending behind a lease (target ≥ 2000/s with %d clients)", benchTaskConns), [][]string{
		{"", "tasks", "submits/s", "p50 ms", "p99 ms", "broker CPU µs/task"},
		{"1 client, sequential (blocked)", strconv.Itoa(len(seq)), fmt.Sprintf("%.0f", seqRate), benchF3(benchQuantile(seq, .5)), benchF3(benchQuantile(seq, .99)), ""},
		{fmt.Sprintf("%d clients, blocked (--after)", benchTaskConns), strconv.Itoa(benchTaskSubmitTotal), fmt.Sprintf("%.0f", blkRate), benchF3(benchQuantile(blkLat, .5)), benchF3(benchQuantile(blkLat, .99)), us(cpuBlk, benchTaskSubmitTotal)},
		{fmt.Sprintf("%d clients, pending (queued)", benchTaskConns), strconv.Itoa(benchTaskSubmitTotal), fmt.Sprintf("%.0f", penRate), benchF3(benchQuantile(penLat, .5)), benchF3(benchQuantile(penLat, .99)), us(cpuPen, benchTaskSubmitTotal)},
		{"journal", fmt.Sprintf("%.1f MiB, %d env vars a task", float64(journal)/benchMib, len(os.Environ()))},
	})
}

// benchTaskRunOne submits s, waits for it to end, and returns the times
// from just before Submit to its acknowledgement, to its command's stamp
// and to Wait's return.
func benchTaskRunOne(b *testing.B, c *wire.Conn, s *wire.Submission, stamp string) (ack, start, end time.Duration) {
	os.Remove(stamp)
	t0 := time.Now()
	r, err := c.Submit(s)
	if err != nil {
		b.Fatal(err)
	}
	ack = time.Since(t0)
	ti, err := c.Wait(r.ID)
	if err != nil {
		b.Fatal(err)
	}
	end = time.Since(t0)
	if ti.State != wire.StateDone {
		b.Fatalf("task %d: %s %s", ti.ID, ti.State, ti.Reason)
	}
	start = benchSince(b, t0, stamp)
	return
}

// benchKillIdle kills the idle supervisor the broker keeps for this
// process's user and waits until it has been reaped, so that the next
// task's supervisor is started cold.
func benchKillIdle(b *testing.B, br *harness.Broker) {
	pid := harness.AwaitIdle(b, br, uint32(os.Geteuid()))
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		b.Fatal(err)
	}
	for deadline := time.Now().Add(harness.EventTimeout); ; time.Sleep(100 * time.Microsecond) {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			return // reaped by the broker, which forgets it
		}
		if time.Now().After(deadline) {
			b.Fatalf("the killed idle supervisor %d was not reaped within %s", pid, harness.EventTimeout)
		}
	}
}

// BenchmarkTaskStart: from just before `task-submit -- CMD` starts to CMD
// starting, the line empty, beside `tsp CMD` (task-spooler, one slot), and
// the same through the protocol in this process; CMD stamps the time as
// it starts. task-submit is measured with its user's idle supervisor ready
// (as a sweep's tasks find it, and any task within 2 minutes of the last)
// and without (it was killed: the supervisor is started for the task).
func BenchmarkTaskStart(b *testing.B) {
	benchNoNsPerOp(b)
	br := harness.StartBroker(b, benchTaskConfig)
	p := peers(b)
	ts := startTsp(b)
	c := br.Dial()
	dir := harness.SharedDir(b)
	stamp := filepath.Join(dir, "stamp")
	logs := &benchTaskLogs{dir: dir}
	taskSubmit := func(args ...string) time.Duration {
		os.Remove(stamp)
		cmd := br.TaskSubmit(append(append([]string{"--log", logs.next()}, args...), p.stampArgs(stamp)...)...)
		t0, out := benchSubmit(b, cmd)
		var id uint64
		if _, err := fmt.Sscanf(out, "task %d submitted", &id); err != nil {
			b.Fatalf("task-submit said %q", out)
		}
		if ti, err := c.Wait(id); err != nil || ti.State != wire.StateDone {
			b.Fatalf("task %d: %+v %v", id, ti, err)
		}
		return benchSince(b, t0, stamp)
	}
	warm := &benchSide{name: "task-submit -- CMD", sample: func() time.Duration { return taskSubmit("--") }}
	cold := &benchSide{name: "  the same, no idle supervisor", sample: func() time.Duration {
		benchKillIdle(b, br)
		return taskSubmit("--")
	}}
	cpu := &benchSide{name: "task-submit --no-device -- CMD", sample: func() time.Duration { return taskSubmit("--no-device", "--") }}
	tsp := &benchSide{name: "tsp CMD", sample: func() time.Duration {
		os.Remove(stamp)
		t0, out := benchSubmit(b, ts.cmd(p.stampArgs(stamp)...))
		ts.wait(b, tspJobID(b, out))
		return benchSince(b, t0, stamp)
	}}
	proto := &benchSide{name: "Submit in this process", sample: func() time.Duration {
		s := benchTaskSub(b, dir, p.stampArgs(stamp)...)
		s.Log = logs.next()
		_, start, _ := benchTaskRunOne(b, c, s, stamp)
		return start
	}}
	truth := &benchSide{name: "/bin/true", sample: func() time.Duration { return benchTrue(b) }}
	sides := []*benchSide{warm, tsp, cold, cpu, proto, truth}
	benchInterleave(3, sides...)
	for _, s := range sides {
		s.got = nil
	}
	benchInterleave(benchTaskStartSamples, sides...)
	b.ReportMetric(benchMs(warm.p50()), "task-submit-p50-ms")
	b.ReportMetric(benchMs(cold.p50()), "cold-p50-ms")
	b.ReportMetric(benchMs(tsp.p50()), "tsp-p50-ms")
	b.ReportMetric(float64(warm.p50())/float64(tsp.p50()), "ratio")
	b.ReportMetric(float64(cold.p50())/float64(tsp.p50()), "cold-ratio")
	benchSummary(b, fmt.Sprintf("submit → command start, whole commands, empty line, %d each, interleaved; CMD: %s (target ≤ 1.5× tsp)", benchTaskStartSamples, p.Stamper), [][]string{
		{"", "p10 ms", "p50 ms", "p90 ms"},
		warm.row(), cold.row(), cpu.row(), tsp.row(), proto.row(), truth.row(),
		{"task-submit / tsp, p50", ratio(warm, tsp) + " (no idle supervisor: " + ratio(cold, tsp) + ")"},
	})
}

// benchGate waits until a job has the FIFO at path open for reading (it
// runs, and waits for us) and returns the writing end; what the job is,
// for a failure.
func benchGate(b *testing.B, path string, what func() string) int {
	deadline := time.Now().Add(10 * time.Second)
	for {
		fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err == nil {
			return fd
		}
		if !errors.Is(err, unix.ENXIO) || time.Now().After(deadline) {
			b.Fatalf("job A never opened the FIFO: %v (%s)", err, what())
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// benchHandoffArgs are job A's command, which waits on the FIFO, then
// execs the stamper on file a, and job B's, the stamper on file bb.
func benchHandoffArgs(p *benchPeers, fifo, a, bb string) (argvA, argvB []string) {
	argvA = append([]string{"sh", "-c", `read x < "$1"; shift; exec "$@"`, "sh", fifo}, p.stampArgs(a)...)
	return argvA, p.stampArgs(bb)
}

// benchTaskHandoffOne: task A holds the only device until this process
// writes to a FIFO A reads, then stamps and exits; task B, queued behind
// it, stamps as it starts.
func benchTaskHandoffOne(b *testing.B, c *wire.Conn, p *benchPeers, logs *benchTaskLogs, dir string) time.Duration {
	a, bb, fifo := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "fifo")
	os.Remove(a)
	os.Remove(bb)
	argvA, argvB := benchHandoffArgs(p, fifo, a, bb)
	sa := benchTaskSub(b, logs.dir, argvA...)
	sa.Log = logs.next()
	ra, err := c.Submit(sa)
	if err != nil {
		b.Fatal(err)
	}
	fd := benchGate(b, fifo, func() string { ti, _ := c.Show(ra.ID); return fmt.Sprintf("task %+v", ti) })
	sb := benchTaskSub(b, logs.dir, argvB...)
	sb.Log = logs.next()
	rb, err := c.Submit(sb)
	if err != nil {
		b.Fatal(err)
	}
	if rb.Position == 0 {
		b.Fatalf("task B was not queued behind A: %+v", rb)
	}
	if _, err := unix.Write(fd, []byte("go\n")); err != nil {
		b.Fatal(err)
	}
	unix.Close(fd)
	for _, id := range []uint64{ra.ID, rb.ID} {
		ti, err := c.Wait(id)
		if err != nil {
			b.Fatal(err)
		}
		if ti.State != wire.StateDone {
			b.Fatalf("task %d: %s %s", ti.ID, ti.State, ti.Reason)
		}
	}
	return time.Duration(benchReadStamp(b, bb) - benchReadStamp(b, a))
}

// benchTspHandoffOne is the same handoff between two tsp jobs, one slot.
func benchTspHandoffOne(b *testing.B, ts *benchTsp, p *benchPeers, dir string) time.Duration {
	a, bb, fifo := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "fifo")
	os.Remove(a)
	os.Remove(bb)
	argvA, argvB := benchHandoffArgs(p, fifo, a, bb)
	ja := tspJobID(b, ts.run(b, argvA...))
	fd := benchGate(b, fifo, func() string { return "tsp job " + ja + ": " + ts.run(b, "-s", ja) })
	jb := tspJobID(b, ts.run(b, argvB...))
	if st := strings.TrimSpace(ts.run(b, "-s", jb)); st != "queued" {
		b.Fatalf("tsp job B is %s, not queued behind A", st)
	}
	if _, err := unix.Write(fd, []byte("go\n")); err != nil {
		b.Fatal(err)
	}
	unix.Close(fd)
	ts.wait(b, ja)
	ts.wait(b, jb)
	return time.Duration(benchReadStamp(b, bb) - benchReadStamp(b, a))
}

// BenchmarkTaskHandoff: from task A's end to the start of task B, queued
// behind it for the only device, beside the same between two tsp jobs
// (one slot), interleaved. A's last action is exec'ing the stamper, whose
// exit is its end; B's command is the stamper.
func BenchmarkTaskHandoff(b *testing.B) {
	benchNoNsPerOp(b)
	br := harness.StartBroker(b, benchTaskConfig)
	p := peers(b)
	ts := startTsp(b)
	c := br.Dial()
	logs := &benchTaskLogs{dir: b.TempDir()}
	tdir, sdir := harness.SharedDir(b), harness.SharedDir(b)
	for _, d := range []string{tdir, sdir} {
		if err := unix.Mkfifo(filepath.Join(d, "fifo"), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	tasks := &benchSide{name: "tasks (1 device)", sample: func() time.Duration { return benchTaskHandoffOne(b, c, p, logs, tdir) }}
	tsp := &benchSide{name: "tsp (1 slot)", sample: func() time.Duration { return benchTspHandoffOne(b, ts, p, sdir) }}
	truth := &benchSide{name: "/bin/true", sample: func() time.Duration { return benchTrue(b) }}
	sides := []*benchSide{tasks, tsp, truth}
	benchInterleave(3, sides...)
	for _, s := range sides {
		s.got = nil
	}
	benchInterleave(benchTaskHandoffSamples, sides...)
	b.ReportMetric(benchMs(tasks.p50()), "task-p50-ms")
	b.ReportMetric(benchMs(benchQuantile(tasks.got, .9)), "task-p90-ms")
	b.ReportMetric(benchMs(tsp.p50()), "tsp-p50-ms")
	b.ReportMetric(float64(tasks.p50())/float64(tsp.p50()), "ratio")
	benchSummary(b, fmt.Sprintf("task handoff, A's end → queued B's command, %d each, interleaved; commands: %s (target ≤ 1.0× tsp)", benchTaskHandoffSamples, p.Stamper), [][]string{
		{"", "p10 ms", "p50 ms", "p90 ms"},
		tasks.row(), tsp.row(), truth.row(),
		{"tasks / tsp, p50", ratio(tasks, tsp)},
	})
}

// benchTaskListTimeout bounds one list: a list whose replies the broker
// drops never ends.
const benchTaskListTimeout = 2 * time.Second

// benchTaskListCLI times one task-submit run; ok is false when it did not
// finish within benchTaskListTimeout.
func benchTaskListCLI(b *testing.B, br *harness.Broker, args []string) (d time.Duration, out int, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), benchTaskListTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, br.Bin.TaskSubmit, args...)
	cmd.Env = br.Env()
	var n benchCounter
	cmd.Stdout = &n
	t0 := time.Now()
	err := cmd.Run()
	d = time.Since(t0)
	if ctx.Err() != nil {
		return d, int(n), false
	}
	if err != nil {
		b.Fatalf("task-submit %v: %v", args, err)
	}
	return d, int(n), true
}

type benchCounter int

func (c *benchCounter) Write(p []byte) (int, error) { *c += benchCounter(len(p)); return len(p), nil }

// benchTaskListProto is the list exchange in this process on a fresh
// connection: how long it took, how many tasks and replies came, and
// whether the last reply came.
func benchTaskListProto(b *testing.B, br *harness.Broker) (d time.Duration, tasks, replies int, ok bool) {
	c, err := wire.Dial(br.Socket)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	t0 := time.Now()
	req := &wire.Request{Op: wire.OpList}
	for {
		if err := c.Send(req); err != nil {
			b.Fatal(err)
		}
		r, _, err := c.Recv(benchTaskListTimeout)
		if err == wire.ErrTimeout {
			return time.Since(t0), tasks, replies, false
		}
		if err != nil || r.Type != wire.TypeTasks {
			b.Fatalf("list: %v %v", r, err)
		}
		replies++
		tasks += len(r.Tasks)
		if !r.More {
			return time.Since(t0), tasks, replies, true
		}
		req = &wire.Request{Op: wire.OpList, After: r.Next}
	}
}

// BenchmarkTaskList: whole-process wall time of `task-submit list` (and
// --json, --all) with 1,000 and then 10,000 tasks pending behind a lease.
// A list that does not finish within benchTaskListTimeout is shown as hung.
func BenchmarkTaskList(b *testing.B) {
	benchNoNsPerOp(b)
	br := harness.StartBroker(b, benchTaskConfig)
	benchTaskHoldDevice(b, br)
	logs := b.TempDir()
	conns := make([]*wire.Conn, benchTaskConns)
	for i := range conns {
		conns[i] = br.Dial()
	}
	mk := func() *wire.Submission { return benchTaskSub(b, logs, "true") }
	variants := [][]string{{"list"}, {"list", "--json"}, {"list", "--all"}, {"--version"}}
	sizes := []int{benchTaskListTasks / 10, benchTaskListTasks}
	cells := make([][]string, len(variants)+1) // per variant, then the protocol: a cell per size
	var fill time.Duration
	var p50s []time.Duration
	var out10k []int
	have := 0
	for _, size := range sizes {
		d, _ := benchTaskSubmitAll(b, conns, size-have, mk)
		fill += d
		have = size
		for i, v := range variants {
			var ds []time.Duration
			hung := 0
			_, n, ok := benchTaskListCLI(b, br, v) // warm up
			if size == benchTaskListTasks {
				out10k = append(out10k, n)
			}
			for r := 0; ok && r < benchTaskListRuns; r++ {
				d, _, ok1 := benchTaskListCLI(b, br, v)
				if !ok1 {
					hung++
					continue
				}
				ds = append(ds, d)
			}
			switch {
			case !ok:
				cells[i] = append(cells[i], fmt.Sprintf("hung (%.2f MiB out)", float64(n)/benchMib))
			case hung > 0:
				cells[i] = append(cells[i], fmt.Sprintf("%s p50 (%d/%d hung)", benchF3(benchQuantile(ds, .5)), hung, benchTaskListRuns))
			default:
				cells[i] = append(cells[i], fmt.Sprintf("%s / %s", benchF3(benchQuantile(ds, .5)), benchF3(benchQuantile(ds, .9))))
			}
			if i == 0 && size == benchTaskListTasks {
				p50s = append(p50s, benchQuantile(ds, .5))
			}
		}
		var ds []time.Duration
		cell := ""
		for range benchTaskListRuns {
			d, tasks, replies, ok := benchTaskListProto(b, br)
			if !ok {
				cell = fmt.Sprintf("hung after %d of %d tasks, %d replies", tasks, size, replies)
				break
			}
			ds = append(ds, d)
		}
		if cell == "" {
			cell = fmt.Sprintf("%s / %s", benchF3(benchQuantile(ds, .5)), benchF3(benchQuantile(ds, .9)))
		}
		cells[len(variants)] = append(cells[len(variants)], cell)
	}
	if len(p50s) > 0 && p50s[0] > 0 {
		b.ReportMetric(benchMs(p50s[0]), "list-10k-p50-ms")
	}
	names := []string{"task-submit list", "task-submit list --json", "task-submit list --all", "task-submit --version (floor)", "Conn.List in this process"}
	rows := [][]string{{"", fmt.Sprintf("%d tasks: p50 / p90 ms", sizes[0]), fmt.Sprintf("%d tasks: p50 / p90 ms", sizes[1])}}
	for i, name := range names {
		rows = append(rows, append([]string{name}, cells[i]...))
	}
	rows = append(rows, []string{fmt.Sprintf("stdout at %d: list, --json, --all", sizes[1]), fmt.Sprintf("%.2f, %.2f, %.2f MiB", float64(out10k[0])/benchMib, float64(out10k[1])/benchMib, float64(out10k[2])/benchMib)})
	rows = append(rows, []string{fmt.Sprintf("filling: %d submits, %d clients", have, benchTaskConns), fmt.Sprintf("%.0f/s", float64(have)/fill.Seconds())})
	benchSummary(b, fmt.Sprintf("task-submit list, pending tasks, %d runs each, whole process (target ≤ 100 ms at %d)", benchTaskListRuns, benchTaskListTasks), rows)
}
