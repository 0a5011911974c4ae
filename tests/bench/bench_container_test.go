package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/container"
	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// Samples of the container benchmarks.
const (
	benchContainerSamples = 15
	benchContainerWarmup  = 2
	benchRuntimeSamples   = 40
)

// BenchmarkContainerStart: `npurun docker run --rm IMAGE /bin/true` beside
// `docker run --rm --device … IMAGE /bin/true` with the same nodes, and
// `docker run --rm --runtime=npurun IMAGE /bin/true` (npurun-runtime in
// front of runc for every call of the engine, no lease), interleaved, on a
// dockerd of the benchmark's own (target: npurun ≤ 1.05× docker).
func BenchmarkContainerStart(b *testing.B) {
	benchNoNsPerOp(b)
	dev := harness.ContainerDev(b, 1)
	br := harness.StartBroker(b, harness.ContainerConfig(b, dev, 1, ""))
	d := harness.StartDockerd(b, br, "")
	env := harness.ContainerClient(br, dev)
	var devices []string
	for _, n := range []string{"davinci0", "davinci_manager", "devmm_svm", "hisi_hdc"} {
		devices = append(devices, "--device="+filepath.Join(dev, n)+":/dev/"+n)
	}
	run := func(name string, cmd func() *exec.Cmd) *benchSide {
		return &benchSide{name: name, sample: func() time.Duration { return benchTimeRun(b, cmd()) }}
	}
	npurun := run("npurun docker run --rm", func() *exec.Cmd {
		return harness.NpurunIn(br, env, harness.DockerBin, "-H", "unix://"+d.Sock, "run", "--rm", "local/mini", "/bin/true")
	})
	plain := run("docker run --rm --device ×4", func() *exec.Cmd {
		return d.Docker(append(append([]string{"run", "--rm"}, devices...), "local/mini", "/bin/true")...)
	})
	through := run("docker run --rm --runtime=npurun", func() *exec.Cmd {
		return d.Docker("run", "--rm", "--runtime=npurun", "local/mini", "/bin/true")
	})
	sides := []*benchSide{npurun, plain, through}
	benchInterleave(benchContainerWarmup, sides...)
	for _, s := range sides {
		s.got = nil
	}
	benchInterleave(benchContainerSamples, sides...)
	b.ReportMetric(benchMs(npurun.p50()), "npurun-p50-ms")
	b.ReportMetric(benchMs(plain.p50()), "docker-p50-ms")
	b.ReportMetric(benchMs(through.p50()), "runtime-p50-ms")
	b.ReportMetric(float64(npurun.p50())/float64(plain.p50()), "ratio-docker")
	benchSummary(b, fmt.Sprintf("a container's start and end, %d runs each, interleaved (target: npurun ≤ 1.05× docker)", benchContainerSamples), [][]string{
		{"", "p10 ms", "p50 ms", "p90 ms"},
		npurun.row(), plain.row(), through.row(),
		{"npurun / docker, p50", ratio(npurun, plain)},
		{"runtime in front of runc / docker, p50", ratio(through, plain)},
	})
}

// BenchmarkRuntimeCreate: npurun-runtime's own cost at a container's
// create, with "runc" being /bin/true: it reads the bundle and the
// configuration, takes a lease over the hand-over, checks it, records the
// owner and starts runc with the lease; beside /bin/true itself (a
// process's start) and npurun-runtime passing another command to runc
// (target: well under 50 ms).
func BenchmarkRuntimeCreate(b *testing.B) {
	benchNoNsPerOp(b)
	harness.NeedRoot(b)
	dev := harness.ContainerDev(b, 1)
	br := harness.StartBroker(b, harness.ContainerConfig(b, dev, 1, ""))
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dev, "davinci0"), &st); err != nil {
		b.Fatal(err)
	}
	bundle := harness.SharedDir(b)
	home := filepath.Join(bundle, "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		b.Fatal(err)
	}
	id := strings.Repeat("be", 32)
	spec := func(handover string) {
		major, minor := int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		cfg := map[string]any{
			"process": map[string]any{"env": []string{"PATH=/bin", container.HandoverVar + "=" + handover}},
			"mounts":  []map[string]string{{"destination": "/etc/hostname", "source": filepath.Join(home, "hostname")}},
			"linux": map[string]any{"cgroupsPath": "/docker/" + id, "resources": map[string]any{"devices": []map[string]any{
				{"allow": false, "access": "rwm"},
				{"allow": true, "type": "c", "major": major, "minor": minor, "access": "rwm"},
			}}},
		}
		data, _ := json.Marshal(cfg)
		if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	runtime := func(args ...string) *exec.Cmd {
		return exec.Command(br.Bin.Runtime, append([]string{"--npurun-config", br.Conf, "--npurun-socket", br.Socket, "--npurun-runc", "/bin/true"}, args...)...)
	}
	create := &benchSide{name: "npurun-runtime create (hand-over)", sample: func() time.Duration {
		c, err := wire.Dial(br.Socket)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		if err := c.Send(&wire.Request{Op: wire.OpAcquire, Devices: []int{0}}); err != nil {
			b.Fatal(err)
		}
		r, fds, err := c.Recv(harness.EventTimeout)
		if err != nil || r.Type != wire.TypeGrant {
			b.Fatalf("acquire: %+v, %v", r, err)
		}
		h, err := container.NewHandover("ascend", []int{0}, fds)
		unix.Close(fds[0])
		if err != nil {
			b.Fatal(err)
		}
		defer h.Close()
		spec(h.Addr)
		go h.Serve(-1)
		d := benchTimeRun(b, runtime("create", "--bundle", bundle, "--pid-file", filepath.Join(bundle, "pid"), id))
		if h.Taken() != id {
			b.Fatalf("the runtime did not take the lease (taken %q)", h.Taken())
		}
		return d
	}}
	pass := &benchSide{name: "npurun-runtime state (to runc)", sample: func() time.Duration {
		return benchTimeRun(b, runtime("state", id))
	}}
	truth := &benchSide{name: "/bin/true", sample: func() time.Duration { return benchTrue(b) }}
	sides := []*benchSide{create, pass, truth}
	benchInterleave(benchContainerWarmup, sides...)
	for _, s := range sides {
		s.got = nil
	}
	benchInterleave(benchRuntimeSamples, sides...)
	b.ReportMetric(benchMs(create.p50()), "create-p50-ms")
	b.ReportMetric(benchMs(pass.p50()), "pass-p50-ms")
	b.ReportMetric(benchMs(truth.p50()), "true-p50-ms")
	benchSummary(b, fmt.Sprintf("npurun-runtime's own cost, runc being /bin/true, %d runs each, interleaved (target: well under 50 ms)", benchRuntimeSamples), [][]string{
		{"", "p10 ms", "p50 ms", "p90 ms"},
		create.row(), pass.row(), truth.row(),
	})
}
