package status

import (
	"context"
	"errors"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/wire"
)

// The Prometheus endpoint, opt-in ([broker] metrics_listen): the state of
// the devices, the lines and the tasks, copied from their rooms at each
// scrape, and counters and histograms kept as grants happen.

// metrics is the broker's registry and the instruments updated as things
// happen.
type metrics struct {
	reg      *prometheus.Registry
	grants   *prometheus.CounterVec
	wait     *prometheus.HistogramVec
	handoffH prometheus.Histogram
	scanDur  prometheus.Gauge
	scanN    prometheus.Gauge
	// reclaimed counts the leases the [idle] policy ended, by user
	// (idle.go).
	reclaimed *prometheus.CounterVec
}

var (
	devicesDesc  = prometheus.NewDesc("npurun_devices", "Devices by state: free, reserved, leased (npurun), task, login, held (from before the broker's start), out-of-service.", []string{"state"}, nil)
	waitersDesc  = prometheus.NewDesc("npurun_waiters", "Requests waiting, by pool (\"cpu\": tasks waiting for a CPU slot).", []string{"pool"}, nil)
	unleasedDesc = prometheus.NewDesc("npurun_unleased_processes", "Processes reported with a device node open without a lease, past the grace window.", nil, nil)
	tasksDesc    = prometheus.NewDesc("npurun_tasks", "Tasks the broker knows, by state.", []string{"state"}, nil)
	utilDesc     = prometheus.NewDesc("npurun_device_utilization_percent", "Each device's compute utilization at the last sample ([status] util_interval), as the vendor's tool says it; absent while unknown.", []string{"device"}, nil)
	memUsedDesc  = prometheus.NewDesc("npurun_device_memory_used_bytes", "Each device's memory in use at the last utilization sample; absent while unknown.", []string{"device"}, nil)
	memTotalDesc = prometheus.NewDesc("npurun_device_memory_total_bytes", "Each device's memory, as the vendor's tool says it at the last utilization sample.", []string{"device"}, nil)
	idleDesc     = prometheus.NewDesc("npurun_lease_idle_seconds", "How long every sample has found all of a lease's devices under [idle] below (0: busy, or unknown), per device of each lease held.", []string{"user", "kind", "device"}, nil)
	droppedDesc  = prometheus.NewDesc("npurun_usage_records_dropped_total", "Accounting log records that could not be written since the broker started.", nil, nil)
)

func newMetrics(g *Ledger) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		grants: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "npurun_grants_total",
			Help: "Leases granted, by kind: inline (npurun), task, login, slurm, container (granted on a container's behalf)."}, []string{"kind"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "npurun_grant_wait_seconds",
			Help:    "Time from a request's arrival in line to its grant, by kind.",
			Buckets: []float64{0.001, 0.01, 0.1, 1, 10, 60, 300, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600}}, []string{"kind"}),
		handoffH: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "npurun_handoff_seconds",
			Help:    "Time from a lease's end to the grant of its device to a request that was waiting.",
			Buckets: []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}}),
		scanDur:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "npurun_scan_duration_seconds", Help: "How long the last background /proc scan took."}),
		scanN:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "npurun_scan_processes", Help: "Processes the last background /proc scan looked at."}),
		reclaimed: newReclaimed(),
	}
	for _, kind := range []string{wire.KindInline, wire.KindTask, wire.KindLogin, wire.KindContainer} {
		m.grants.WithLabelValues(kind)
	}
	m.reg.MustRegister(m.grants, m.reclaimed, m.wait, m.handoffH, m.scanDur, m.scanN, stateCollector{g},
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) granted(kind string, waited time.Duration) {
	m.grants.WithLabelValues(kind).Inc()
	m.wait.WithLabelValues(kind).Observe(waited.Seconds())
}

func (m *metrics) handoff(d time.Duration) { m.handoffH.Observe(d.Seconds()) }

func (m *metrics) scanned(res *procscan.Result) {
	m.scanDur.Set(res.Took.Seconds())
	m.scanN.Set(float64(res.Procs))
}

// stateCollector reads the rooms' state at each scrape.
type stateCollector struct{ g *Ledger }

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{devicesDesc, waitersDesc, unleasedDesc, tasksDesc, droppedDesc, utilDesc, memUsedDesc, memTotalDesc, idleDesc} {
		ch <- d
	}
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	g := c.g
	snap := g.table.Snapshot()
	_, ncpu := g.tasks.CPULine(0)
	tasks := g.tasks.Counts()
	g.mu.Lock()
	states, _ := g.statesLocked(snap)
	unleased := len(g.reported)
	utils := g.utilMetricsLocked(time.Now())
	g.unlock()
	for _, m := range utils {
		ch <- m
	}
	byState := map[string]int{}
	for _, st := range states {
		byState[st]++
	}
	waiters := map[string]int{}
	for _, p := range g.policy().Pools {
		waiters[p.Name] = 0
	}
	for _, p := range snap.Line {
		waiters[p.W.Pool]++
	}
	waiters["cpu"] = ncpu
	for _, st := range []string{wire.DeviceFree, wire.DeviceReserved, wire.DeviceLeased, wire.DeviceTask, wire.DeviceLogin, wire.DeviceSlurm, wire.DeviceContainer, wire.DeviceHeld, wire.DeviceDrained, wire.DeviceOut} {
		ch <- prometheus.MustNewConstMetric(devicesDesc, prometheus.GaugeValue, float64(byState[st]), st)
	}
	for pool, n := range waiters {
		ch <- prometheus.MustNewConstMetric(waitersDesc, prometheus.GaugeValue, float64(n), pool)
	}
	ch <- prometheus.MustNewConstMetric(unleasedDesc, prometheus.GaugeValue, float64(unleased))
	for _, st := range []string{wire.StatePending, wire.StateBlocked, wire.StateRunning, wire.StateDone, wire.StateFailed, wire.StateCancelled, wire.StateLost} {
		ch <- prometheus.MustNewConstMetric(tasksDesc, prometheus.GaugeValue, float64(tasks[st]), st)
	}
	ch <- prometheus.MustNewConstMetric(droppedDesc, prometheus.CounterValue, float64(g.usage.dropped.Load()))
}

// listenMetrics opens [broker] metrics_listen, if set. A metrics endpoint
// that cannot listen is said in the log, and leases go on.
func (g *Ledger) listenMetrics() {
	addr := g.policy().MetricsListen
	if addr == "" {
		return
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		g.log.Printf("metrics: %v; serving leases without metrics", err)
		return
	}
	g.metricsLn = ln
	g.log.Printf("metrics on http://%s/metrics", ln.Addr())
}

// The metrics endpoint has no authentication, so whoever can reach it can
// hold connections open: it serves MaxMetricsConns at once (the others
// wait in the kernel's backlog, costing the broker no descriptor), and
// each must send its request within metricsReadTimeout, body included (a
// POST that announces a body and sends none holds its connection no
// longer), and is closed after metricsIdle without one.
const (
	MaxMetricsConns    = 8
	metricsReadTimeout = 5 * time.Second
	metricsIdle        = 10 * time.Second
)

// ServeMetrics serves the metrics until ctx is done, if [broker]
// metrics_listen is set.
func (g *Ledger) ServeMetrics(ctx context.Context) {
	ln := g.metricsLn
	if ln == nil {
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g.metrics.reg, promhttp.HandlerOpts{MaxRequestsInFlight: MaxMetricsConns, Timeout: 10 * time.Second}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: metricsReadTimeout, ReadTimeout: metricsReadTimeout,
		WriteTimeout: 15 * time.Second, IdleTimeout: metricsIdle, MaxHeaderBytes: 16 << 10,
		ErrorLog: log.New(metricsErrors{g.repeat}, "metrics: ", 0)}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	go func() {
		if err := srv.Serve(limitListener(ln, MaxMetricsConns)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			g.log.Printf("metrics: %v", err)
		}
	}()
}

// metricsErrors takes the HTTP server's error lines to the broker's log,
// each said once in a while however often it repeats (an accept that
// fails out of descriptors is tried again every few milliseconds).
type metricsErrors struct {
	repeat func(format string, args ...any)
}

func (m metricsErrors) Write(p []byte) (int, error) {
	line, _, _ := strings.Cut(string(p), "; retrying in ") // the same line whatever the delay
	m.repeat("%s", strings.TrimRight(line, "\n"))
	return len(p), nil
}

// limitListener accepts at most n connections at once: Accept waits while
// n are open.
func limitListener(ln net.Listener, n int) net.Listener {
	return &limited{Listener: ln, sem: make(chan struct{}, n), done: make(chan struct{})}
}

type limited struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func (l *limited) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitedConn{Conn: c, release: sync.OnceFunc(func() { <-l.sem })}, nil
}

func (l *limited) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitedConn gives its place back once closed.
type limitedConn struct {
	net.Conn
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
