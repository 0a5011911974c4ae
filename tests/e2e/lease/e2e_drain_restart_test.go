package lease

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// TestDrainAnsweredAcrossRestart: a drain whose broker is killed with -9
// after it made the drain and before it answered (stopped there by a test
// hook) is answered all the same: npubroker drain asks the broker that
// comes next, which has the drain, and exits 0. It failed with "the broker
// closed the connection" (issue 27.10).
func TestDrainAnsweredAcrossRestart(t *testing.T) {
	b := harness.NewBroker(t, harness.FakeConfig(2), "NPUBROKER_TEST_HOOK=before-drain-reply")
	b.Start()
	type result struct {
		code     int
		out, err string
	}
	done := make(chan result, 1)
	go func() {
		code, out, errs := harness.DrainCmd(t, b, nil, "drain", "npu1", "--reason", "fan", "--json")
		done <- result{code, out, errs}
	}()
	b.WaitLog(0, "test hook before-drain-reply: drain of npu1 stops here")
	b.Kill()
	b.ExtraEnv = harness.WithoutHook(b.ExtraEnv)
	b.Start()
	var r result
	select {
	case r = <-done:
	case <-time.After(harness.EventTimeout):
		t.Fatalf("npubroker drain did not end within %s of the next broker's start", harness.EventTimeout)
	}
	var info wire.DrainInfo
	if err := json.Unmarshal([]byte(r.out), &info); r.code != 0 || err != nil || !info.Drained || info.Device != "npu1" || info.Reason != "fan" {
		t.Fatalf("drain across a kill: exit %d, %s%s; want exit 0, npu1 drained for fan", r.code, r.out, r.err)
	}
	if !strings.Contains(r.err, "asking the broker that comes next") {
		t.Errorf("drain across a kill says nothing of it: %q", r.err)
	}
	if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "-d", "1", "true")); code == 0 {
		t.Errorf("npu1 granted after its drain was answered: %s", out)
	}
}

// TestCommandsAtStart: commands sent as soon as a starting broker's socket
// takes connections, while it takes up its leases and tasks, are answered,
// over several starts after a kill -9: none finds its connection closed.
func TestCommandsAtStart(t *testing.T) {
	b := harness.StartBroker(t, harness.TaskConfig(2))
	harness.Hold(t, b, "held", "-d", "1") // a lease each start takes up
	for i := range 5 {
		b.Kill()
		var wg sync.WaitGroup
		wg.Go(func() { b.Start() })
		for _, op := range []string{"drain", "undrain"} {
			for {
				code, _, errs := harness.DrainCmd(t, b, nil, op, "npu0")
				if code == 69 && strings.Contains(errs, "no broker at") { // EX_UNAVAILABLE
					time.Sleep(5 * time.Millisecond) // not listening yet: poll again
					continue
				}
				if code != 0 {
					t.Errorf("start %d: %s as soon as the socket took it: exit %d: %s", i, op, code, errs)
				}
				break
			}
		}
		wg.Wait()
	}
}
