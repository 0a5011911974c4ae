package tests

// Benchmarks of the broker under crowds and floods: the cost of a grant
// must not grow with the length of the line.
//
//	BenchmarkThroughputWaiters  grants/s with 10,000 churning clients vs 64   ≥ 50 %

import (
	"bytes"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/client"
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
func benchChurn(b *testing.B, br *Broker, pid, n int, dur time.Duration) crowd {
	req, err := client.Encode(&client.Request{V: client.Version, Op: client.OpAcquire, N: 1})
	if err != nil {
		b.Fatal(err)
	}
	conns := make([]*net.UnixConn, n)
	for i := range conns {
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: br.Socket, Net: "unixpacket"})
		if err != nil {
			b.Fatalf("client %d: %v", i, err)
		}
		conns[i] = c
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
			oob := make([]byte, unix.CmsgSpace(4*client.MaxDevices))
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
	br := StartBroker(b, FakeConfig(4)+"[broker]\nmax_connections = 30000\nmax_waiting_per_user = 30000\n")
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
