package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// Sample counts and durations; the whole suite runs in well under a minute
// on two cores.
const (
	benchStartSamples    = 200
	benchStartWarmup     = 10
	benchHandoffSamples  = 100
	benchThroughputConns = 64
	benchThroughputDevs  = 4
	benchThroughputFor   = 3 * time.Second
	benchMemWaiters      = 10000
)

// benchQuantile returns the q-quantile (0..1) of ds, nearest rank.
func benchQuantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s)) + 0.5)
	i = min(max(i-1, 0), len(s)-1)
	return s[i]
}

func benchMs(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// benchNoNsPerOp hides the meaningless ns/op of a body that runs once.
func benchNoNsPerOp(b *testing.B) { b.ReportMetric(0, "ns/op") }

// benchSummary prints an aligned table after the benchmark's result line
// (keep it under 10 lines: the testing package truncates benchmark logs).
func benchSummary(b *testing.B, title string, rows [][]string) {
	var sb strings.Builder
	widths := make([]int, 0)
	for _, r := range rows {
		for i, c := range r {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	fmt.Fprintf(&sb, "== %s ==", title)
	for _, r := range rows {
		line := ""
		for i, c := range r {
			line += fmt.Sprintf("  %-*s", widths[i], c)
		}
		sb.WriteString("\n" + strings.TrimRight(line, " "))
	}
	b.Log(sb.String())
}

func benchTimeRun(b *testing.B, cmd *exec.Cmd) time.Duration {
	t0 := time.Now()
	if err := cmd.Run(); err != nil {
		b.Fatalf("%v: %v", cmd.Args, err)
	}
	return time.Since(t0)
}

// BenchmarkStart: whole-process wall time of an uncontended
// `npurun -- /bin/true` beside a Go program that only execs /bin/true (the
// floor of a Go front end, built as npurun is), `flock LOCKFILE /bin/true`
// and /bin/true itself, interleaved.
func BenchmarkStart(b *testing.B) {
	benchNoNsPerOp(b)
	br := harness.StartBroker(b, harness.FakeConfig(4))
	p := peers(b)
	lock := filepath.Join(harness.SharedDir(b), "lock")
	if err := os.WriteFile(lock, nil, 0o644); err != nil {
		b.Fatal(err)
	}
	npurun := &benchSide{name: "npurun -- /bin/true", sample: func() time.Duration {
		return benchTimeRun(b, br.Npurun("--", "/bin/true")) // stdio: /dev/null
	}}
	floor := &benchSide{name: "Go program exec'ing /bin/true", sample: func() time.Duration {
		return benchTimeRun(b, exec.Command(p.GoFloor))
	}}
	flock := &benchSide{name: "flock L /bin/true", sample: func() time.Duration {
		return benchTimeRun(b, exec.Command("flock", lock, "/bin/true"))
	}}
	truth := &benchSide{name: "/bin/true", sample: func() time.Duration { return benchTrue(b) }}
	benchInterleave(benchStartWarmup, npurun, floor, flock, truth)
	for _, s := range []*benchSide{npurun, floor, flock, truth} {
		s.got = nil
	}
	benchInterleave(benchStartSamples, npurun, floor, flock, truth)
	b.ReportMetric(benchMs(npurun.p50()), "npurun-p50-ms")
	b.ReportMetric(benchMs(floor.p50()), "gofloor-p50-ms")
	b.ReportMetric(benchMs(flock.p50()), "flock-p50-ms")
	b.ReportMetric(benchMs(truth.p50()), "true-p50-ms")
	b.ReportMetric(float64(npurun.p50())/float64(floor.p50()), "ratio-gofloor")
	b.ReportMetric(float64(npurun.p50())/float64(flock.p50()), "ratio-flock")
	benchSummary(b, fmt.Sprintf("uncontended start, %d runs each, interleaved (targets: ≤ 1.15× the Go floor; ≤ 1.3× flock)", benchStartSamples), [][]string{
		{"", "p10 ms", "p50 ms", "p90 ms"},
		npurun.row(), floor.row(), flock.row(), truth.row(),
		{"npurun / Go floor, p50", ratio(npurun, floor)},
		{"npurun / flock, p50", ratio(npurun, flock)},
	})
}

func benchF3(d time.Duration) string { return fmt.Sprintf("%.3f", benchMs(d)) }

// benchReadStamp reads a `date +%s%N` stamp.
func benchReadStamp(b *testing.B, path string) int64 {
	data, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		b.Fatalf("%s: %v", path, err)
	}
	return v
}

// benchStartHolder starts cmd, whose shell says "ready" once it holds the lock and
// then waits for a line on its standard input before its last action.
type benchHolder struct {
	cmd *exec.Cmd
	in  io.WriteCloser
}

func benchStartHolder(b *testing.B, cmd *exec.Cmd) *benchHolder {
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		b.Fatalf("holder %v: said %q, %v", cmd.Args, line, err)
	}
	return &benchHolder{cmd: cmd, in: in}
}

// release lets the holder take its last action and exit.
func (h *benchHolder) release(b *testing.B) {
	if _, err := io.WriteString(h.in, "go\n"); err != nil {
		b.Fatal(err)
	}
	h.in.Close()
}

// The holder's last action stamps A and is its last process's exit; the
// waiter's command stamps B as it starts. exec keeps one process per side.
const (
	benchHolderScript = `echo ready; read x; exec date +%s%N > "$1"`
	benchWaiterScript = `exec date +%s%N > "$1"`
)

// benchHandoffNpurun measures one npurun handoff on a broker with one device.
func benchHandoffNpurun(b *testing.B, br *harness.Broker, dir string) time.Duration {
	a, bb := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	os.Remove(a)
	os.Remove(bb)
	h := benchStartHolder(b, br.Npurun("-q", "--", "sh", "-c", benchHolderScript, "sh", a))
	w := br.Npurun("-v", "--", "sh", "-c", benchWaiterScript, "sh", bb)
	errp, err := w.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := w.Start(); err != nil {
		b.Fatal(err)
	}
	waiting := make(chan struct{})
	var log strings.Builder
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(errp)
		said := false
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
			if !said && strings.Contains(sc.Text(), "waiting") {
				said = true
				close(waiting)
			}
		}
	}()
	select {
	case <-waiting:
	case <-done:
		b.Fatalf("waiter ended without waiting:\n%s", log.String())
	case <-time.After(10 * time.Second):
		b.Fatalf("waiter never said it waits:\n%s", log.String())
	}
	h.release(b)
	if err := h.cmd.Wait(); err != nil {
		b.Fatalf("holder: %v", err)
	}
	<-done
	if err := w.Wait(); err != nil {
		b.Fatalf("waiter: %v\n%s", err, log.String())
	}
	return time.Duration(benchReadStamp(b, bb) - benchReadStamp(b, a))
}

// benchBlockedOn reports whether /proc/locks shows pid blocked on inode ino.
func benchBlockedOn(pid int, ino uint64) bool {
	data, err := os.ReadFile("/proc/locks")
	if err != nil {
		return false
	}
	suffix := ":" + strconv.FormatUint(ino, 10)
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		// "3: -> FLOCK  ADVISORY  WRITE 1234 00:2a:5678 0 EOF"
		if len(f) >= 7 && f[1] == "->" && f[5] == strconv.Itoa(pid) && strings.HasSuffix(f[6], suffix) {
			return true
		}
	}
	return false
}

// benchHandoffFlock measures the same handoff between two flock(1) commands.
func benchHandoffFlock(b *testing.B, lock string, ino uint64, dir string) time.Duration {
	a, bb := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	os.Remove(a)
	os.Remove(bb)
	h := benchStartHolder(b, exec.Command("flock", lock, "sh", "-c", benchHolderScript, "sh", a))
	w := exec.Command("flock", lock, "sh", "-c", benchWaiterScript, "sh", bb)
	if err := w.Start(); err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !benchBlockedOn(w.Process.Pid, ino) {
		if time.Now().After(deadline) {
			b.Fatal("flock waiter never showed as blocked in /proc/locks")
		}
		time.Sleep(100 * time.Microsecond)
	}
	h.release(b)
	if err := h.cmd.Wait(); err != nil {
		b.Fatalf("holder: %v", err)
	}
	if err := w.Wait(); err != nil {
		b.Fatalf("waiter: %v", err)
	}
	return time.Duration(benchReadStamp(b, bb) - benchReadStamp(b, a))
}

// benchFlockFile makes the lock file the flock(1) side of a handoff
// measurement uses, in a directory every user may enter; it returns the
// directory, the file and its inode (to find its waiters in /proc/locks).
func benchFlockFile(b *testing.B) (dir, lock string, ino uint64) {
	dir = harness.SharedDir(b)
	lock = filepath.Join(dir, "lock")
	if err := os.WriteFile(lock, nil, 0o644); err != nil {
		b.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(lock, &st); err != nil {
		b.Fatal(err)
	}
	return dir, lock, st.Ino
}

// BenchmarkHandoff: from the holder's last action to the queued waiter's
// command start, npurun (one fake device) against flock(1), interleaved.
func BenchmarkHandoff(b *testing.B) {
	benchNoNsPerOp(b)
	br := harness.StartBroker(b, harness.FakeConfig(1))
	dir, lock, ino := benchFlockFile(b)
	for range 3 { // warm up
		benchHandoffNpurun(b, br, dir)
		benchHandoffFlock(b, lock, ino, dir)
	}
	var hn, hf []time.Duration
	for i := range benchHandoffSamples {
		if i%2 == 0 {
			hn = append(hn, benchHandoffNpurun(b, br, dir))
			hf = append(hf, benchHandoffFlock(b, lock, ino, dir))
		} else {
			hf = append(hf, benchHandoffFlock(b, lock, ino, dir))
			hn = append(hn, benchHandoffNpurun(b, br, dir))
		}
	}
	n50, f50 := benchQuantile(hn, .5), benchQuantile(hf, .5)
	ratio := float64(n50) / float64(f50)
	b.ReportMetric(benchMs(n50), "npurun-p50-ms")
	b.ReportMetric(benchMs(benchQuantile(hn, .9)), "npurun-p90-ms")
	b.ReportMetric(benchMs(f50), "flock-p50-ms")
	b.ReportMetric(benchMs(benchQuantile(hf, .9)), "flock-p90-ms")
	b.ReportMetric(ratio, "ratio")
	benchSummary(b, fmt.Sprintf("handoff, holder's last action → waiter's command, %d samples each (target p50 ratio ≤ 1.2)", benchHandoffSamples), [][]string{
		{"", "p10 ms", "p50 ms", "p90 ms", "max ms"},
		{"npurun (1 device)", benchF3(benchQuantile(hn, .1)), benchF3(n50), benchF3(benchQuantile(hn, .9)), benchF3(benchQuantile(hn, 1))},
		{"flock(1)", benchF3(benchQuantile(hf, .1)), benchF3(f50), benchF3(benchQuantile(hf, .9)), benchF3(benchQuantile(hf, 1))},
		{"ratio p50", fmt.Sprintf("%.2f×", ratio)},
	})
}

// BenchmarkThroughput: in-process protocol clients contend for a few fake
// devices; each grant's descriptors are closed at once (the release) and
// the same connection asks again.
func BenchmarkThroughput(b *testing.B) {
	benchNoNsPerOp(b)
	br := harness.StartBroker(b, harness.FakeConfig(benchThroughputDevs))
	conns := make([]*wire.Conn, benchThroughputConns)
	for i := range conns {
		conns[i] = br.Dial()
	}
	pid := benchBrokerPID(b, br)
	var stop atomic.Bool
	var grants, queued atomic.Int64
	lats := make([][]time.Duration, len(conns))
	errs := make(chan error, len(conns))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for !stop.Load() {
				t0 := time.Now()
				if err := c.Send(&wire.Request{Op: wire.OpAcquire, N: 1}); err != nil {
					errs <- err
					return
				}
				for {
					r, fds, err := c.Recv(100 * time.Millisecond)
					if err == wire.ErrTimeout {
						if stop.Load() {
							return
						}
						continue
					}
					if err != nil {
						errs <- err
						return
					}
					if r.Type != wire.TypeGrant {
						queued.Add(1)
						continue
					}
					for _, fd := range fds {
						unix.Close(fd)
					}
					break
				}
				lats[i] = append(lats[i], time.Since(t0))
				grants.Add(1)
			}
		}()
	}
	t0 := time.Now()
	cpu0, self0 := benchCPU(b, pid), benchCPU(b, os.Getpid())
	close(start)
	time.Sleep(benchThroughputFor)
	n := grants.Load()
	elapsed := time.Since(t0)
	cpu, self := benchCPU(b, pid)-cpu0, benchCPU(b, os.Getpid())-self0
	threads := benchProcStatus(b, pid, "Threads") / 1024 // a count, not kB
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Errorf("client: %v", err)
	}
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	rate := float64(n) / elapsed.Seconds()
	b.ReportMetric(rate, "grants/s")
	b.ReportMetric(benchMs(benchQuantile(all, .5)), "acquire-p50-ms")
	b.ReportMetric(benchMs(benchQuantile(all, .99)), "acquire-p99-ms")
	benchSummary(b, fmt.Sprintf("grant throughput, %d clients, %d devices, %s (target ≥ 20000 grants/s)", benchThroughputConns, benchThroughputDevs, benchThroughputFor), [][]string{
		{"grants", strconv.FormatInt(n, 10)},
		{"grants/s", fmt.Sprintf("%.0f", rate)},
		{"acquire→grant p50 ms", benchF3(benchQuantile(all, .5))},
		{"acquire→grant p99 ms", benchF3(benchQuantile(all, .99))},
		{"queued replies per grant", fmt.Sprintf("%.2f", float64(queued.Load())/float64(n))},
		{"broker CPU", fmt.Sprintf("%.2f s in %.2f s (%.0f µs/grant), %.0f threads", cpu.Seconds(), elapsed.Seconds(), float64(cpu.Microseconds())/float64(n), threads)},
		{"clients' CPU (this process)", fmt.Sprintf("%.2f s (%.0f µs/grant)", self.Seconds(), float64(self.Microseconds())/float64(n))},
	})
}

// benchBrokerPID is the pid of the process serving br's socket (SO_PEERCRED of
// a connection names the process that listens), checked against /proc.
func benchBrokerPID(b *testing.B, br *harness.Broker) int {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: br.Socket}); err != nil {
		b.Fatal(err)
	}
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		b.Fatal(err)
	}
	pid := int(cred.Pid)
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil || exe != br.Bin.Broker {
		b.Fatalf("peer of the broker socket is pid %d (%s, %v), not %s", pid, exe, err, br.Bin.Broker)
	}
	return pid
}

// benchCPU is the user+system CPU time pid has used so far.
func benchCPU(b *testing.B, pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name, which is in parentheses: utime and
	// stime are the 12th and 13th.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// benchProcStatus reads a field of /proc/PID/status: a "kB" one in bytes, a count times 1024.
func benchProcStatus(b *testing.B, pid int, field string) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			f := strings.Fields(rest)
			kb, err := strconv.ParseFloat(f[0], 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb * 1024
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

const benchMib = 1 << 20

// BenchmarkMemory: the broker's resident memory idle, and with 10,000
// connected waiters queued behind one holder.
func BenchmarkMemory(b *testing.B) {
	benchNoNsPerOp(b)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatal(err)
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatal(err)
	}
	waiters := benchMemWaiters
	if room := int(lim.Cur) - 200; room < waiters {
		b.Logf("RLIMIT_NOFILE hard limit %d: measuring %d waiters, not %d", lim.Max, room, waiters)
		waiters = room
	}
	br := harness.StartBroker(b, harness.FakeConfig(1)+"[broker]\nmax_connections = 20000\nmax_waiting_per_user = 20000\n")
	pid := benchBrokerPID(b, br)
	time.Sleep(300 * time.Millisecond)
	idle := benchProcStatus(b, pid, "VmRSS")

	benchHolder := br.Dial()
	if err := benchHolder.Send(&wire.Request{Op: wire.OpAcquire, N: 1}); err != nil {
		b.Fatal(err)
	}
	r, fds, err := benchHolder.Recv(10 * time.Second)
	if err != nil || r.Type != wire.TypeGrant {
		b.Fatalf("holder: %v %v", r, err)
	}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()

	req, err := wire.Encode(&wire.Request{V: wire.Version, Op: wire.OpAcquire, N: 1})
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, wire.MaxMessage)
	oob := make([]byte, unix.CmsgSpace(wire.MaxDevices*4))
	socks := make([]int, 0, waiters)
	b.Cleanup(func() {
		br.Stop() // before the waiters go, so that it does not serve 10,000 cancellations
		for _, fd := range socks {
			unix.Close(fd)
		}
	})
	t0 := time.Now()
	for i := range waiters {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			b.Fatalf("waiter %d: %v", i, err)
		}
		socks = append(socks, fd)
		if err := unix.Connect(fd, &unix.SockaddrUnix{Name: br.Socket}); err != nil {
			b.Fatalf("waiter %d: connect: %v", i, err)
		}
		if err := wire.SendMsg(fd, req, nil, 0); err != nil {
			b.Fatalf("waiter %d: send: %v", i, err)
		}
	}
	// The broker tells waiters their places in batches (every 50 ms), not
	// one by one: ask on every connection first, then read the answers.
	for i, fd := range socks {
		data, _, err := wire.RecvMsg(fd, buf, oob, 0)
		if err != nil {
			b.Fatalf("waiter %d: recv: %v", i, err)
		}
		var rep wire.Reply
		if err := json.Unmarshal(data, &rep); err != nil || rep.Type != wire.TypeQueued {
			b.Fatalf("waiter %d: reply %s (%v)", i, data, err)
		}
	}
	queueTime := time.Since(t0)
	time.Sleep(300 * time.Millisecond)
	loaded := benchProcStatus(b, pid, "VmRSS")
	hwm := benchProcStatus(b, pid, "VmHWM")
	perWaiter := (loaded - idle) / float64(waiters)

	b.ReportMetric(idle/benchMib, "idle-MiB")
	b.ReportMetric(loaded/benchMib, "10k-waiters-MiB")
	b.ReportMetric(perWaiter/1024, "KiB/waiter")
	benchSummary(b, fmt.Sprintf("broker resident memory (targets: idle ≤ 15 MiB, %d waiters ≤ 100 MiB)", waiters), [][]string{
		{"VmRSS idle", fmt.Sprintf("%.1f MiB", idle/benchMib)},
		{fmt.Sprintf("VmRSS with %d waiters", waiters), fmt.Sprintf("%.1f MiB", loaded/benchMib)},
		{"VmHWM (peak)", fmt.Sprintf("%.1f MiB", hwm/benchMib)},
		{"per waiter", fmt.Sprintf("%.1f KiB", perWaiter/1024)},
		{fmt.Sprintf("time to queue %d waiters", waiters), queueTime.Round(time.Millisecond).String()},
	})
}
