package lease

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// TestGrantSetsVariables: a free device starts the command at once, with
// the physical and the runtime's variable set and the lease descriptor open.
func TestGrantSetsVariables(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(4))
	out, err := b.Npurun("sh", "-c", `echo "$NPURUN_DEVICES|$ASCEND_RT_VISIBLE_DEVICES|$NPURUN_LEASE"`).Output()
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSpace(string(out)), "|")
	if len(got) != 3 || got[0] != "0" || got[1] != "0" || !strings.HasPrefix(got[2], "0:") {
		t.Fatalf("variables = %q, want NPURUN_DEVICES=0, ASCEND_RT_VISIBLE_DEVICES=0, NPURUN_LEASE=0:FD", out)
	}
}

// TestMutualExclusion: many concurrent npurun on 4 devices; each workload
// proves its exclusivity with an O_EXCL marker per device it was given.
func TestMutualExclusion(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(4))
	markers := t.TempDir()
	log := filepath.Join(t.TempDir(), "runs")
	const jobs = 60
	errs := make(chan error, jobs)
	for i := range jobs {
		n := "1"
		if i%5 == 0 {
			n = "2"
		}
		cmd := b.Npurun("-n", n, b.Bin.Workload, "-markers", markers, "-log", log, "-tag", "j", "-hold", "2ms")
		go func() {
			out, err := cmd.CombinedOutput()
			if err != nil {
				err = &exitError{err, string(out)}
			}
			errs <- err
		}()
	}
	for range jobs {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), "\n"); n != jobs {
		t.Fatalf("%d runs logged, want %d", n, jobs)
	}
}

type exitError struct {
	err error
	out string
}

func (e *exitError) Error() string { return e.err.Error() + ": " + e.out }
