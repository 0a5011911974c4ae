package lease

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
)

// TestFIFOOrder: waiters of one user are served in the order they arrived.
// Each waiter is started only once the broker has queued the previous one,
// so arrival order is known; the workload log shows service order.
func TestFIFOOrder(t *testing.T) {
	for _, tc := range []struct {
		name    string
		devices int
		n       string
	}{
		{"one device", 1, "1"},
		{"all of four devices", 4, "4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := harness.StartBroker(t, harness.FakeConfig(tc.devices))
			w := harness.NewWorkload(t)
			h := harness.Hold(t, b, "holder", "-n", fmt.Sprint(tc.devices))
			var want []string
			var waiters []*harness.Proc
			for i := range 6 {
				tag := fmt.Sprintf("w%d", i)
				want = append(want, tag)
				waiters = append(waiters, harness.Queue(t, b, tag, append([]string{"-n", tc.n}, w.Args(b, tag, 2*time.Millisecond)...)...))
			}
			h.Release()
			for _, p := range waiters {
				p.MustSucceed()
			}
			runs := w.Runs(t)
			if got := harness.Tags(runs); !slices.Equal(got, want) {
				t.Fatalf("service order %v, want arrival order %v", got, want)
			}
			for i := 1; i < len(runs); i++ {
				if runs[i].Start < runs[i-1].End {
					t.Errorf("%s started before %s ended", runs[i].Tag, runs[i-1].Tag)
				}
			}
		})
	}
}

// TestReservation: a multi-device request at the head of the line reserves
// devices as they free up; a later, smaller request that could use them
// waits behind it instead of overtaking.
func TestReservation(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(4))
	w := harness.NewWorkload(t)
	h := harness.Hold(t, b, "holder", "-d", "0")
	// npu 1-3 are free but the head needs all four: it reserves them.
	big := harness.Queue(t, b, "big", append([]string{"-n", "4"}, w.Args(b, "big", 5*time.Millisecond)...)...)
	// Without the reservation this one would start at once on npu 1.
	small := harness.Queue(t, b, "small", append([]string{"-n", "1"}, w.Args(b, "small", 0)...)...)
	h.Release()
	big.MustSucceed()
	small.MustSucceed()
	if got := harness.Tags(w.Runs(t)); !slices.Equal(got, []string{"big", "small"}) {
		t.Fatalf("service order %v, want [big small]", got)
	}
}

// TestBackfill: a smaller request behind a waiting head runs at once on a
// device the head cannot use, and never on one the head has reserved.
func TestBackfill(t *testing.T) {
	for _, tc := range []struct {
		name     string
		conf     string
		hold     []string // the holder's request
		head     []string // the waiting head's request
		small    []string // the later request that backfills
		wantDevs string   // where the small one must run
	}{
		{
			name:     "exact devices",
			conf:     harness.FakeConfig(4),
			hold:     []string{"-d", "1"},
			head:     []string{"-d", "0,1"}, // waits for 1, reserves 0
			small:    []string{"-n", "1"},   // would take 0 first; must take 2
			wantDevs: "2",
		},
		{
			name:     "two pools",
			conf:     harness.FakeConfig(4) + "[pools]\na = \"0-1\"\nb = \"2-3\"\n",
			hold:     []string{"-p", "a", "-n", "1"}, // holds 0
			head:     []string{"-p", "a", "-n", "2"}, // waits for 0, reserves 1
			small:    []string{"-p", "b", "-n", "1"},
			wantDevs: "2",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := harness.StartBroker(t, tc.conf)
			w := harness.NewWorkload(t)
			h := harness.Hold(t, b, "holder", tc.hold...)
			head := harness.Queue(t, b, "head", append(tc.head, w.Args(b, "head", 0)...)...)
			// The small request runs while the head still waits.
			small := harness.StartProc(t, "small", b.Npurun(append(tc.small, w.Args(b, "small", 0)...)...))
			small.MustSucceed()
			if head.Exited() {
				t.Fatalf("head ran while its device was held; output:\n%s", head.Output())
			}
			h.Release()
			head.MustSucceed()
			runs := w.Runs(t)
			if got := harness.Tags(runs); !slices.Equal(got, []string{"small", "head"}) {
				t.Fatalf("service order %v, want [small head]", got)
			}
			if runs[0].Devices != tc.wantDevs {
				t.Errorf("small ran on npu %s, want npu %s (not one the head reserved)", runs[0].Devices, tc.wantDevs)
			}
		})
	}
}

// TestNoStarvation: a stream of one-device jobs keeps all four devices
// busy with more waiting; a four-device request that arrives meanwhile is served, and before
// every one-device request that arrived after it.
func TestNoStarvation(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(4))
	w := harness.NewWorkload(t)
	var (
		late    atomic.Bool // set once the big request is queued
		stop    atomic.Bool
		wg      sync.WaitGroup
		failMu  sync.Mutex
		failure []string
		seq     atomic.Int64
	)
	// Eight streams on four devices: a freed device always has a one-device
	// request waiting for it.
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				tag := fmt.Sprintf("early%d", seq.Add(1))
				if late.Load() {
					tag = "late" + tag[len("early"):]
				}
				code, out := harness.ExitCode(t, b.Npurun(append([]string{"-n", "1"}, w.Args(b, tag, 20*time.Millisecond)...)...))
				if code != 0 {
					failMu.Lock()
					failure = append(failure, fmt.Sprintf("%s: exit %d: %s", tag, code, out))
					failMu.Unlock()
					return
				}
			}
		}()
	}
	// Wait until the stream keeps the devices busy: a few runs done.
	waitRuns(t, w, 8)
	// The broker has big once it says so: queued, or already granted (the
	// first queued message may come only after a short wait).
	big := harness.StartProc(t, "big", b.Npurun(append([]string{"-v", "-n", "4"}, w.Args(b, "big", 0)...)...))
	big.WaitLine("npurun: ")
	late.Store(true)
	done := make(chan struct{})
	go func() { big.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(harness.EventTimeout):
		t.Error("the four-device request starved behind the one-device stream")
	}
	stop.Store(true)
	wg.Wait()
	for _, f := range failure {
		t.Error(f)
	}
	big.MustSucceed()
	runs := w.Runs(t)
	var bigStart int64
	for _, r := range runs {
		if r.Tag == "big" {
			bigStart = r.Start
		}
	}
	if bigStart == 0 {
		t.Fatalf("big did not run; log: %v", harness.Tags(runs))
	}
	for _, r := range runs {
		if strings.HasPrefix(r.Tag, "late") && r.Start < bigStart {
			t.Errorf("%s arrived after the four-device request but started before it", r.Tag)
		}
	}
}

// waitRuns waits until the workload log has at least n runs. The log is a
// file written by other processes, so this polls it on a short ticker.
func waitRuns(t testing.TB, w harness.Workload, n int) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(harness.EventTimeout)
	for len(w.Runs(t)) < n {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("fewer than %d runs logged within %s", n, harness.EventTimeout)
		}
	}
}

// TestExactDeviceWaitsAlone: -d N waits for npu N even when others are
// free, and does not hold up requests that can use the free ones.
func TestExactDeviceWaitsAlone(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(4))
	w := harness.NewWorkload(t)
	h := harness.Hold(t, b, "holder", "-d", "2")
	exact := harness.Queue(t, b, "exact", append([]string{"-d", "2"}, w.Args(b, "exact", 0)...)...)
	other := harness.StartProc(t, "other", b.Npurun(w.Args(b, "other", 0)...))
	other.MustSucceed()
	if exact.Exited() {
		t.Fatalf("-d 2 ran while npu 2 was held; output:\n%s", exact.Output())
	}
	h.Release()
	exact.MustSucceed()
	runs := w.Runs(t)
	if got := harness.Tags(runs); !slices.Equal(got, []string{"other", "exact"}) {
		t.Fatalf("service order %v, want [other exact]", got)
	}
	if runs[1].Devices != "2" {
		t.Errorf("-d 2 ran on npu %q", runs[1].Devices)
	}
	if runs[0].Devices == "2" {
		t.Errorf("the other request ran on npu 2, which was held")
	}
}

// TestLimits: [limits] max_devices bounds what one user asks for and holds.
func TestLimits(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(4)+"[limits]\nmax_devices = 1\n")

	t.Run("over the limit is denied", func(t *testing.T) {
		code, out := harness.ExitCode(t, b.Npurun("-n", "2", "true"))
		if code != 77 {
			t.Fatalf("npurun -n 2: exit %d, want 77; output:\n%s", code, out)
		}
		if !strings.Contains(out, "limit") || !strings.Contains(out, "1") || !strings.HasPrefix(out, "npurun: ") {
			t.Errorf("denial does not name the limit: %q", out)
		}
	})

	t.Run("second request waits for the first", func(t *testing.T) {
		w := harness.NewWorkload(t)
		h := harness.Hold(t, b, "holder")
		p := harness.Queue(t, b, "second", w.Args(b, "second", 0)...)
		line := p.WaitLine("npurun: waiting for")
		if !strings.Contains(line, "1 of 1 device allowed") {
			t.Errorf("waiting line does not name the limit: %q", line)
		}
		released := time.Now().UnixNano()
		h.Release()
		p.MustSucceed()
		runs := w.Runs(t)
		if len(runs) != 1 || runs[0].Start < released {
			t.Fatalf("second request ran before the first ended: %+v (released at %d)", runs, released)
		}
	})
}
