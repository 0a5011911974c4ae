package tests

// Benchmarks of detached tasks, in the style of bench_test.go: each body
// runs once (-benchtime 1x), measures over many samples and prints figures
// beside their targets; nothing is asserted against the targets.
//
//	BenchmarkTaskSubmit   durable submissions/s, 16 protocol clients         ≥ 2,000/s
//	BenchmarkTaskStart    Submit → the task's command starts, free device    p50 ≤ 5 ms
//	BenchmarkTaskHandoff  task A's last action → queued task B's command     p50 ≤ 1.2× flock(1)
//	BenchmarkTaskList     `task-submit list` with 10,000 tasks in the spool  ≤ 100 ms
//
// No task that might run is left behind: tasks that must not run wait
// behind a lease this process holds (or --after a task that does), and the
// broker is stopped before that lease goes. Every task logs into a
// temporary directory.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/client"
)

const (
	benchTaskConns          = 16
	benchTaskSubmitTotal    = 5000
	benchTaskSeqFor         = 1500 * time.Millisecond
	benchTaskSeqMax         = 1000
	benchTaskStartSamples   = 60
	benchTaskHandoffSamples = 60
	benchTaskListTasks      = 10000
	benchTaskListRuns       = 10
)

// benchTaskConfig: one fake device, one CPU slot, and no cap on one
// user's waiting tasks (the default is 1,000).
var benchTaskConfig = FakeConfig(1) + "[tasks]\ncpu_slots = 1\n[limits]\nmax_queued_tasks = 0\n"

// benchTaskSub is a submission as task-submit makes it (this process's
// environment and directory), logging under logDir.
func benchTaskSub(b *testing.B, logDir string, argv ...string) *client.Submission {
	cwd, _ := os.Getwd() // may be called off the benchmark's goroutine: no b.Fatal
	return &client.Submission{Argv: argv, Cwd: cwd, Env: os.Environ(), Log: filepath.Join(logDir, "task.log")}
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
func benchTaskHoldDevice(b *testing.B, br *Broker) {
	c := br.Dial()
	if err := c.Send(&client.Request{Op: client.OpAcquire, N: 1}); err != nil {
		b.Fatal(err)
	}
	r, fds, err := c.Recv(10 * time.Second)
	if err != nil || r.Type != client.TypeGrant {
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
func benchTaskSubmitAll(b *testing.B, conns []*client.Conn, total int, mk func() *client.Submission) (time.Duration, []time.Duration) {
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
	br := StartBroker(b, benchTaskConfig)
	benchTaskHoldDevice(b, br)
	pid := benchBrokerPID(b, br)
	logs := b.TempDir()
	c0 := br.Dial()
	gate, err := c0.Submit(benchTaskSub(b, logs, "true"))
	if err != nil {
		b.Fatal(err)
	}
	blocked := func() *client.Submission {
		s := benchTaskSub(b, logs, "true")
		s.After = []uint64{gate.ID}
		return s
	}
	pending := func() *client.Submission { return benchTaskSub(b, logs, "true") }
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

	conns := make([]*client.Conn, benchTaskConns)
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

// benchTaskStamp is a command that stamps the time into $1 as it starts.
var benchTaskStamp = []string{"sh", "-c", benchWaiterScript, "sh"}

// benchTaskRunOne submits s, waits for it to end, and returns the times
// from just before Submit to its acknowledgement, to its command's stamp
// and to Wait's return.
func benchTaskRunOne(b *testing.B, c *client.Conn, s *client.Submission, stamp string) (ack, start, end time.Duration) {
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
	if ti.State != client.StateDone {
		b.Fatalf("task %d: %s %s", ti.ID, ti.State, ti.Reason)
	}
	start = time.Duration(benchReadStamp(b, stamp) - t0.UnixNano())
	return
}

// BenchmarkTaskStart: from just before Submit to the task's command
// starting, on a free device (and on a free CPU slot), one task at a time.
func BenchmarkTaskStart(b *testing.B) {
	benchNoNsPerOp(b)
	br := StartBroker(b, benchTaskConfig)
	c := br.Dial()
	logs := &benchTaskLogs{dir: b.TempDir()}
	stamp := filepath.Join(b.TempDir(), "stamp")
	mk := func(noDevice bool) *client.Submission {
		s := benchTaskSub(b, logs.dir, append(benchTaskStamp, stamp)...)
		s.Log, s.NoDevice = logs.next(), noDevice
		return s
	}
	// The floor: the same command started straight from this process.
	direct := func() time.Duration {
		os.Remove(stamp)
		cmd := exec.Command("sh", "-c", benchWaiterScript, "sh", stamp)
		t0 := time.Now()
		if err := cmd.Run(); err != nil {
			b.Fatal(err)
		}
		return time.Duration(benchReadStamp(b, stamp) - t0.UnixNano())
	}
	for range 3 {
		benchTaskRunOne(b, c, mk(false), stamp)
		direct()
	}
	var ack, start, end, cpuStart, floor []time.Duration
	for range benchTaskStartSamples {
		a, s, e := benchTaskRunOne(b, c, mk(false), stamp)
		ack, start, end = append(ack, a), append(start, s), append(end, e)
		_, s, _ = benchTaskRunOne(b, c, mk(true), stamp)
		cpuStart = append(cpuStart, s)
		floor = append(floor, direct())
	}
	p50 := benchQuantile(start, .5)
	b.ReportMetric(benchMs(p50), "start-p50-ms")
	b.ReportMetric(benchMs(benchQuantile(start, .9)), "start-p90-ms")
	b.ReportMetric(benchMs(benchQuantile(floor, .5)), "direct-p50-ms")
	row := func(name string, ds []time.Duration) []string {
		return []string{name, benchF3(benchQuantile(ds, .1)), benchF3(benchQuantile(ds, .5)), benchF3(benchQuantile(ds, .9))}
	}
	benchSummary(b, fmt.Sprintf("submit → command start, %d tasks one at a time (target p50 ≤ 5 ms)", benchTaskStartSamples), [][]string{
		{"", "p10 ms", "p50 ms", "p90 ms"},
		row("submit → acknowledged (durable)", ack),
		row("submit → command starts (device)", start),
		row("submit → command starts (--no-device)", cpuStart),
		row("submit → wait returns (device)", end),
		row("fork/exec from this process (floor)", floor),
	})
}

// benchTaskHandoffOne: task A holds the only device until this process
// writes to a FIFO A reads, then stamps and exits; task B, queued behind
// it, stamps as it starts.
func benchTaskHandoffOne(b *testing.B, c *client.Conn, logs *benchTaskLogs, dir string) time.Duration {
	a, bb, fifo := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "fifo")
	os.Remove(a)
	os.Remove(bb)
	sa := benchTaskSub(b, logs.dir, "sh", "-c", `read x < "$2"; exec date +%s%N > "$1"`, "sh", a, fifo)
	sa.Log = logs.next()
	ra, err := c.Submit(sa)
	if err != nil {
		b.Fatal(err)
	}
	// A is running once it has the FIFO open for reading.
	var fd int
	deadline := time.Now().Add(10 * time.Second)
	for {
		fd, err = unix.Open(fifo, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.ENXIO) || time.Now().After(deadline) {
			ti, _ := c.Show(ra.ID)
			b.Fatalf("task A never opened the FIFO: %v (task: %+v)", err, ti)
		}
		time.Sleep(100 * time.Microsecond)
	}
	sb := benchTaskSub(b, logs.dir, append(benchTaskStamp, bb)...)
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
		if ti.State != client.StateDone {
			b.Fatalf("task %d: %s %s", ti.ID, ti.State, ti.Reason)
		}
	}
	return time.Duration(benchReadStamp(b, bb) - benchReadStamp(b, a))
}

// BenchmarkTaskHandoff: from task A's last action to the start of task B,
// queued behind it for the only device, against the same handoff between
// two flock(1) commands, interleaved.
func BenchmarkTaskHandoff(b *testing.B) {
	benchNoNsPerOp(b)
	br := StartBroker(b, benchTaskConfig)
	c := br.Dial()
	logs := &benchTaskLogs{dir: b.TempDir()}
	tdir := b.TempDir()
	if err := unix.Mkfifo(filepath.Join(tdir, "fifo"), 0o600); err != nil {
		b.Fatal(err)
	}
	dir, lock, ino := benchFlockFile(b)
	for range 3 {
		benchTaskHandoffOne(b, c, logs, tdir)
		benchHandoffFlock(b, lock, ino, dir)
	}
	var ht, hf []time.Duration
	for i := range benchTaskHandoffSamples {
		if i%2 == 0 {
			ht = append(ht, benchTaskHandoffOne(b, c, logs, tdir))
			hf = append(hf, benchHandoffFlock(b, lock, ino, dir))
		} else {
			hf = append(hf, benchHandoffFlock(b, lock, ino, dir))
			ht = append(ht, benchTaskHandoffOne(b, c, logs, tdir))
		}
	}
	t50, f50 := benchQuantile(ht, .5), benchQuantile(hf, .5)
	ratio := float64(t50) / float64(f50)
	b.ReportMetric(benchMs(t50), "task-p50-ms")
	b.ReportMetric(benchMs(benchQuantile(ht, .9)), "task-p90-ms")
	b.ReportMetric(benchMs(f50), "flock-p50-ms")
	b.ReportMetric(ratio, "ratio")
	benchSummary(b, fmt.Sprintf("task handoff, A's last action → queued B's command, %d samples each (target p50 ratio ≤ 1.2)", benchTaskHandoffSamples), [][]string{
		{"", "p10 ms", "p50 ms", "p90 ms", "max ms"},
		{"tasks (1 device)", benchF3(benchQuantile(ht, .1)), benchF3(t50), benchF3(benchQuantile(ht, .9)), benchF3(benchQuantile(ht, 1))},
		{"flock(1)", benchF3(benchQuantile(hf, .1)), benchF3(f50), benchF3(benchQuantile(hf, .9)), benchF3(benchQuantile(hf, 1))},
		{"ratio p50", fmt.Sprintf("%.2f×", ratio)},
	})
}

// benchTaskListTimeout bounds one list: a list whose replies the broker
// drops never ends.
const benchTaskListTimeout = 2 * time.Second

// benchTaskListCLI times one task-submit run; ok is false when it did not
// finish within benchTaskListTimeout.
func benchTaskListCLI(b *testing.B, br *Broker, args []string) (d time.Duration, out int, ok bool) {
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
func benchTaskListProto(b *testing.B, br *Broker) (d time.Duration, tasks, replies int, ok bool) {
	c, err := client.Dial(br.Socket)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	t0 := time.Now()
	req := &client.Request{Op: client.OpList}
	for {
		if err := c.Send(req); err != nil {
			b.Fatal(err)
		}
		r, _, err := c.Recv(benchTaskListTimeout)
		if err == client.ErrTimeout {
			return time.Since(t0), tasks, replies, false
		}
		if err != nil || r.Type != client.TypeTasks {
			b.Fatalf("list: %v %v", r, err)
		}
		replies++
		tasks += len(r.Tasks)
		if !r.More {
			return time.Since(t0), tasks, replies, true
		}
		req = &client.Request{Op: client.OpList, After: r.Next}
	}
}

// BenchmarkTaskList: whole-process wall time of `task-submit list` (and
// --json, --all) with 1,000 and then 10,000 tasks pending behind a lease.
// A list that does not finish within benchTaskListTimeout is shown as hung.
func BenchmarkTaskList(b *testing.B) {
	benchNoNsPerOp(b)
	br := StartBroker(b, benchTaskConfig)
	benchTaskHoldDevice(b, br)
	logs := b.TempDir()
	conns := make([]*client.Conn, benchTaskConns)
	for i := range conns {
		conns[i] = br.Dial()
	}
	mk := func() *client.Submission { return benchTaskSub(b, logs, "true") }
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
