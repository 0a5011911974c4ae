package lease

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// healthDrained tells whether device id (leased or not) is drained by the health check
// for a reason that contains words.
func healthDrained(b *wire.Board, id int, words string) bool {
	for _, d := range b.Devices {
		if d.ID == id {
			return d.Drain != nil && d.Drain.By == "health check" && strings.Contains(d.Drain.Reason, words)
		}
	}
	return false
}

// TestHealthDrainFake: with [devices] health_interval, the broker reads
// the fake vendor's health file and drains a device that says it is
// unhealthy, with its words as the reason; its holder runs on to its end
// and no new lease is granted on it; a Warning is logged, not drained; a
// file that does not parse drains nothing; a device well again stays
// drained until undrained, and is then granted.
func TestHealthDrainFake(t *testing.T) {
	harness.NeedRoot(t)
	dir := harness.SharedDir(t)
	health := filepath.Join(dir, "health")
	write := func(s string) {
		t.Helper()
		tmp := health + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, health); err != nil {
			t.Fatal(err)
		}
	}
	b := harness.StartBroker(t, harness.FakeConfig(3)+fmt.Sprintf("health_interval = \"1s\"\nfake_health = %q\n", health))
	h := harness.Hold(t, b, "holder", "-d", "1")
	mark := b.LogLen()
	write("0 OK\n1 Critical HBM uncorrectable ECC\n2 Warning fan speed low\n")
	harness.WaitBoard(t, b, func(bd *wire.Board) bool { return healthDrained(bd, 1, "Critical; HBM uncorrectable ECC") })
	b.WaitLog(mark, "npu1 drained by the health check: Health Status: Critical; HBM uncorrectable ECC")
	b.WaitLog(mark, "npu2 reports Health Status: Warning; fan speed low: not drained")
	bd := b.Board(t)
	if d := boardDevice(t, bd, 2); d.Drain != nil || d.State != wire.DeviceFree {
		t.Errorf("npu2, which reports a Warning, shows as %q (drain %+v), want free", d.State, d.Drain)
	}
	if d := boardDevice(t, bd, 0); d.Drain != nil {
		t.Errorf("healthy npu0 drained: %+v", d.Drain)
	}
	if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "-d", "1", "true")); code != 75 {
		t.Errorf("npurun --no-wait -d 1 on npu1, drained for its health: exit %d, want 75: %s", code, out)
	}
	h.Release() // its command ran on, and ends as it would have
	harness.WaitBoard(t, b, func(bd *wire.Board) bool { return boardDevice(t, bd, 1).Lease == nil })

	// What does not parse drains nothing, and is logged.
	mark = b.LogLen()
	write("0 OK\n0\n")
	b.WaitLog(mark, "health of npu0: no answer: ")
	if d := boardDevice(t, b.Board(t), 0); d.Drain != nil {
		t.Errorf("a health file that does not parse drained npu0: %+v", d.Drain)
	}

	// Well again: npu1 stays drained, until an administrator says.
	mark = b.LogLen()
	write("1 OK\n")
	b.WaitLog(mark, "npu1 is healthy again: it stays drained until npubroker undrain npu1")
	if !healthDrained(b.Board(t), 1, "HBM") {
		t.Fatalf("npu1 undrained itself once its health file said OK")
	}
	undrain(t, b, "npu1")
	if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "-d", "1", "true")); code != 0 {
		t.Errorf("npurun -d 1 after undrain: exit %d: %s", code, out)
	}
}

// TestHealthDrainAscend: on an Ascend node, the broker asks `npu-smi info
// -t health -i CARD` (the card from npu-smi info -m's table) and drains
// the devices of a card that says Critical, with npu-smi's words (its
// error code and information) as the reason; a card whose npu-smi run
// fails drains nothing.
func TestHealthDrainAscend(t *testing.T) {
	harness.NeedRoot(t)
	dev := harness.FakeDev(t, 3)
	dir := harness.SharedDir(t)
	smi := filepath.Join(dir, "npu-smi")
	// Cards: davinci0 is card 4, davinci1 and davinci2 the two chips of
	// card 6. A card's health is the file health.CARD, OK without one.
	script := `#!/bin/sh
if [ "$1 $2" = "info -m" ]; then
	printf '\tNPU ID  Chip ID  Chip Logic ID  Chip Phy-ID  Chip Name\n'
	printf '\t4       0        0              0            Ascend 910C\n'
	printf '\t6       0        1              1            Ascend 910C\n'
	printf '\t6       1        2              2            Ascend 910C\n'
	printf '\t6       2        -              -            Mcu\n'
	exit 0
fi
if [ "$1 $2 $3 $4" = "info -t health -i" ]; then
	f=` + dir + `/health.$5
	[ -f "$f.fail" ] && { echo "dcmi error $5" >&2; exit 8; }
	[ -f "$f" ] && exec cat "$f"
	printf '\tHealth Status                  : OK\n\tError Code                     : NA\n\tError Information              : NA\n'
	exit 0
fi
exit 2
`
	if err := os.WriteFile(smi, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("[devices]\nvendor = \"ascend\"\nids = \"0-2\"\ndev_dir = %q\nnpu_smi = %q\nhealth_interval = \"1s\"\n", dev, smi)
	b := harness.StartBroker(t, conf)
	mark := b.LogLen()
	if err := os.WriteFile(filepath.Join(dir, "health.4.fail"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	b.WaitLog(mark, "health of npu0: no answer: ")
	b.WaitLog(mark, "dcmi error 4")
	sick := "\tHealth Status                  : Critical\n\tError Code                     : 80E01801\n\tError Information              : node type=HBM, event state=uncorrectable ECC\n"
	if err := os.WriteFile(filepath.Join(dir, "health.6"), []byte(sick), 0o644); err != nil {
		t.Fatal(err)
	}
	want := "Health Status: Critical; Error Code: 80E01801; Error Information: node type=HBM, event state=uncorrectable ECC"
	bd := harness.WaitBoard(t, b, func(bd *wire.Board) bool { return healthDrained(bd, 1, want) && healthDrained(bd, 2, want) })
	if d := boardDevice(t, bd, 0); d.Drain != nil {
		t.Errorf("npu0, whose npu-smi run fails, was drained: %+v", d.Drain)
	}
}
