package bench

import (
	"bufio"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

const (
	benchExtraProcs    = 5000
	benchStatusSamples = 40
	benchScanWindow    = 3 // scan intervals measured
)

// benchSleepers starts n `sleep` processes in a process group of their own,
// killed when the benchmark ends, and returns once they all run.
func benchSleepers(b *testing.B, n int) {
	b.Helper()
	cmd := exec.Command("sh", "-c", `i=0; while [ $i -lt `+strconv.Itoa(n)+` ]; do sleep 100000 </dev/null >/dev/null 2>&1 & i=$((i+1)); done; echo ready; exec sleep 100000 >/dev/null`)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		b.Fatalf("starting %d processes: %q, %v", n, line, err)
	}
}

// benchLeasedDevices starts a broker on a fake device tree of 4 nodes and
// holds each device with a process that has its node open, as a job would.
func benchLeasedDevices(b *testing.B, extra string) (*harness.Broker, []string) {
	b.Helper()
	dev := harness.FakeDev(b, 4)
	br := harness.StartBroker(b, harness.AscendConfig(dev, 4, extra))
	var nodes []string
	for id := range 4 {
		node := dev + "/davinci" + strconv.Itoa(id)
		nodes = append(nodes, node)
		p := harness.StartProc(b, "job"+strconv.Itoa(id), br.Npurun("-d", strconv.Itoa(id), "sh", "-c", "exec 8<"+node+"; echo held; read x; exit 0"))
		p.WaitLine("held")
	}
	return br, nodes
}

// BenchmarkStatus: `npubroker status` as a whole command (exec, ask, print)
// beside `fuser` on the device nodes, interleaved, with 5,000 extra
// processes on the machine.
func BenchmarkStatus(b *testing.B) {
	benchNoNsPerOp(b)
	harness.NeedRoot(b) // the device nodes are made with mknod, and fuser must see every process
	if _, err := exec.LookPath("fuser"); err != nil {
		b.Fatal("fuser not installed (psmisc)")
	}
	br, nodes := benchLeasedDevices(b, "")
	benchSleepers(b, benchExtraProcs)
	status := func() *exec.Cmd {
		cmd := exec.Command(br.Bin.Broker, "status")
		cmd.Env = br.Env()
		return cmd
	}
	fuser := func() time.Duration {
		t0 := time.Now()
		exec.Command("fuser", nodes...).Run() // exits 1 when a node has no user: timed all the same
		return time.Since(t0)
	}
	for range 3 {
		benchTimeRun(b, status())
		fuser()
	}
	var ts, tf []time.Duration
	for i := range benchStatusSamples {
		if i%2 == 0 {
			ts = append(ts, benchTimeRun(b, status()))
			tf = append(tf, fuser())
		} else {
			tf = append(tf, fuser())
			ts = append(ts, benchTimeRun(b, status()))
		}
	}
	s50, f50 := benchQuantile(ts, 0.5), benchQuantile(tf, 0.5)
	b.ReportMetric(benchMs(s50), "status-p50-ms")
	b.ReportMetric(benchMs(f50), "fuser-p50-ms")
	b.ReportMetric(float64(s50)/float64(f50), "status/fuser")
	board := br.Board(b)
	benchSummary(b, "npubroker status with "+strconv.Itoa(benchExtraProcs)+" extra processes", [][]string{
		{"", "p50", "p90", "target"},
		{"npubroker status", fmtMs(s50), fmtMs(benchQuantile(ts, 0.9)), "≤ 50 ms"},
		{"fuser NODES", fmtMs(f50), fmtMs(benchQuantile(tf, 0.9)), ""},
		{"ratio p50", strconv.FormatFloat(float64(s50)/float64(f50), 'f', 3, 64), "", "≤ 0.25"},
		{"last background scan", strconv.FormatFloat(board.Scan.TookMS, 'f', 1, 64) + " ms", strconv.Itoa(board.Scan.Procs) + " processes", ""},
	})
}

func fmtMs(d time.Duration) string { return strconv.FormatFloat(benchMs(d), 'f', 2, 64) + " ms" }

// BenchmarkScanCPU: the broker's CPU time (user and system, from /proc)
// over three scan intervals at the default interval, with 5,000 extra
// processes and four leases held, as a share of one core.
func BenchmarkScanCPU(b *testing.B) {
	benchNoNsPerOp(b)
	harness.NeedRoot(b)
	benchSleepers(b, benchExtraProcs)
	br, _ := benchLeasedDevices(b, "")
	br.Mu.Lock()
	pid := br.Cmd.Process.Pid
	br.Mu.Unlock()
	// Wait for a scan that began once the extra processes ran, then
	// measure from there. (A scan reads a bounded share of one user's
	// processes, the extra ones root's, and the next goes on from there:
	// one scan may read fewer than 5,000.)
	w := harness.WatchBoards(b, br, nil)
	running := time.Now()
	// A scan is followed by a pause 59 times its CPU time: on a slow
	// machine, longer than the interval.
	const slow = 10 * time.Minute
	first, _ := w.NextWithin(slow, "a scan after the extra processes started", func(bd *wire.Board) bool { return time.UnixMilli(bd.Scan.Last).After(running) })
	interval := time.Duration(first.Scan.IntervalMS) * time.Millisecond
	c0, t0 := benchCPU(b, pid), time.Now()
	last := first
	for range benchScanWindow {
		last, _ = w.NextWithin(slow, "the next scan", func(bd *wire.Board) bool { return bd.Scan.Last > last.Scan.Last })
	}
	c1, t1 := benchCPU(b, pid), time.Now()
	share := (c1 - c0).Seconds() / t1.Sub(t0).Seconds()
	b.ReportMetric(100*share, "cpu-%")
	b.ReportMetric(last.Scan.TookMS, "scan-ms")
	benchSummary(b, "background scan, default interval", [][]string{
		{"interval", interval.String()},
		{"processes scanned", strconv.Itoa(last.Scan.Procs)},
		{"one scan (wall)", strconv.FormatFloat(last.Scan.TookMS, 'f', 1, 64) + " ms"},
		{"broker CPU over " + strconv.Itoa(benchScanWindow) + " scans, " + t1.Sub(t0).Round(time.Second).String(), strconv.FormatFloat(100*share, 'f', 2, 64) + "% of one core (target ≤ 2%)"},
	})
}
