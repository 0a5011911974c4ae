package lease

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
)

// TestSubleases: npurun -n 1 inside a lease of two devices takes one of
// them, and six such commands started at once share the two, each
// device used by one at a time (each run marks its device O_EXCL), both
// devices in use; none asks the broker for more.
func TestSubleases(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(4))
	w := harness.NewWorkload(t)
	inner := ""
	for i := range 6 {
		inner += fmt.Sprintf("%s -n 1 %s & pids=\"$pids $!\"; ", b.Bin.Npurun, strings.Join(w.Args(b, fmt.Sprintf("s%d", i), 300*time.Millisecond), " "))
	}
	code, out := harness.ExitCode(t, b.Npurun("-d", "1-2", "sh", "-c", inner+"fail=0; for p in $pids; do wait $p || fail=1; done; exit $fail"))
	if code != 0 {
		t.Fatalf("npurun -d 1-2 with six npurun -n 1 inside: exit %d; output:\n%s", code, out)
	}
	runs := w.Runs(t)
	if len(runs) != 6 {
		t.Fatalf("%d runs, want 6: %v", len(runs), harness.Tags(runs))
	}
	used := map[string]int{}
	for _, r := range runs {
		used[r.Devices]++
	}
	if len(used) != 2 || used["1"] == 0 || used["2"] == 0 {
		t.Errorf("runs by device %v, want devices 1 and 2 both used, no other", used)
	}
	// Never more than one run on a device at once (the markers saw to
	// that, or a run failed), and so at most two at a time.
	for _, r := range runs {
		for _, o := range runs {
			if r.Tag != o.Tag && r.Devices == o.Devices && r.Start < o.End && o.Start < r.End {
				t.Errorf("%s and %s overlap on device %s", r.Tag, o.Tag, r.Devices)
			}
		}
	}
}

// TestSubleaseWaitsAndEnds: a nested npurun -n 1 waits while a sibling's
// sub-lease holds the lease's only device, says so, starts when the
// sibling's process tree is gone (killed with -9: the kernel frees the
// name), fails at once with --no-wait (75, naming the holder) and gives up
// after --timeout (75); an npurun that asks for no device in particular
// runs on the whole lease beside it, and one inside the sub-lease does not
// wait for its own parent.
func TestSubleaseWaitsAndEnds(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(2))
	dir := harness.SharedDir(t)
	fifo := filepath.Join(dir, "hold")
	harness.MakeFIFO(t, fifo)
	// The outer lease's command: a holder with a sub-lease, whose pid
	// comes first, then what the test sends on standard input, one
	// command line at a time.
	outer := harness.StartProc(t, "outer", b.Npurun("-d", "0", "sh", "-c",
		b.Bin.Npurun+` -n 1 sh -c 'echo HOLDER on $NPURUN_DEVICES: $$; `+b.Bin.Npurun+` -n 1 sh -c "echo INNER \$NPURUN_DEVICES"; read x < `+fifo+`' & `+
			`i=0; while read -r line; do i=$((i+1)); sh -c "$line"; echo "DONE$i $?"; done`))
	holder := harness.PIDOf(t, outer.WaitLine("HOLDER"))
	outer.WaitLine("INNER 0") // inside the sub-lease, at once
	runs := 0
	// run runs line in the outer lease and returns its exit status.
	run := func(line string) string {
		t.Helper()
		runs++
		if _, err := outer.Stdin.Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
		return strings.Fields(outer.WaitLine(fmt.Sprintf("DONE%d ", runs)))[1]
	}
	if code := run(b.Bin.Npurun + " --no-wait -n 1 true"); code != "75" {
		t.Errorf("--no-wait beside a sub-lease: exit %s, want 75", code)
	}
	outer.WaitLine(fmt.Sprintf("npurun: inside a lease of device 0: 1 device held by other npuruns' sub-leases (device 0: pid %d)", holder))
	start := time.Now()
	if code := run(b.Bin.Npurun + " --timeout 1s -n 1 true"); code != "75" {
		t.Errorf("--timeout beside a sub-lease: exit %s, want 75", code)
	} else if took := time.Since(start); took < time.Second {
		t.Errorf("--timeout 1s gave up after %s", took)
	}
	outer.WaitLine("npurun: inside a lease of device 0: gave up after 1s waiting for 1 device")
	if code := run(b.Bin.Npurun + ` sh -c 'echo WHOLE $NPURUN_DEVICES'`); code != "0" {
		t.Errorf("npurun without -n beside a sub-lease: exit %s", code)
	}
	outer.WaitLine("WHOLE 0")
	// A waiter, released by the holder's end.
	if _, err := outer.Stdin.Write([]byte(b.Bin.Npurun + ` -v -n 1 sh -c 'echo WAITED $NPURUN_DEVICES'` + "\n")); err != nil {
		t.Fatal(err)
	}
	outer.WaitLine(fmt.Sprintf("npurun: waiting for 1 device of the lease of device 0: held by device 0: pid %d", holder))
	if err := unix.Kill(holder, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	outer.WaitLine("WAITED 0")
	if line := outer.WaitLine("DONE4 "); line != "DONE4 0" {
		t.Errorf("the waiter: %s", line)
	}
	outer.Stdin.Close()
	outer.MustSucceed()
}

// TestSubleasesNested: a sub-lease of two devices is the lease for what
// runs inside it: two npurun -n 1 there share its devices, one each,
// without waiting for the sub-lease that holds them for them.
func TestSubleasesNested(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(4))
	dir := harness.SharedDir(t)
	fifo := filepath.Join(dir, "both")
	harness.MakeFIFO(t, fifo)
	inner := b.Bin.Npurun + ` --no-wait -n 1 sh -c 'echo ON \$NPURUN_DEVICES; read x < ` + fifo + `'`
	// Held open for the test's life: each reader takes its line.
	release, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer release.Close()
	p := harness.StartProc(t, "outer", b.Npurun("-n", "4", "sh", "-c", b.Bin.Npurun+" --no-wait -d 1,3 sh -c \""+inner+" & "+inner+" & wait\""))
	p.WaitLine("ON 1")
	p.WaitLine("ON 3")
	if n := strings.Count(p.Output(), "ON "); n != 2 {
		t.Errorf("%d runs inside the sub-lease, want 2:\n%s", n, p.Output())
	}
	if _, err := release.Write([]byte("go\ngo\n")); err != nil {
		t.Fatal(err)
	}
	p.MustSucceed()
}

// TestSubleaseNoWaitBesideCollector: a request that does not wait takes
// no place in the sub-leases' line. A sibling waits in the line for
// device 1 (held), and npurun --no-wait -d 3 still takes device 3, which
// is free, at once; --no-wait -d 1 is refused naming the holder.
func TestSubleaseNoWaitBesideCollector(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(4))
	dir := harness.SharedDir(t)
	fifo := filepath.Join(dir, "hold")
	harness.MakeFIFO(t, fifo)
	release, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer release.Close()
	np := b.Bin.Npurun
	p := harness.StartProc(t, "outer", b.Npurun("-d", "1,3", "sh", "-c",
		np+` -d 1 sh -c 'echo HOLDER $$; read x < `+fifo+`' & `+
			`read a; `+np+` -v -d 1 sh -c 'echo COLLECTED $NPURUN_DEVICES' & `+
			`read b; `+
			np+` --no-wait -d 3 sh -c 'echo FREE $NPURUN_DEVICES'; echo "FREEDONE $?"; `+
			np+` --no-wait -d 1 true; echo "BUSYDONE $?"; wait`))
	holder := harness.PIDOf(t, p.WaitLine("HOLDER"))
	if _, err := p.Stdin.Write([]byte("a\n")); err != nil {
		t.Fatal(err)
	}
	p.WaitLine(fmt.Sprintf("waiting for device 1 of the lease of devices 1,3: held by device 1: pid %d", holder))
	if _, err := p.Stdin.Write([]byte("b\n")); err != nil {
		t.Fatal(err)
	}
	p.WaitLine("FREE 3")
	if line := p.WaitLine("FREEDONE "); line != "FREEDONE 0" {
		t.Errorf("--no-wait for a free device beside a waiting collector: %s", line)
	}
	if line := p.WaitLine("BUSYDONE "); line != "BUSYDONE 75" {
		t.Errorf("--no-wait for a held device: %s", line)
	}
	if _, err := release.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	p.WaitLine("COLLECTED 1")
	p.Stdin.Close()
	p.MustSucceed()
}
