package lease

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// showLease is a command that prints what it runs on: NPURUN_DEVICES,
// ASCEND_RT_VISIBLE_DEVICES and the devices NPURUN_LEASE names, each
// descriptor checked open.
const showLease = `sh -c 'l=""; for p in $(echo "$NPURUN_LEASE" | tr , " "); do [ -e /proc/self/fd/${p#*:} ] && l="$l${l:+,}${p%%:*}"; done; echo "ON devices=[$NPURUN_DEVICES] ascend=[$ASCEND_RT_VISIBLE_DEVICES] lease=[$l]"'`

// onLine is the ON line in output.
func onLine(t *testing.T, output string) string {
	t.Helper()
	for _, line := range strings.Split(output, "\n") {
		if strings.HasPrefix(line, "ON ") {
			return line
		}
	}
	t.Fatalf("no ON line in:\n%s", output)
	return ""
}

// TestNestedNarrows: an npurun inside a lease that asks for some of its
// devices (-d) or fewer (-n K) runs its command on those only, in the
// variables and in NPURUN_LEASE, without asking the broker; one that asks
// for the whole lease, or nothing in particular, runs on all of it; one
// that asks for a device the lease does not hold fails naming it.
func TestNestedNarrows(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(3))
	for _, tc := range []struct {
		name  string
		inner string // the nested npurun's options
		code  int
		want  string // the ON line, or a message
	}{
		{"-d one of two", "-d 1", 0, "ON devices=[1] ascend=[1] lease=[1]"},
		{"-n 1 of two", "-n 1", 0, "ON devices=[0] ascend=[0] lease=[0]"},
		{"-d both", "-d 0-1", 0, "ON devices=[0,1] ascend=[0,1] lease=[0,1]"},
		{"-n 2 of two", "-n 2", 0, "ON devices=[0,1] ascend=[0,1] lease=[0,1]"},
		{"no option", "", 0, "ON devices=[0,1] ascend=[0,1] lease=[0,1]"},
		{"-d beyond", "-d 1-2", 1, "npurun: inside a lease of devices 0-1, which does not hold device 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// --no-wait: asking the broker instead would be answered
			// at once, with device 2 (free) or busy.
			code, out := harness.ExitCode(t, b.Npurun("-d", "0-1", "sh", "-c", b.Bin.Npurun+" -v --no-wait "+tc.inner+" "+showLease))
			if code != tc.code {
				t.Fatalf("npurun -d 0-1 npurun %s: exit %d, want %d; output:\n%s", tc.inner, code, tc.code, out)
			}
			if tc.code == 0 {
				if got := onLine(t, out); got != tc.want || !strings.Contains(out, "inside a lease") {
					t.Errorf("npurun -d 0-1 npurun %s: %q, want %q inside the lease; output:\n%s", tc.inner, got, tc.want, out)
				}
			} else if !strings.Contains(out, tc.want) {
				t.Errorf("npurun -d 0-1 npurun %s: output lacks %q:\n%s", tc.inner, tc.want, out)
			}
		})
	}
	// Two levels down: the narrowed lease is the lease there.
	code, out := harness.ExitCode(t, b.Npurun("-d", "0-1", "sh", "-c", b.Bin.Npurun+" -d 1 "+b.Bin.Npurun+" --no-wait -d 0 true"))
	if code != 1 || !strings.Contains(out, "inside a lease of device 1, which does not hold device 0") {
		t.Errorf("npurun -d 0-1 npurun -d 1 npurun -d 0: exit %d, want 1 naming device 0; output:\n%s", code, out)
	}
}

// TestNestedNarrowsLogical: on Ascend with logical ids that differ from
// the physical ones, a nested npurun -d LIST or -n K sets the variables
// the broker sets for a lease of exactly those devices.
func TestNestedNarrowsLogical(t *testing.T) {
	dev := harness.FakeDev(t, 4)
	smi := filepath.Join(harness.SharedDir(t), "npu-smi")
	// Physical 0..3 are logical 2, 3, 0, 1.
	table := "NPU ID  Chip ID  Chip Logic ID  Chip Phy-ID  Chip Name\n0 0 0 2 Ascend 910\n1 0 1 3 Ascend 910\n2 0 2 0 Ascend 910\n3 0 3 1 Ascend 910\n"
	if err := os.WriteFile(smi, []byte("#!/bin/sh\ncat <<'EOF'\n"+table+"EOF\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	b := harness.StartBroker(t, fmt.Sprintf("[devices]\nvendor = \"ascend\"\nids = \"0-3\"\ndev_dir = %q\nnpu_smi = %q\n", dev, smi))
	for _, tc := range []struct {
		inner, direct string // the nested npurun's options; a lease of the same devices
	}{
		{"-d 0", "-d 0"},
		{"-d 0,3", "-d 0,3"},
		{"-d 1-2", "-d 1-2"},
		{"-n 1", "-d 2"},     // logical 0
		{"-n 3", "-d 0,2-3"}, // logical 2, 0, 1
	} {
		t.Run(tc.inner, func(t *testing.T) {
			code, out := harness.ExitCode(t, b.Npurun("-n", "4", "sh", "-c", b.Bin.Npurun+" --no-wait "+tc.inner+" "+showLease))
			if code != 0 {
				t.Fatalf("npurun -n 4 npurun %s: exit %d; output:\n%s", tc.inner, code, out)
			}
			nested := onLine(t, out)
			// It waits (bounded) rather than --no-wait: the broker
			// hears of the lease just ended through its lock's
			// release, a moment after npurun's exit.
			code, out = harness.ExitCode(t, b.Npurun(append(strings.Fields(tc.direct), "--timeout", "20s", "sh", "-c", showLease[len("sh -c '"):len(showLease)-1])...))
			if code != 0 {
				t.Fatalf("npurun %s: exit %d; output:\n%s", tc.direct, code, out)
			}
			if direct := onLine(t, out); nested != direct {
				t.Errorf("nested npurun %s: %q; a lease of %s from the broker: %q", tc.inner, nested, tc.direct, direct)
			}
		})
	}
}
