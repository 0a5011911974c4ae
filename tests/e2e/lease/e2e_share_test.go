package lease

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// TestSharePacking: a mixed set of shares, started at once on two devices
// of 16 GiB, all run, several at a time on one device, and never more
// than 16 GiB declared on a device: each run checks that itself, summing
// the declarations of the runs on its device under a lock of their own.
// A share larger than any device is refused at once.
func TestSharePacking(t *testing.T) {
	b := harness.StartBroker(t, harness.ShareConfig(2, "16G"))
	w := harness.NewWorkload(t)
	sizes := []int{3, 5, 7, 9, 2, 4, 6, 8, 1, 3, 5, 10, 12, 2}
	var wg sync.WaitGroup
	fails := make(chan string, len(sizes))
	for i, gib := range sizes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tag := fmt.Sprintf("s%d-%dG", i, gib)
			args := append([]string{"--mem", fmt.Sprintf("%dG", gib)}, w.Args(b, tag, 150*time.Millisecond)...)
			args = append(args, "-mem", fmt.Sprint(gib*1024), "-capacity", fmt.Sprint(16*1024))
			if code, out := harness.ExitCode(t, b.Npurun(args...)); code != 0 {
				fails <- fmt.Sprintf("%s: exit %d: %s", tag, code, out)
			}
		}()
	}
	wg.Wait()
	close(fails)
	for f := range fails {
		t.Error(f)
	}
	runs := w.Runs(t)
	if len(runs) != len(sizes) {
		t.Fatalf("%d runs logged, want %d", len(runs), len(sizes))
	}
	// Packing happened: some two runs overlapped on one device.
	overlap := false
	for i, a := range runs {
		for _, c := range runs[i+1:] {
			if a.Devices == c.Devices && a.Start < c.End && c.Start < a.End {
				overlap = true
			}
		}
	}
	if !overlap {
		t.Errorf("no two shares ran at once on one device: %+v", runs)
	}

	code, out := harness.ExitCode(t, b.Npurun("--mem", "17G", "true"))
	if code != 77 || !strings.Contains(out, "npurun: 17G asked, the largest share a device of pool \"default\" holds is 16G") {
		t.Errorf("17G of 16G devices: exit %d, %q; want 77 and the largest share said", code, out)
	}
	code, out = harness.ExitCode(t, b.Npurun("--mem", "12X", "true"))
	if code != 2 || !strings.Contains(out, `npurun: bad size "12X" for --mem: unknown unit "X" (K, M, G or T)`) {
		t.Errorf("--mem 12X: exit %d, %q; want 2 and the bad size said", code, out)
	}
}

// TestShareBestFit: a share goes on the device with the least room that
// holds it, keeping a large free space whole; the grant says what else
// the device holds, and status lists each share with its declaration.
func TestShareBestFit(t *testing.T) {
	b := harness.StartBroker(t, harness.ShareConfig(2, "16G"))
	first := harness.Hold(t, b, "first", "-v", "--mem", "10G")
	if !strings.Contains(first.Output(), "held 0") {
		t.Fatalf("first share: %q, want npu 0", first.Output())
	}
	if !strings.Contains(first.Output(), "npurun: granted 10G of npu 0 (0 other shares, 10G of 16G declared)") {
		t.Errorf("first share's grant message: %q", first.Output())
	}
	// npu 0 has 6G left, npu 1 16G: 4G fits both, and goes to npu 0.
	second := harness.Hold(t, b, "second", "-v", "--mem", "4G")
	if !strings.Contains(second.Output(), "held 0") {
		t.Fatalf("second share: %q, want npu 0 (best fit), not the free npu 1", second.Output())
	}
	if !strings.Contains(second.Output(), "npurun: granted 4G of npu 0 (1 other share, 14G of 16G declared)") {
		t.Errorf("second share's grant message: %q", second.Output())
	}
	// 8G fits only npu 1.
	third := harness.Hold(t, b, "third", "--mem", "8G")
	if !strings.Contains(third.Output(), "held 1") {
		t.Fatalf("third share: %q, want npu 1", third.Output())
	}
	// 10G fits neither now (2G and 8G left): it waits, and the line
	// shows the share it waits for, not a whole device.
	waiting := harness.Queue(t, b, "waiting", "--mem", "10G", "true")
	if !strings.Contains(waiting.Output(), `npurun: waiting for 10G of 1 device in pool "default"`) {
		t.Errorf("a waiting share's progress line: %q, want the share it waits for", waiting.Output())
	}
	st := b.Status(t)
	for _, want := range []string{"MEM", "2 shares", "10G", "4G", "8G", "10G of 1 device"} {
		if !strings.Contains(st, want) {
			t.Errorf("status lacks %q:\n%s", want, st)
		}
	}
	if line := b.Board(t).Waiting; len(line) != 1 || len(line[0].Waiters) != 1 || line[0].Waiters[0].Mem != 10*1024 {
		t.Errorf("status --json's line %+v, want one waiter with mem 10240 (MiB)", line)
	}
	first.Release()
	second.Release()
	third.Release()
	waiting.MustSucceed()
}

// TestShareWholeWaiter: a whole-device request waiting behind shares is
// not passed by later shares: the device takes no new share until the
// whole lease has had it.
func TestShareWholeWaiter(t *testing.T) {
	b := harness.StartBroker(t, harness.ShareConfig(1, "16G"))
	w := harness.NewWorkload(t)
	a := harness.Hold(t, b, "share-a", "--mem", "4G")
	whole := harness.Queue(t, b, "whole", w.Args(b, "whole", 5*time.Millisecond)...)
	// 4G of 12G free would fit: it waits behind the whole request.
	later := harness.Queue(t, b, "later", append([]string{"--mem", "4G"}, w.Args(b, "later", 0)...)...)
	a.Release()
	whole.MustSucceed()
	later.MustSucceed()
	if got := harness.Tags(w.Runs(t)); strings.Join(got, " ") != "whole later" {
		t.Fatalf("service order %v, want [whole later]", got)
	}
}

// TestShareLockFiles: every share has a lock file of its own, made fresh
// for it and removed when it ends; a descriptor kept from an ended share
// reaches its old file, never the one a later share holds; a nested
// npurun inside a share runs under it without asking again.
func TestShareLockFiles(t *testing.T) {
	b := harness.StartBroker(t, harness.ShareConfig(1, "16G"))
	locks := filepath.Join(b.RunDir, "locks")
	inode := `echo "held $NPURUN_DEVICES $(stat -L -c %i /proc/$$/fd/20)"; read x; exit 0`
	a := harness.StartProc(t, "a", b.Npurun("--mem", "4G", "sh", "-c", inode))
	aLine := a.WaitLine("held")
	c := harness.StartProc(t, "c", b.Npurun("--mem", "4G", "sh", "-c", inode))
	cLine := c.WaitLine("held")
	if aLine == cLine {
		t.Fatalf("two shares on one lock file: %q", aLine)
	}
	for _, f := range []string{"npu0.s0.lock", "npu0.s1.lock"} {
		if _, err := os.Lstat(filepath.Join(locks, f)); err != nil {
			t.Errorf("share lock file: %v", err)
		}
	}
	a.Stdin.Close()
	a.MustSucceed()
	// Its slot's next share is on a fresh file.
	d := harness.StartProc(t, "d", b.Npurun("--mem", "4G", "sh", "-c", inode))
	dLine := d.WaitLine("held")
	if dLine == aLine || dLine == cLine {
		t.Fatalf("a later share on an earlier share's file: %q, earlier %q and %q", dLine, aLine, cLine)
	}
	c.Stdin.Close()
	c.MustSucceed()
	d.Stdin.Close()
	d.MustSucceed()
	// The broker hears of a share's end through its lock's release, after
	// the holder's parent does; it removes the file before the board
	// shows the device free.
	harness.WaitBoard(t, b, func(bd *wire.Board) bool { return boardDevice(t, bd, 0).State == wire.DeviceFree })
	if ents, _ := os.ReadDir(locks); len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("lock directory after the shares: %v, want npu0.lock alone", names)
	}

	// A client that keeps its share's descriptor after unlocking it (the
	// broker sees the share end) relocks its own old file at once, while
	// the next share holds a file of its own.
	r := harness.StartProc(t, "relock", b.Npurun("--mem", "12G", b.Bin.Workload, "-relock"))
	r.WaitLine("unlocked npu0")
	next := harness.StartProc(t, "next", b.Npurun("--mem", "12G", "sh", "-c", inode))
	next.WaitLine("held")
	r.Stdin.Write([]byte("x"))
	r.WaitLine("relocked npu0")
	r.Stdin.Close()
	r.MustSucceed()
	next.Stdin.Close()
	next.MustSucceed()

	// Nested: 12G of 16G, and a second 12G could not fit: the inner
	// npurun must take the outer share as its own.
	code, out := harness.ExitCode(t, b.Npurun("--mem", "12G", b.Bin.Npurun, "--no-wait", "--mem", "12G", "true"))
	if code != 0 {
		t.Fatalf("nested npurun inside a share: exit %d, %s", code, out)
	}
}

// TestShareTask: a task's --mem is a share as an npurun's: two tasks of
// 8G run at once on one device of 16G, each checking the declarations on
// it, and show says the declaration.
func TestShareTask(t *testing.T) {
	b := harness.StartBroker(t, harness.ShareConfig(1, "16G"))
	w := harness.NewWorkload(t)
	var ids []string
	for _, tag := range []string{"t1", "t2"} {
		args := append([]string{"--mem", "8G", "--"}, w.Args(b, tag, 300*time.Millisecond)...)
		args = append(args, "-mem", "8192", "-capacity", "16384")
		ids = append(ids, fmt.Sprint(harness.SubmitTask(t, b, nil, w.Markers, args...)))
	}
	for _, id := range ids {
		if code, out := harness.ExitCode(t, b.TaskSubmit("wait", id)); code != 0 {
			t.Fatalf("task %s: exit %d: %s", id, code, out)
		}
	}
	runs := w.Runs(t)
	if len(runs) != 2 || !(runs[0].Start < runs[1].End && runs[1].Start < runs[0].End) {
		t.Errorf("two shares of 8G on 16G did not run at once: %+v", runs)
	}
	code, out := harness.ExitCode(t, b.TaskSubmit("show", ids[0]))
	if code != 0 || !strings.Contains(out, "memory: 8G declared (a share of each device)") {
		t.Errorf("show: exit %d:\n%s", code, out)
	}
}

// fakeSMI writes an npu-smi that prints, for `npu-smi info`, the process
// table of the real tool's layout with the rows the test puts in its
// file (set), and fails anything else (so `info -m` leaves the logical
// ids as they are).
type fakeSMI struct {
	t          testing.TB
	bin, table string
}

func newFakeSMI(t testing.TB) *fakeSMI {
	dir := harness.SharedDir(t)
	f := &fakeSMI{t: t, bin: filepath.Join(dir, "npu-smi"), table: filepath.Join(dir, "procs")}
	script := "#!/bin/sh\n[ \"$*\" = info ] || exit 1\n" +
		"echo '+---------------------------+---------------+----------------------------------------------------+'\n" +
		"echo '| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |'\n" +
		"echo '+===========================+===============+====================================================+'\n" +
		"cat " + f.table + "\n" +
		"echo '+===========================+===============+====================================================+'\n"
	if err := os.WriteFile(f.bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	f.set()
	return f
}

// set makes the table's rows: pid, MiB on npu 0, in pairs.
func (f *fakeSMI) set(pidMiB ...int) {
	var b strings.Builder
	for i := 0; i+1 < len(pidMiB); i += 2 {
		fmt.Fprintf(&b, "| 0       0                 | %-13d | python                   | %-23d |\n", pidMiB[i], pidMiB[i+1])
	}
	if b.Len() == 0 {
		b.WriteString("| No running processes found in NPU 0                                                            |\n")
	}
	tmp := f.table + ".new"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Rename(tmp, f.table); err != nil {
		f.t.Fatal(err)
	}
}

// TestShareOverDeclared: the broker joins what the vendor's tool shows
// each process using to the shares' holders: a share over its declaration
// is shown in status and logged; with over_declared = "term", its
// holders are sent SIGTERM.
func TestShareOverDeclared(t *testing.T) {
	for _, policy := range []string{"report", "term"} {
		t.Run(policy, func(t *testing.T) {
			smi := newFakeSMI(t)
			conf := fmt.Sprintf("[devices]\nvendor = \"fake\"\nids = \"0\"\nnpu_smi = %q\n[status]\nscan_interval = \"1s\"\n[share]\npools = \"all\"\ncapacity = \"16G\"\nmargin = \"0\"\nover_declared = %q\n", smi.bin, policy)
			b := harness.StartBroker(t, conf)
			h := harness.Hold(t, b, "holder", "--mem", "4G")
			pid := h.Cmd.Process.Pid // npurun became the holder's sh
			smi.set(pid, 6000)
			b.WaitLog(0, "uses 5.9G, over its declaration of 4G")
			if policy == "report" {
				if st := b.Status(t); !strings.Contains(st, "4G / 5.9G  over!") {
					t.Errorf("status does not show the share over its declaration:\n%s", st)
				}
				h.Release()
				return
			}
			if code, sig := h.Wait(); sig != syscall.SIGTERM {
				t.Fatalf("holder over its declaration with term: exit %d, signal %v; want SIGTERM", code, sig)
			}
		})
	}
}

// TestShareExternalUse: a process on a shared device that holds no lease
// counts against the device's room for shares with what the vendor's tool
// shows it using now: a share that does not fit beside its use waits, and
// is granted once it uses less, while it still runs (its peak does not
// keep shares off the device).
func TestShareExternalUse(t *testing.T) {
	smi := newFakeSMI(t)
	conf := fmt.Sprintf("[devices]\nvendor = \"fake\"\nids = \"0\"\nnpu_smi = %q\n[status]\nscan_interval = \"1s\"\n[share]\npools = \"all\"\ncapacity = \"16G\"\nmargin = \"0\"\n", smi.bin)
	b := harness.StartBroker(t, conf)
	outside := harness.StartProc(t, "outside", exec.Command("sh", "-c", "echo ready; read x; exit 0"))
	outside.WaitLine("ready")
	pid := outside.Cmd.Process.Pid
	smi.set(pid, 12*1024)
	b.WaitLog(0, fmt.Sprintf("npu 0: pid %d uses 12G of its memory without a lease", pid))
	code, out := harness.ExitCode(t, b.Npurun("--no-wait", "--mem", "8G", "true"))
	if code != 75 {
		t.Fatalf("8G beside 12G used outside any lease, on 16G: exit %d, %s; want 75 (no room)", code, out)
	}
	w := harness.NewWorkload(t)
	waiting := harness.Queue(t, b, "share", append([]string{"--mem", "8G"}, w.Args(b, "share", 0)...)...)
	// It frees most of it, and runs on: the share fits beside what it
	// uses now.
	smi.set(pid, 1024)
	waiting.MustSucceed()
	if outside.Exited() {
		t.Fatal("the outside process exited before the share was granted")
	}
	outside.Stdin.Close()
	outside.MustSucceed()
}

// TestShareRestart: a broker killed while shares are held finds them at
// its restart, from their lock files, with what they declared: a share
// that fits beside them is granted, one that does not waits until a held
// share ends, and the device is never over its capacity (the runs check).
func TestShareRestart(t *testing.T) {
	b := harness.StartBroker(t, harness.ShareConfig(1, "16G"))
	w := harness.NewWorkload(t)
	h := harness.Hold(t, b, "held", "--mem", "10G")
	b.FlushAccounting(t) // the record that names its holder, before the kill
	b.Kill()
	b.Start()
	b.WaitLog(0, "npu 0 holds a share of 10240 MiB from before this start")
	// The accounting log's record names its holder: status shows it so.
	board := b.Board(t)
	if sh := board.Devices[0].Shares; len(sh) != 1 || sh[0].Kind != "inline" || sh[0].User != harness.Me(t) || sh[0].Mem != 10240 || !sh[0].Adopted {
		t.Errorf("after the restart, status shows the shares %+v; want %s's inline share of 10240 MiB, adopted", sh, harness.Me(t))
	}
	fits := append([]string{"--mem", "6G"}, w.Args(b, "fits", 0)...)
	fits = append(fits, "-mem", "6144", "-capacity", "16384")
	if code, out := harness.ExitCode(t, b.Npurun(append([]string{"--no-wait"}, fits...)...)); code != 0 {
		t.Fatalf("6G beside a found share of 10G on 16G: exit %d, %s", code, out)
	}
	if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "--mem", "7G", "true")); code != 75 {
		t.Fatalf("7G beside a found share of 10G on 16G: exit %d, %s; want 75", code, out)
	}
	waiting := harness.Queue(t, b, "after", append([]string{"--mem", "7G"}, w.Args(b, "after", 0)...)...)
	h.Release()
	waiting.MustSucceed()
}

// TestShareDrained: a drained device takes no new share (its shares run
// on), and takes them again once undrained.
func TestShareDrained(t *testing.T) {
	harness.NeedRoot(t) // drain is root's
	b := harness.StartBroker(t, harness.ShareConfig(1, "16G"))
	h := harness.Hold(t, b, "held", "--mem", "4G")
	if code, _, errs := harness.DrainCmd(t, b, nil, "drain", "npu0", "--reason", "ECC"); code != 0 {
		t.Fatalf("drain: exit %d: %s", code, errs)
	}
	if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "--mem", "4G", "true")); code != 75 {
		t.Fatalf("a share of a drained device: exit %d, %s; want 75", code, out)
	}
	if code, _, errs := harness.DrainCmd(t, b, nil, "undrain", "npu0"); code != 0 {
		t.Fatalf("undrain: exit %d: %s", code, errs)
	}
	if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "--mem", "4G", "true")); code != 0 {
		t.Fatalf("a share once undrained: exit %d, %s", code, out)
	}
	h.Release()
}

// TestShareRestrictedUsers: two restricted accounts holding shares of one
// device each open its node while they hold a share, and only then: the
// end of one's share takes its entry away and leaves the other's, also
// when it ended while no broker ran.
func TestShareRestrictedUsers(t *testing.T) {
	dev := harness.NewDevTree(t, 1)
	alice, bob := harness.NewUser(t), harness.NewUser(t)
	b := harness.StartBroker(t, dev.Config("0", fmt.Sprintf("[restrict]\nusers = [%q, %q]\n[share]\npools = \"all\"\ncapacity = \"16G\"\nmargin = \"0\"\n", alice.Name, bob.Name)))
	node := dev.Node("davinci0")
	a := harness.LeaseAs(t, b, alice, "alice", "--mem", "4G")
	if !harness.CanOpen(t, alice, node) || harness.CanOpen(t, bob, node) {
		t.Fatalf("alice's share: alice opens it %v, bob %v; want true, false", harness.CanOpen(t, alice, node), harness.CanOpen(t, bob, node))
	}
	bb := harness.LeaseAs(t, b, bob, "bob", "--mem", "4G")
	if !harness.CanOpen(t, alice, node) || !harness.CanOpen(t, bob, node) {
		t.Fatalf("two shares: alice opens it %v, bob %v; want both", harness.CanOpen(t, alice, node), harness.CanOpen(t, bob, node))
	}
	// A broker's restart takes nobody's access from a share held, and
	// takes it from the user of a share that ended while no broker ran.
	b.FlushAccounting(t) // the records that name the shares' holders, before the kill
	b.Kill()
	a.Release()
	b.Start()
	if harness.CanOpen(t, alice, node) || !harness.CanOpen(t, bob, node) {
		t.Fatalf("after a restart, alice's share ended meanwhile: alice opens it %v, bob %v; want false, true", harness.CanOpen(t, alice, node), harness.CanOpen(t, bob, node))
	}
	if want := fmt.Sprintf("npu 0 holds shares: removed the ACL entries of uid %d, whose shares ended before this start", alice.UID); !strings.Contains(b.Log(), want) {
		t.Errorf("the broker's log does not say %q:\n%s", want, b.Log())
	}
	// 12G fits only once alice's share is gone.
	if code, out := harness.ExitCode(t, b.Npurun("--mem", "12G", "--timeout", "20s", "true")); code != 0 {
		t.Fatalf("12G after alice's share: exit %d, %s", code, out)
	}
	if harness.CanOpen(t, alice, node) || !harness.CanOpen(t, bob, node) {
		t.Fatalf("after alice's share: alice opens it %v, bob %v; want false, true", harness.CanOpen(t, alice, node), harness.CanOpen(t, bob, node))
	}
	bb.Release()
	harness.WaitFree(t, b, 0)
	if harness.CanOpen(t, bob, node) {
		t.Error("after bob's share bob still opens the node")
	}
}

// TestShareTaskPeak: at a task's end its share's peak, as the vendor's
// tool showed its processes, is recorded, and show says whether its
// declaration was too low.
func TestShareTaskPeak(t *testing.T) {
	smi := newFakeSMI(t)
	conf := fmt.Sprintf("[devices]\nvendor = \"fake\"\nids = \"0\"\nnpu_smi = %q\n[status]\nscan_interval = \"1s\"\n[share]\npools = \"all\"\ncapacity = \"16G\"\nmargin = \"0\"\n", smi.bin)
	b := harness.StartBroker(t, conf)
	dir := harness.SharedDir(t)
	pidFIFO, goFIFO := filepath.Join(dir, "pid"), filepath.Join(dir, "go")
	for _, f := range []string{pidFIFO, goFIFO} {
		if err := syscall.Mkfifo(f, 0o666); err != nil {
			t.Fatal(err)
		}
	}
	id := harness.SubmitTask(t, b, nil, dir, "--mem", "8G", "--", "sh", "-c", `echo $$ > "$1"; read x < "$2"`, "sh", pidFIFO, goFIFO)
	data, err := os.ReadFile(pidFIFO) // returns once the task has written its pid
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(data))
	var n int
	fmt.Sscan(pid, &n)
	smi.set(n, 10*1024)
	b.WaitLog(0, "uses 10G, over its declaration of 8G")
	if err := os.WriteFile(goFIFO, []byte("go\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	if code, out := harness.ExitCode(t, b.TaskSubmit("wait", fmt.Sprint(id))); code != 0 {
		t.Fatalf("wait: exit %d: %s", code, out)
	}
	if code, out := harness.ExitCode(t, b.TaskSubmit("show", fmt.Sprint(id))); code != 0 || !strings.Contains(out, "device memory peak: 10G of 8G declared: declared too low") {
		t.Fatalf("show: exit %d:\n%s", code, out)
	}
}

// TestShareOOMRetry: a task that fails with an out-of-memory message of
// the device's runtime in its log is submitted again (as a requeue is,
// from the task it retries), its declaration raised (1.25× of 8G: 10G, no
// peak being known), and the retry waits in the journal across a broker's
// restart until it fits; a failure of another kind uses no retry.
func TestShareOOMRetry(t *testing.T) {
	b := harness.StartBroker(t, harness.ShareConfig(1, "16G"))
	dir := harness.SharedDir(t)
	// 7G held: the first run's 8G fits, the retry's 10G does not yet.
	h := harness.Hold(t, b, "held", "--mem", "7G")
	script := `if [ -e ran ]; then echo "second run, $NPURUN_DEVICES"; exit 0; fi
touch ran; echo "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB" >&2; exit 1`
	id := harness.SubmitTask(t, b, nil, dir, "--mem", "8G", "--oom-retries", "1", "--", "sh", "-c", script)
	if code, out := harness.ExitCode(t, b.TaskSubmit("wait", fmt.Sprint(id))); code == 0 {
		t.Fatalf("the first run succeeded: %s", out)
	}
	if first := harness.ShowTask(t, b, id); first.State != "failed" || first.Reason != "out of device memory: retried with --mem 10G" {
		t.Fatalf("the first run: %s, %q; want failed, retried with --mem 10G", first.State, first.Reason)
	}
	said := fmt.Sprintf("task %d ran out of device memory: retried as task ", id)
	b.WaitLog(0, said)
	var retry uint64
	log := b.Log()
	if _, err := fmt.Sscanf(log[strings.Index(log, said)+len(said):], "%d with --mem 10G", &retry); err != nil {
		t.Fatalf("the broker's log does not name the retry: %v\n%s", err, log)
	}
	check := func(when string) {
		t.Helper()
		r := harness.ShowTask(t, b, retry)
		if r.State != "pending" || r.Mem != 10*1024 || r.RetryOf != id || r.From != id || r.OOMRetries != 0 {
			t.Fatalf("%s: retry %d is %s, mem %d, retry of %d, from %d, %d retries left; want pending, 10240, %d, %d, 0", when, retry, r.State, r.Mem, r.RetryOf, r.From, r.OOMRetries, id, id)
		}
	}
	check("before the restart")
	b.Kill()
	b.Start()
	check("after the restart")
	h.Release()
	if code, out := harness.ExitCode(t, b.TaskSubmit("wait", fmt.Sprint(retry))); code != 0 {
		t.Fatalf("the retry: exit %d: %s", code, out)
	}

	// Another failure: no retry.
	other := harness.SubmitTask(t, b, nil, dir, "--mem", "2G", "--oom-retries", "2", "--", "sh", "-c", `echo "ValueError: bad input" >&2; exit 1`)
	if code, _ := harness.ExitCode(t, b.TaskSubmit("wait", fmt.Sprint(other))); code == 0 {
		t.Fatal("the failing task succeeded")
	}
	if r := harness.ShowTask(t, b, other); strings.Contains(r.Reason, "retried") {
		t.Errorf("a failure not out of memory was retried: %q", r.Reason)
	}
	for _, ti := range harness.ListTasks(t, b, nil, true) {
		if ti.RetryOf == other {
			t.Errorf("task %d retries task %d, which did not run out of memory", ti.ID, other)
		}
	}
}

// TestShareAscendCapacity: without [share] capacity an Ascend device's
// memory is npu-smi info's HBM total (64 GiB here), less the margin (1G
// by default): 63G fits, 64G is refused at once.
func TestShareAscendCapacity(t *testing.T) {
	dev := harness.NewDevTree(t, 1)
	table, err := os.ReadFile(filepath.Join(harness.Root(), "npu", "testdata", "npu-smi-info-910b.txt"))
	if err != nil {
		t.Fatal(err)
	}
	// The sample's processes (4121, 5120) get pids that no process can
	// have (past the kernel's PID_MAX_LIMIT): outside use counts only
	// processes that exist, and a busy machine may well have a 4121.
	table = bytes.ReplaceAll(bytes.ReplaceAll(table, []byte("| 4121 "), []byte("| 4194305 ")), []byte("| 5120 "), []byte("| 4194306 "))
	info := filepath.Join(dev.Dir, "info.txt")
	if err := os.WriteFile(info, table, 0o644); err != nil {
		t.Fatal(err)
	}
	smi := filepath.Join(dev.Dir, "npu-smi")
	if err := os.WriteFile(smi, []byte("#!/bin/sh\n[ \"$*\" = info ] || exit 1\nexec cat "+info+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("[devices]\nvendor = \"ascend\"\nids = \"0\"\ndev_dir = %q\nnpu_smi = %q\n[share]\npools = \"all\"\n", dev.Dir, smi)
	b := harness.StartBroker(t, conf)
	if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "--mem", "63G", "true")); code != 0 {
		t.Fatalf("63G of a 64G device with a 1G margin: exit %d, %s", code, out)
	}
	code, out := harness.ExitCode(t, b.Npurun("--no-wait", "--mem", "64G", "true"))
	if code != 77 || !strings.Contains(out, "the largest share a device of pool \"default\" holds is 63G") {
		t.Fatalf("64G: exit %d, %s; want 77, 63G the largest", code, out)
	}
}

// TestShareRestartNotShared: a share held while the broker is killed
// goes on after a restart that shares its device no more ([share]
// removed from the configuration): its lock file is kept, no new share
// lands beside it, and the device is granted whole only once it has
// ended (TestShareCapacityUnknown: a device whose memory is unknown at
// the restart). The runs prove it themselves (the workload's markers: a
// whole run beside a share's is a DOUBLE GRANT).
func TestShareRestartNotShared(t *testing.T) {
	harness.NeedRoot(t) // the capacity case's device nodes
	shareRun := func(t *testing.T, b *harness.Broker, w harness.Workload, capacity int64) *harness.Proc {
		t.Helper()
		args := append([]string{"--mem", "5G"}, w.Args(b, "share", 0)...)
		p := harness.StartProc(t, "share", b.Npurun(append(args, "-mem", "5120", "-capacity", fmt.Sprint(capacity), "-wait-stdin")...))
		p.WaitLine("running share")
		return p
	}
	after := func(t *testing.T, b *harness.Broker, w harness.Workload, share *harness.Proc) {
		t.Helper()
		whole := append([]string{"-d", "0"}, w.Args(b, "whole", 0)...)
		if code, out := harness.ExitCode(t, b.Npurun(append([]string{"--no-wait"}, whole...)...)); code != 75 {
			t.Fatalf("the whole device beside a share held from before the restart: exit %d, %s; want 75 (in use)", code, out)
		}
		if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "--mem", "1G", "true")); code != 77 || !strings.Contains(out, "not shared") {
			t.Fatalf("a new share of a device shared no more: exit %d, %s; want 77, not shared", code, out)
		}
		waiting := harness.Queue(t, b, "whole", whole...)
		share.Stdin.Close()
		share.MustSucceed()
		waiting.MustSucceed()
		runs := w.Runs(t)
		if len(runs) != 2 || runs[0].Tag != "share" || runs[1].Tag != "whole" || runs[1].Start < runs[0].End {
			t.Fatalf("runs %+v; want the share's, then the whole device's after it", runs)
		}
	}

	t.Run("share removed", func(t *testing.T) {
		b := harness.StartBroker(t, harness.ShareConfig(1, "16G"))
		w := harness.NewWorkload(t)
		share := shareRun(t, b, w, 16*1024)
		b.Kill()
		if err := os.WriteFile(b.Conf, []byte(harness.FakeConfig(1)), 0o644); err != nil {
			t.Fatal(err)
		}
		b.Start()
		b.WaitLog(0, "npu 0 holds a share of 5120 MiB from before this start, and is not shared now")
		if sh := b.Board(t).Devices[0].Shares; len(sh) != 1 || sh[0].Mem != 5120 {
			t.Errorf("after the restart, status shows the shares %+v; want the share of 5120 MiB", sh)
		}
		after(t, b, w, share)
	})
}

// unknownSmi is an Ascend device tree of one device and its npu-smi,
// which fails ("dcmi busy") while the file fail exists and answers with
// a 910B's table (64G of HBM) otherwise; conf is a broker's
// configuration sharing it (the default margin: 63G for shares).
func unknownSmi(t *testing.T) (conf, fail string) {
	t.Helper()
	dev := harness.NewDevTree(t, 1)
	table, err := os.ReadFile(filepath.Join(harness.Root(), "npu", "testdata", "npu-smi-info-910b.txt"))
	if err != nil {
		t.Fatal(err)
	}
	info := filepath.Join(dev.Dir, "info.txt")
	fail = filepath.Join(dev.Dir, "fail")
	if err := os.WriteFile(info, table, 0o644); err != nil {
		t.Fatal(err)
	}
	smi := filepath.Join(dev.Dir, "npu-smi")
	script := fmt.Sprintf("#!/bin/sh\n[ \"$*\" = info ] || exit 1\nif [ -e %s ]; then echo 'dcmi busy' >&2; exit 1; fi\nexec cat %s\n", fail, info)
	if err := os.WriteFile(smi, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("[devices]\nvendor = \"ascend\"\nids = \"0\"\ndev_dir = %q\nnpu_smi = %q\n[share]\npools = \"all\"\n", dev.Dir, smi), fail
}

// TestShareCapacityUnknown: a shared device whose memory the vendor's
// tool cannot say when the broker starts (npu-smi failing) takes no share
// while it cannot: status says its memory is unknown, and why; a share
// request waits, its progress line saying so; a whole lease is granted as
// on any device. Once the tool answers, the broker, asking again, takes
// the device's shares as configured, without a restart: at the start,
// and at a restart that finds a share held. The runs prove the grants
// exclusive themselves (the workload's markers: a share beside a whole
// run is a DOUBLE GRANT, shares over 63G together are OVER CAPACITY).
func TestShareCapacityUnknown(t *testing.T) {
	harness.NeedRoot(t) // the device nodes
	const waits = "npu 0 takes no share until its memory is known (run "
	shareRun := func(t *testing.T, b *harness.Broker, w harness.Workload, tag string) []string {
		return append(append([]string{"--mem", "5G"}, w.Args(b, tag, 0)...), "-mem", "5120", "-capacity", fmt.Sprint(63*1024), "-wait-stdin")
	}
	unknownOnStatus := func(t *testing.T, b *harness.Broker) {
		t.Helper()
		if d := harness.Device(t, b.Board(t), 0); !strings.Contains(d.CapacityUnknown, "exit status 1: dcmi busy") || d.Capacity != 0 {
			t.Errorf("status --json, npu0: capacity %d, capacity_unknown %q; want 0, and the tool's failure", d.Capacity, d.CapacityUnknown)
		}
		if table := b.Status(t); !strings.Contains(table, "MEMORY UNKNOWN\n  npu0  no new share until the broker knows it: run ") || !strings.Contains(table, "dcmi busy") {
			t.Errorf("status does not say npu0's memory is unknown, and why:\n%s", table)
		}
	}
	known := func(t *testing.T, b *harness.Broker) {
		t.Helper()
		if d := harness.Device(t, b.Board(t), 0); d.CapacityUnknown != "" || d.Capacity != 63*1024 {
			t.Errorf("status --json, npu0, its memory known: capacity %d, capacity_unknown %q; want 63G", d.Capacity, d.CapacityUnknown)
		}
	}

	t.Run("at start", func(t *testing.T) {
		conf, fail := unknownSmi(t)
		if err := os.WriteFile(fail, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		b := harness.StartBroker(t, conf)
		w := harness.NewWorkload(t)
		whole := harness.StartProc(t, "whole", b.Npurun(append([]string{"-d", "0"}, append(w.Args(b, "whole", 0), "-wait-stdin")...)...))
		whole.WaitLine("running whole")
		s1 := harness.Queue(t, b, "s1", shareRun(t, b, w, "s1")...)
		s1.WaitLine(waits)
		unknownOnStatus(t, b)

		// The tool answers again; a share request asks it at once.
		if err := os.Remove(fail); err != nil {
			t.Fatal(err)
		}
		s2 := harness.Queue(t, b, "s2", shareRun(t, b, w, "s2")...)
		b.WaitLog(0, "npu 0: its memory is known now: it takes shares of 63G together")
		known(t, b)
		whole.Stdin.Close()
		whole.MustSucceed()
		s1.WaitLine("running s1")
		s2.WaitLine("running s2") // both at once, beside each other
		s1.Stdin.Close()
		s2.Stdin.Close()
		s1.MustSucceed()
		s2.MustSucceed()
		runs := w.Runs(t)
		if len(runs) != 3 || runs[0].Tag != "whole" || runs[1].Start < runs[0].End || runs[2].Start < runs[0].End {
			t.Fatalf("runs %+v; want the whole device's, then the two shares after it", runs)
		}
	})

	t.Run("at restart", func(t *testing.T) {
		conf, fail := unknownSmi(t)
		b := harness.StartBroker(t, conf)
		w := harness.NewWorkload(t)
		old := harness.StartProc(t, "old", b.Npurun(shareRun(t, b, w, "old")...))
		old.WaitLine("running old")
		b.Kill()
		if err := os.WriteFile(fail, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		b.Start()
		b.WaitLog(0, "npu 0 holds a share of 5120 MiB from before this start")
		unknownOnStatus(t, b)
		if sh := harness.Device(t, b.Board(t), 0).Shares; len(sh) != 1 || sh[0].Mem != 5120 {
			t.Errorf("after the restart, status shows the shares %+v; want the share of 5120 MiB", sh)
		}
		s2 := harness.Queue(t, b, "s2", shareRun(t, b, w, "s2")...)
		s2.WaitLine(waits)
		whole := harness.Queue(t, b, "whole", append([]string{"-d", "0"}, w.Args(b, "whole", 0)...)...)

		if err := os.Remove(fail); err != nil {
			t.Fatal(err)
		}
		b.WaitLog(0, "npu 0: its memory is known now: it takes shares of 63G together")
		s2.WaitLine("running s2") // beside the share from before the restart, with no restart
		known(t, b)
		old.Stdin.Close()
		s2.Stdin.Close()
		old.MustSucceed()
		s2.MustSucceed()
		whole.MustSucceed()
		runs := w.Runs(t)
		if len(runs) != 3 || runs[2].Tag != "whole" || runs[2].Start < runs[0].End || runs[2].Start < runs[1].End {
			t.Fatalf("runs %+v; want the two shares, then the whole device's after them", runs)
		}
	})
}
