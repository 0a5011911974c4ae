package status

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
)

// Utilization joined to leases (issue 29). Each [status] util_interval
// WatchUtil asks the vendor's tool what every device is doing, in one
// round bounded by the interval (at most maxUtilWait), holding no lock
// while it runs, and sampled joins the answer to the leases held: each
// lease keeps its devices' utilization now, its mean since its start,
// and since when every sample found all its devices under [idle] below.
// A device the tool did not answer for is unknown, and unknown is never
// idle: it ends a lease's idle run as a busy sample does. A share has its
// device's figures. The figures are kept across a restart, kill -9 alike
// (utilstate.go): the mean goes on, and the idle run where the first
// sample after the restart finds the lease idle still.

// maxUtilWait bounds one round of the vendor's tool, whatever the
// interval.
const maxUtilWait = 15 * time.Second

// leaseUtil is what the samples said of one lease.
type leaseUtil struct {
	now       float64       // its devices' mean at the last sample
	known     bool          // now is known: the tool answered for every one of its devices
	sum       float64       // of the known samples' means since its start
	n         int           // known samples since its start
	idleSince time.Time     // the first of the current run of samples all under below; zero: not idle
	idle      idleState     // what the [idle] policy said of the current run (idle.go)
	idleTotal time.Duration // the time between samples that both found it idle, since its start: its idle time, for usage
	lastAt    time.Time     // its last sample
	resumed   bool          // kept from before this start (utilstate.go), not yet sampled: its idle run is not shown until a sample says it goes on
}

// figures are what the accounting log keeps of u at an end of its lease:
// the held mean (nil before a known sample) and the idle time.
func (u *leaseUtil) figures() (*float64, int64) {
	if u == nil {
		return nil, 0
	}
	var held *float64
	if u.n > 0 {
		m := u.sum / float64(u.n)
		held = &m
	}
	return held, u.idleTotal.Milliseconds()
}

// utilOn tells whether the broker samples utilization: an interval, and
// a tool to ask (the fake vendor's files where [devices] fake_util names
// their directory).
func (g *Ledger) utilOn() bool {
	cfg := g.policy()
	return cfg.Status.UtilInterval > 0 && (g.inv.Vendor != npu.Fake || cfg.FakeUtil != "")
}

// WatchUtil samples the devices' utilization each [status]
// util_interval, the first at once, until ctx is done. wake tells of a
// reload, which may change the interval, or start or stop the sampling.
// Each device's becoming unknown, with why, and known again, is logged
// once.
func (g *Ledger) WatchUtil(ctx context.Context, wake <-chan struct{}) {
	if g == nil {
		return
	}
	said := &utilSaid{dev: map[int]string{}}
	next := time.Now()
	on := false
	for {
		var tick <-chan time.Time
		var t *time.Timer
		switch {
		case g.utilOn():
			t = time.NewTimer(time.Until(next))
			tick = t.C
			on = true
		case on:
			// Turned off by a reload: nothing is known from now on, and
			// an idle run does not go on through the time unsampled.
			g.sampled(time.Now(), nil, nil)
			on = false
		}
		select {
		case <-ctx.Done():
			if t != nil {
				t.Stop()
			}
			return
		case <-wake:
			if t != nil {
				t.Stop()
			}
			continue
		case <-tick:
		}
		every := g.policy().Status.UtilInterval
		g.sampleUtil(ctx, min(every, maxUtilWait), said)
		next = time.Now().Add(every)
	}
}

// utilSaid is what WatchUtil last logged, to log each change once.
type utilSaid struct {
	none string         // the tool is not there at all: why
	dev  map[int]string // each device's unknown utilization: why
}

// sampleUtil is one round of WatchUtil.
func (g *Ledger) sampleUtil(ctx context.Context, wait time.Duration, said *utilSaid) {
	cfg := g.policy()
	cctx, cancel := context.WithTimeout(ctx, wait)
	at := time.Now()
	got, errs := g.inv.Utilization(cctx, g.inv.IDs, npu.Tools{NVIDIASmi: cfg.NVIDIASmi, FakeUtilDir: cfg.FakeUtil})
	cancel()
	if ctx.Err() != nil {
		return
	}
	// No tool at all (npu-smi or nvidia-smi not installed): nothing is
	// sampled, said once, and status has no UTIL; asked again each
	// interval.
	none := len(got) == 0 && len(errs) > 0
	for _, err := range errs {
		none = none && errors.Is(err, npu.ErrNoTool)
	}
	if none {
		var why string
		for _, id := range g.inv.IDs {
			if err := errs[id]; err != nil {
				why = err.Error()
				break
			}
		}
		if line := "utilization not sampled: " + why; said.none != line {
			g.log.Print(line)
			clear(said.dev)
			said.none = line
		}
		g.sampled(at, nil, nil)
		return
	}
	if said.none != "" {
		g.log.Print("utilization sampled: the vendor's tool is there")
		said.none = ""
	}
	for _, id := range g.inv.IDs {
		line := ""
		if err := errs[id]; err != nil {
			line = "utilization of " + g.deviceName(id) + " unknown: " + err.Error()
		} else if _, ok := got[id]; !ok {
			line = "utilization of " + g.deviceName(id) + " unknown: not in the answer"
		}
		if line != said.dev[id] {
			switch {
			case line != "":
				g.log.Print(line)
			case said.dev[id] != "":
				g.log.Printf("utilization of %s known again", g.deviceName(id))
			}
			said.dev[id] = line
		}
	}
	g.sampled(at, got, errs)
}

// sampled joins a sample taken at at, of what the tool answered (got)
// and why it did not (errs), to the devices and the leases held. No
// answer and no reason (got and errs nil) is no tool to ask: nothing is
// known, and the board says the broker does not sample.
func (g *Ledger) sampled(at time.Time, got map[int]npu.Util, errs map[int]error) {
	below := g.policy().Idle.Below
	g.mu.Lock()
	g.utilNone = got == nil && errs == nil
	g.util = got
	g.utilErr = make(map[int]string, len(errs))
	for id, err := range errs {
		g.utilErr[id] = err.Error()
	}
	g.utilAt = at
	for _, e := range g.leasesHeldLocked() {
		u := e.util
		if u == nil {
			u = &leaseUtil{}
			e.util = u
		}
		var sum float64
		n, idle := 0, true
		for _, id := range e.Devices {
			if !e.held[id] {
				continue
			}
			d, ok := got[id]
			if !ok {
				n = -1
				break
			}
			sum += d.Percent
			n++
			idle = idle && d.Percent < below
		}
		u.known = n > 0
		u.resumed = false
		if !u.known {
			u.idleSince = time.Time{} // unknown is never idle
			u.idle.endRun()
			continue
		}
		u.now = sum / float64(n)
		u.sum += u.now
		u.n++
		if idle && !u.idleSince.IsZero() && !u.lastAt.IsZero() {
			u.idleTotal += at.Sub(u.lastAt)
		}
		u.lastAt = at
		switch {
		case !idle:
			u.idleSince = time.Time{}
			u.idle.endRun()
		case u.idleSince.IsZero():
			u.idleSince = at
		}
	}
	g.changedLocked()
	g.unlock()
	if got != nil {
		g.judgeIdle(at)
	}
	g.saveUtil(at)
}

// leasesHeldLocked is every lease held, whole or share, once each.
func (g *Ledger) leasesHeldLocked() []*entry {
	var out []*entry
	for _, id := range slices.Sorted(mapKeys(g.leases)) {
		if e := g.leases[id]; !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	for _, id := range slices.Sorted(mapKeys(g.shares)) {
		for _, e := range g.shares[id] {
			if !slices.Contains(out, e) {
				out = append(out, e)
			}
		}
	}
	return out
}

func mapKeys[V any](m map[int]V) func(func(int) bool) {
	return func(yield func(int) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// utilInfoLocked is how the board says the broker samples: nil where it
// does not, and before its first sample.
func (g *Ledger) utilInfoLocked() *wire.UtilInfo {
	if !g.utilOn() || g.utilNone || g.utilAt.IsZero() {
		return nil
	}
	return &wire.UtilInfo{IntervalMS: g.policy().Status.UtilInterval.Milliseconds(), Below: g.policy().Idle.Below, Last: g.utilAt.UnixMilli()}
}

// noUtil takes the leases' utilization off board b, whose broker does
// not sample (any more).
func noUtil(b *wire.Board) {
	for i := range b.Devices {
		d := &b.Devices[i]
		if d.Lease != nil {
			d.Lease.Util, d.Lease.UtilHeld, d.Lease.IdleSince = nil, nil, 0
		}
		for j := range d.Shares {
			d.Shares[j].Util, d.Shares[j].UtilHeld, d.Shares[j].IdleSince = nil, nil, 0
		}
	}
}

// deviceUtilLocked puts device ds's last sample on the board.
func (g *Ledger) deviceUtilLocked(ds *wire.DeviceState) {
	if g.utilAt.IsZero() || !g.utilOn() || g.utilNone {
		return
	}
	u, ok := g.util[ds.ID]
	if !ok {
		ds.UtilUnknown = g.utilErr[ds.ID]
		if ds.UtilUnknown == "" {
			ds.UtilUnknown = "not in the answer"
		}
		return
	}
	pct := u.Percent
	ds.Util = &pct
	ds.MemUsed, ds.MemTotal = max(u.MemUsed, 0), max(u.MemTotal, 0)
}

// leaseUtilInfo puts lease e's figures in li.
func leaseUtilInfo(e *entry, li *wire.LeaseInfo) {
	u := e.util
	if u == nil {
		return
	}
	if u.known {
		now := u.now
		li.Util = &now
	}
	if u.n > 0 {
		held := u.sum / float64(u.n)
		li.UtilHeld = &held
	}
	if !u.idleSince.IsZero() && !u.resumed {
		li.IdleSince = u.idleSince.UnixMilli()
	}
}

// utilMetricsLocked is the utilization's metrics: each device's last
// sample, and how long each lease held has been idle, by device.
func (g *Ledger) utilMetricsLocked(now time.Time) []prometheus.Metric {
	if g.utilAt.IsZero() || !g.utilOn() || g.utilNone {
		return nil
	}
	var out []prometheus.Metric
	for _, id := range g.inv.IDs {
		u, ok := g.util[id]
		if !ok {
			continue
		}
		name := g.deviceName(id)
		out = append(out, prometheus.MustNewConstMetric(utilDesc, prometheus.GaugeValue, u.Percent, name))
		if u.MemUsed >= 0 {
			out = append(out, prometheus.MustNewConstMetric(memUsedDesc, prometheus.GaugeValue, float64(u.MemUsed)*(1<<20), name))
		}
		if u.MemTotal > 0 {
			out = append(out, prometheus.MustNewConstMetric(memTotalDesc, prometheus.GaugeValue, float64(u.MemTotal)*(1<<20), name))
		}
	}
	// Two shares of one user's on one device are one series: the
	// longer idle of the two.
	type key struct{ user, kind, device string }
	idle := map[key]float64{}
	var order []key
	for _, e := range g.leasesHeldLocked() {
		secs := 0.0
		if e.util != nil && !e.util.idleSince.IsZero() && !e.util.resumed {
			secs = max(now.Sub(e.util.idleSince).Seconds(), 0)
		}
		for _, id := range e.Devices {
			if !e.held[id] {
				continue
			}
			k := key{e.User, e.kind(), g.deviceName(id)}
			if _, seen := idle[k]; !seen {
				order = append(order, k)
			}
			idle[k] = max(idle[k], secs)
		}
	}
	for _, k := range order {
		out = append(out, prometheus.MustNewConstMetric(idleDesc, prometheus.GaugeValue, idle[k], k.user, k.kind, k.device))
	}
	return out
}
