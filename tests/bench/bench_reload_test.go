package bench

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

const (
	benchReloadClients = 200
	benchReloadEvery   = 250 * time.Millisecond
	benchReloadCount   = 16
)

// BenchmarkReloadPause: 200 protocol clients churn one-device leases on 4
// fake devices (ask, take the grant, let it go, ask again) while the
// broker is reloaded every 250 ms, two configurations in turn (limits and
// [status] differ, so the line is checked again each time). Each grant's
// arrival is timed; the longest gap between two grants that overlaps a
// reload (from the request sent to its answer) is the pause a reload
// causes, shown beside the longest gap that overlaps none, in the same
// run. Target: ≤ 10 ms. Root: reload is root's.
func BenchmarkReloadPause(b *testing.B) {
	benchNoNsPerOp(b)
	harness.NeedRoot(b)
	base := harness.FakeConfig(4) + "[broker]\nmax_waiting_per_user = 4096\n"
	confs := []string{base, base + "[limits]\nmax_devices = 4\n[status]\nscan_interval = \"7s\"\n"}
	br := harness.StartBroker(b, confs[0])
	req, err := wire.Encode(&wire.Request{V: wire.Version, Op: wire.OpAcquire, N: 1})
	if err != nil {
		b.Fatal(err)
	}
	conns := make([]*net.UnixConn, benchReloadClients)
	for i := range conns {
		if conns[i], err = net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: br.Socket, Net: "unixpacket"}); err != nil {
			b.Fatal(err)
		}
	}
	var stop atomic.Bool
	times := make([][]int64, len(conns)) // each client's grants, in ns
	var wg sync.WaitGroup
	errs := make(chan error, len(conns))
	for ci, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			oob := make([]byte, unix.CmsgSpace(4*wire.MaxDevices))
			for !stop.Load() {
				if _, err := c.Write(req); err != nil {
					errs <- err
					return
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
								unix.Close(fd) // the lease ends at once
							}
						}
					}
					if bytes.Contains(buf[:nb], []byte(`"type":"grant"`)) {
						times[ci] = append(times[ci], time.Now().UnixNano())
						break
					}
					if !bytes.Contains(buf[:nb], []byte(`"type":"queued"`)) {
						errs <- fmt.Errorf("unexpected reply %s", buf[:nb])
						return
					}
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond) // the crowd under way
	ctl, err := wire.Dial(br.Socket)
	if err != nil {
		b.Fatal(err)
	}
	defer ctl.Close()
	start := time.Now().UnixNano()
	var windows [][2]int64
	for i := range benchReloadCount {
		time.Sleep(benchReloadEvery)
		tmp := br.Conf + ".new"
		if err := os.WriteFile(tmp, []byte(confs[(i+1)%2]), 0o644); err != nil {
			b.Fatal(err)
		}
		if err := os.Rename(tmp, br.Conf); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now().UnixNano()
		if _, err := ctl.Reload(); err != nil {
			b.Fatalf("reload %d: %v", i, err)
		}
		windows = append(windows, [2]int64{t0, time.Now().UnixNano()})
	}
	time.Sleep(benchReloadEvery)
	end := time.Now().UnixNano()
	stop.Store(true)
	for _, c := range conns {
		c.Close()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Errorf("client: %v", err)
	}
	var all []int64
	for _, ts := range times {
		for _, t := range ts {
			if t >= start && t <= end {
				all = append(all, t)
			}
		}
	}
	slices.Sort(all)
	if len(all) < 2 {
		b.Fatalf("%d grants in the measured span", len(all))
	}
	var withReload, without int64
	for i := 1; i < len(all); i++ {
		gap, overlaps := all[i]-all[i-1], false
		for _, w := range windows {
			if all[i-1] < w[1] && all[i] > w[0] {
				overlaps = true
				break
			}
		}
		if overlaps {
			withReload = max(withReload, gap)
		} else {
			without = max(without, gap)
		}
	}
	// The broker's own count of each reload: its whole time, the line's
	// walk under the locks included.
	var inBroker time.Duration
	for _, m := range regexp.MustCompile(`reloaded \S+ in (\S+):`).FindAllStringSubmatch(br.Log(), -1) {
		if d, err := time.ParseDuration(m[1]); err == nil {
			inBroker = max(inBroker, d)
		}
	}
	span := time.Duration(end - start)
	ms := func(ns int64) float64 { return benchMs(time.Duration(ns)) }
	b.ReportMetric(ms(withReload), "pause-reload-ms")
	b.ReportMetric(ms(without), "pause-none-ms")
	b.ReportMetric(benchMs(inBroker), "reload-max-ms")
	b.ReportMetric(float64(len(all))/span.Seconds(), "grants/s")
	benchSummary(b, fmt.Sprintf("grant pauses, %d clients churning on 4 devices, %d reloads (target: a reload's ≤ 10 ms)", benchReloadClients, len(windows)), [][]string{
		{"longest gap overlapping a reload", fmt.Sprintf("%.2f ms", ms(withReload))},
		{"longest gap overlapping none", fmt.Sprintf("%.2f ms", ms(without))},
		{"longest reload, as the broker logs it", fmt.Sprintf("%.2f ms", benchMs(inBroker))},
		{"grants", strconv.Itoa(len(all)) + fmt.Sprintf(" in %.1f s", span.Seconds())},
	})
}
