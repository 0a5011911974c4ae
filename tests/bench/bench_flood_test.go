package bench

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
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

const (
	benchCrowdSmall = 64
	benchCrowdLarge = 10000
	benchCrowdFor   = 3 * time.Second
)

// benchRaiseNofile lifts this process's descriptor limit to its hard limit
// and returns it.
func benchRaiseNofile(b *testing.B) int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatal(err)
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatal(err)
	}
	return int(lim.Cur)
}

// crowd is the outcome of a churn: grants, and the progress messages
// ("queued") the clients were sent, over a measured span.
type crowd struct {
	grants, queued int64
	elapsed, cpu   time.Duration
}

// benchChurn runs n protocol clients that each ask for one device, take
// the grant, let it go at once and ask again, for dur once every client has
// asked, and counts what happened. The clients use the runtime's poller, so
// that 10,000 of them are 10,000 goroutines, not 10,000 threads.
func benchChurn(b *testing.B, br *harness.Broker, pid, n int, dur time.Duration) crowd {
	req, err := wire.Encode(&wire.Request{V: wire.Version, Op: wire.OpAcquire, N: 1})
	if err != nil {
		b.Fatal(err)
	}
	conns := make([]*net.UnixConn, n)
	for i := range conns {
		// A full listen queue refuses a connect (EAGAIN) until the broker
		// has accepted some: the crowd is built at the broker's pace.
		deadline := time.Now().Add(harness.EventTimeout)
		for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
			c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: br.Socket, Net: "unixpacket"})
			if err == nil {
				conns[i] = c
				break
			}
			if !errors.Is(err, syscall.EAGAIN) || time.Now().After(deadline) {
				b.Fatalf("client %d: %v", i, err)
			}
			time.Sleep(wait)
		}
	}
	var counting, stop atomic.Bool
	var grants, queued atomic.Int64
	var asked, wg sync.WaitGroup
	errs := make(chan error, n)
	asked.Add(n)
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			oob := make([]byte, unix.CmsgSpace(4*wire.MaxDevices))
			first := true
			for !stop.Load() {
				if _, err := c.Write(req); err != nil {
					errs <- err
					return
				}
				if first {
					asked.Done()
					first = false
				}
				for {
					nb, noob, _, _, err := c.ReadMsgUnix(buf, oob)
					if err != nil {
						if !stop.Load() {
							errs <- err
						}
						return
					}
					if noob > 0 {
						msgs, _ := unix.ParseSocketControlMessage(oob[:noob])
						for i := range msgs {
							fds, _ := unix.ParseUnixRights(&msgs[i])
							for _, fd := range fds {
								unix.Close(fd)
							}
						}
					}
					if bytes.Contains(buf[:nb], []byte(`"type":"grant"`)) {
						if counting.Load() {
							grants.Add(1)
						}
						break
					}
					if !bytes.Contains(buf[:nb], []byte(`"type":"queued"`)) {
						errs <- fmt.Errorf("unexpected reply %s", buf[:nb])
						return
					}
					if counting.Load() {
						queued.Add(1)
					}
				}
			}
		}()
	}
	asked.Wait()
	time.Sleep(200 * time.Millisecond) // the line settles: first places told
	cpu0 := benchCPU(b, pid)
	t0 := time.Now()
	counting.Store(true)
	time.Sleep(dur)
	counting.Store(false)
	out := crowd{grants: grants.Load(), queued: queued.Load(), elapsed: time.Since(t0), cpu: benchCPU(b, pid) - cpu0}
	stop.Store(true)
	for _, c := range conns {
		c.Close() // ends the clients' reads
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Errorf("client: %v", err)
	}
	return out
}

func (c crowd) rate() float64 { return float64(c.grants) / c.elapsed.Seconds() }

func (c crowd) row(name string) []string {
	g := max(c.grants, 1)
	return []string{name, fmt.Sprintf("%.0f grants/s", c.rate()),
		fmt.Sprintf("%.0f µs broker CPU/grant", float64(c.cpu.Microseconds())/float64(g)),
		fmt.Sprintf("%.2f progress msgs/grant", float64(c.queued)/float64(g))}
}

// BenchmarkThroughputWaiters: grants/s with 10,000 clients churning on 4
// devices, beside 64 clients in the same run. Target ≥ 50 %.
func BenchmarkThroughputWaiters(b *testing.B) {
	benchNoNsPerOp(b)
	large := benchCrowdLarge
	if room := benchRaiseNofile(b)/2 - 200; room < large {
		b.Logf("RLIMIT_NOFILE: %d clients, not %d", room, large)
		large = room
	}
	br := harness.StartBroker(b, harness.FakeConfig(4)+"[broker]\nmax_connections = 30000\nmax_waiting_per_user = 30000\n")
	pid := benchBrokerPID(b, br)
	small := benchChurn(b, br, pid, benchCrowdSmall, benchCrowdFor)
	big := benchChurn(b, br, pid, large, benchCrowdFor)

	ratio := big.rate() / small.rate()
	b.ReportMetric(small.rate(), "grants/s-64")
	b.ReportMetric(big.rate(), "grants/s-"+strconv.Itoa(large))
	b.ReportMetric(ratio, "ratio")
	benchSummary(b, fmt.Sprintf("grants with a long line, 4 devices, %s each (target: %d clients ≥ 50 %% of 64)", benchCrowdFor, large), [][]string{
		small.row("64 clients"),
		big.row(strconv.Itoa(large) + " clients"),
		{"ratio", fmt.Sprintf("%.2f", ratio)},
	})
}

// The flood: one user attacks the broker while another's `npurun --no-wait
// true` is timed, whole command, beside its idle figure in the same run.
const (
	benchFloodVictimRuns = 30
	benchFloodSettle     = 500 * time.Millisecond // the attack under way before the victim is timed
	benchFloodTasks      = 5000                   // ended tasks with 15 KB commands, for the listings
)

// benchFloodAttacks are the attacks, each with its connections.
var benchFloodAttacks = []struct {
	mode, what string
	conns      int
}{
	{"list", "300 connections asking for listings, reading nothing", 300},
	{"churn", "16 connections submitting and cancelling tasks", 16},
	{"oversize", "8 connections sending oversized messages and submissions", 8},
	{"idle", "1,000 idle connections", 1000},
}

// benchFloodStart starts an attack as u and returns once it is under way;
// closing the returned process's standard input ends it.
func benchFloodStart(b *testing.B, br *harness.Broker, u harness.TestUser, dir, mode string, conns, n int) *harness.Proc {
	cmd := u.As(exec.Command(br.Bin.Workload, "-flood", mode, "-conns", strconv.Itoa(conns), "-n", strconv.Itoa(n)), dir)
	cmd.Env = br.Env()
	p := harness.StartProc(b, "flood "+mode, cmd)
	if mode == "fill" {
		select {
		case <-p.Done:
		case <-time.After(5 * time.Minute):
			b.Fatalf("filling %d tasks took more than 5 minutes; output:\n%s", n, p.Output())
		}
		if !strings.Contains(p.Output(), "filled") {
			b.Fatalf("fill: %v; output:\n%s", p.Err, p.Output())
		}
		return p
	}
	p.WaitLine("flooding")
	return p
}

// benchFloodVictim times runs of `npurun --no-wait true` as u.
func benchFloodVictim(b *testing.B, br *harness.Broker, u harness.TestUser, runs int) []time.Duration {
	ds := make([]time.Duration, 0, runs)
	for range runs {
		ds = append(ds, benchTimeRun(b, u.As(br.Npurun("--no-wait", "true"), "/")))
	}
	return ds
}

// benchRSSWatch samples pid's resident memory every 20 ms until stop is
// called, which returns the highest sample.
func benchRSSWatch(b *testing.B, pid int) (stop func() float64) {
	done := make(chan struct{})
	peak := make(chan float64, 1)
	go func() {
		hi := 0.0
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
				for _, line := range strings.Split(string(data), "\n") {
					if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
						if kb, err := strconv.ParseFloat(strings.Fields(rest)[0], 64); err == nil {
							hi = max(hi, kb*1024)
						}
					}
				}
			}
			select {
			case <-done:
				peak <- hi
				return
			case <-tick.C:
			}
		}
	}()
	return func() float64 { close(done); return <-peak }
}

// BenchmarkFlood: another user's `npurun --no-wait` round trip while one
// user floods the broker with each attack, against its idle figure in the
// same run (target ≤ 10×), and the broker's resident memory (target ≤ 200
// MiB). The attacker and the victim are test users: root only.
func BenchmarkFlood(b *testing.B) {
	benchNoNsPerOp(b)
	if os.Geteuid() != 0 {
		b.Skip("needs root: the attacker and the victim are users of their own")
	}
	benchRaiseNofile(b) // the broker inherits it: 1,000 idle connections and more
	attacker, victim := harness.NewUser(b), harness.NewUser(b)
	br := harness.StartBroker(b, harness.FakeConfig(4)+"[tasks]\ncpu_slots = 1\nkeep_ended_per_user = 10000\n[limits]\nmax_queued_tasks = 0\n")
	pid := benchBrokerPID(b, br)
	dir := harness.UserDir(b, &attacker, 0o755)
	t0 := time.Now()
	stopFill := benchRSSWatch(b, pid)
	benchFloodStart(b, br, attacker, dir, "fill", 1, benchFloodTasks)
	fillRSS := stopFill()
	fill := time.Since(t0)
	b.Logf("filled in %s: RSS peak %.1f MiB while filling, %.1f MiB now", fill, fillRSS/benchMib, benchProcStatus(b, pid, "VmRSS")/benchMib)

	idle := benchFloodVictim(b, br, victim, benchFloodVictimRuns)
	rows := [][]string{{"", "victim p50 / p90 / max ms", "× idle p50", "broker RSS peak"}}
	type result struct {
		under   []time.Duration
		rss     float64
		idleNow []time.Duration
	}
	var results []result
	for _, a := range benchFloodAttacks {
		stop := benchRSSWatch(b, pid)
		p := benchFloodStart(b, br, attacker, dir, a.mode, a.conns, 0)
		time.Sleep(benchFloodSettle)
		under := benchFloodVictim(b, br, victim, benchFloodVictimRuns)
		rss := stop()
		p.Stdin.Close()
		p.Wait()
		// Idle again, side by side with the attack just measured.
		idleNow := benchFloodVictim(b, br, victim, benchFloodVictimRuns)
		idle = append(idle, idleNow...)
		results = append(results, result{under, rss, idleNow})
	}
	idleP50 := benchQuantile(idle, .5)
	rows = append(rows, []string{"idle", fmt.Sprintf("%s / %s / %s", benchF3(idleP50), benchF3(benchQuantile(idle, .9)), benchF3(slices.Max(idle))), "1.00", ""})
	worst, worstRSS := 0.0, 0.0
	for i, a := range benchFloodAttacks {
		r := results[i]
		ratio := float64(benchQuantile(r.under, .5)) / float64(idleP50)
		worst, worstRSS = max(worst, ratio), max(worstRSS, r.rss)
		rows = append(rows, []string{a.what,
			fmt.Sprintf("%s / %s / %s", benchF3(benchQuantile(r.under, .5)), benchF3(benchQuantile(r.under, .9)), benchF3(slices.Max(r.under))),
			fmt.Sprintf("%.2f", ratio), fmt.Sprintf("%.1f MiB", r.rss/benchMib)})
		b.ReportMetric(ratio, "ratio-"+a.mode)
	}
	hwm := benchProcStatus(b, pid, "VmHWM")
	b.ReportMetric(worst, "ratio-worst")
	b.ReportMetric(hwm/benchMib, "rss-peak-MiB")
	rows = append(rows, []string{fmt.Sprintf("broker VmHWM over the run (with %d ended 15 KB tasks, filled in %s)", benchFloodTasks, fill.Round(100*time.Millisecond)), "", "", fmt.Sprintf("%.1f MiB", hwm/benchMib)})
	benchSummary(b, fmt.Sprintf("another user's npurun --no-wait under a flood, %d runs each (target ≤ 10× idle p50, RSS ≤ 200 MiB)", benchFloodVictimRuns), rows)
}
