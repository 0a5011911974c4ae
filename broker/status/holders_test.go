package status

import (
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/internal/fileid"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
)

// manyHolders is a lease of device 0 held by n processes: n/2 roots, each
// with one child that inherited the descriptor.
func manyHolders(n int) *entry {
	uid := uint32(os.Getuid())
	hs := make([]*procscan.Proc, 0, n)
	for i := range n / 2 {
		root := 100000 + 2*i
		hs = append(hs, &procscan.Proc{PID: root, PPID: 1, UID: uid, Start: uint64(root), Started: time.Now(), Comm: "torchrun", Cmdline: []string{"torchrun", "train.py"}},
			&procscan.Proc{PID: root + 1, PPID: root, UID: uid, Start: uint64(root + 1), Started: time.Now(), Comm: "python", Cmdline: []string{"python", "worker.py"}})
	}
	l := newEntry(&lease.Lease{Holder: lease.Holder{UID: uid, User: "bench"}, Devices: []int{0}, Files: []fileid.ID{{Dev: 1, Ino: 1}}})
	l.holders = map[int][]*procscan.Proc{0: hs}
	return l
}

// BenchmarkHoldersInfo: the board's view of a device with 20,000 holder
// processes, made under the ledger's lock for every status.
func BenchmarkHoldersInfo(b *testing.B) {
	l := manyHolders(20000)
	show := func(uint32) bool { return true }
	if hs, more := holdersInfo(l, 0, show); len(hs) != maxHolders || more != 20000-maxHolders || hs[0].PPID != 1 {
		b.Fatalf("%d holders shown, %d more, first %+v", len(hs), more, hs[0])
	}
	for b.Loop() {
		holdersInfo(l, 0, show)
	}
}

// BenchmarkSetHolders: taking a look's 20,000 holders of one device into
// its lease, under the ledger's lock after every scan.
func BenchmarkSetHolders(b *testing.B) {
	g := testLedger(&npu.Inventory{Vendor: npu.Fake, IDs: []int{0}}, &policy.Config{})
	l := manyHolders(20000)
	found := l.holders
	for b.Loop() {
		g.setHoldersLocked(l, map[int][]*procscan.Proc{0: slices.Clone(found[0])}, time.Now(), nil)
	}
}

// testLedger is a ledger of inv and cfg with nothing started: no
// accounting log, no scan, no table and no tasks (a test sets those it
// needs), logging nowhere.
func testLedger(inv *npu.Inventory, cfg *policy.Config) *Ledger {
	g := &Ledger{inv: inv, log: log.New(io.Discard, "", 0), nodes: map[uint64]npu.Node{},
		leases: map[int]*entry{}, shares: map[int][]*entry{}, early: map[*lease.Lease][]ended{}, seen: map[useKey]*use{}, streaks: map[streakKey]*streak{},
		logLimit: logLimit{}, sums: usageSums{}, kick: make(chan struct{}, 1)}
	g.cfg.Store(cfg)
	return g
}

// holdingTree starts a shell with file at descriptor 3 that starts n
// sleeps, which inherit it, and returns the shell once every one of them
// has closed its copy of the pipe it reports on (the shell after saying
// "ready"): by then each holds the file.
func holdingTree(t *testing.T, file *os.File, n int) *exec.Cmd {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := exec.Command("sh", "-c", `i=0; while [ $i -lt `+strconv.Itoa(n)+` ]; do sleep 600 4>&- & i=$((i+1)); done; echo ready >&4; exec 4>&-; wait`)
	cmd.ExtraFiles = []*os.File{file, w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() {
		unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
		cmd.Wait()
	})
	out, err := io.ReadAll(r) // to EOF: every writer has closed it
	if err != nil || string(out) != "ready\n" {
		t.Fatalf("the shell said %q (%v), want ready", out, err)
	}
	return cmd
}

// killAwait kills pid and returns once it has exited (its descriptors
// closed), told by its pidfd.
func killAwait(t *testing.T, pid int) {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		t.Fatal(err)
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 20000)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n != 1 {
			t.Fatalf("pid %d did not exit: %v", pid, err)
		}
		return
	}
}

func holderPIDs(l *entry, id int) []int {
	var out []int
	for _, h := range l.holders[id] {
		out = append(out, h.PID)
	}
	slices.Sort(out)
	return out
}

// TestCutLookKeepsHolders: a look between full scans that stops at its
// limit (maxTree processes) keeps the holders the last full scan found
// and it did not reach, where it used to drop them from the board; a
// holder it did reach and found gone is dropped.
func TestCutLookKeepsHolders(t *testing.T) {
	const n = maxTree + 44
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "npu0.lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fid, err := fileid.Of(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	sh := holdingTree(t, f, n)
	scanner, err := procscan.New("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	scanner.UserBudget = 1 << 30 // a full scan reads the n holders at once (and other tests' processes, root's too)
	g := testLedger(&npu.Inventory{Vendor: npu.Fake, IDs: []int{0}}, &policy.Config{})
	l := newEntry(&lease.Lease{Holder: lease.Holder{Kind: lease.Inline, UID: uint32(os.Getuid()), User: "u", PID: sh.Process.Pid},
		Devices: []int{0}, Files: []fileid.ID{fid}, Since: time.Now()})
	g.leases = map[int]*entry{0: l}
	g.scanner = scanner
	g.mu.Lock()
	targets := g.scanSetLocked()
	g.unlock()

	fullScan := func() {
		t.Helper()
		res, err := scanner.Scan(targets.Targets)
		if err != nil {
			t.Fatal(err)
		}
		g.mu.Lock()
		g.holdersFromScanLocked(res, targets, nil)
		g.unlock()
	}
	look := func() []int {
		t.Helper()
		g.mu.Lock()
		g.refreshed = time.Time{} // not the look of a moment ago
		g.unlock()
		g.Refresh()
		g.mu.Lock()
		defer g.unlock()
		return holderPIDs(l, 0)
	}

	fullScan()
	all := holderPIDs(l, 0)
	if len(all) != n+1 || !slices.Contains(all, sh.Process.Pid) {
		t.Fatalf("the full scan found %d holders, want the shell and %d sleeps", len(all), n)
	}
	if r := scanner.Tree(append([]int{sh.Process.Pid}, all...), targets.Targets, maxTree); !r.Cut {
		t.Fatalf("a look at %d holders was not cut at %d", len(all), maxTree)
	}
	if got := look(); !slices.Equal(got, all) {
		t.Fatalf("after a cut look: %d holders, want the %d of the full scan", len(got), len(all))
	}
	g.mu.Lock()
	shown, more := holdersInfo(l, 0, func(uint32) bool { return false })
	g.unlock()
	if len(shown)+more != n+1 || shown[0].PID != sh.Process.Pid {
		t.Errorf("board: %d holders and %d more, first %d; want %d, the shell first", len(shown), more, shown[0].PID, n+1)
	}

	// The first sleep is among the holders a look reaches (the shell,
	// then the last holders in pid order): gone, it is dropped.
	first := all[0]
	if first == sh.Process.Pid {
		first = all[1]
	}
	killAwait(t, first)
	if got := look(); len(got) != n || slices.Contains(got, first) {
		t.Errorf("after pid %d exited: %d holders (it among them: %v), want %d", first, len(got), slices.Contains(got, first), n)
	}
}

// BenchmarkUnleased: judging a scan in which the 20,000 holders of a
// lease also have its device node open (as they do), under the ledger's
// lock after every scan.
func BenchmarkUnleased(b *testing.B) {
	l := manyHolders(20000)
	g := testLedger(&npu.Inventory{Vendor: npu.Fake, IDs: []int{0}}, &policy.Config{})
	g.leases = map[int]*entry{0: l}
	g.nodes = map[uint64]npu.Node{7: {Path: "/dev/davinci0", Device: 0, Number: 7}}
	res := &procscan.Result{At: time.Now(), Files: map[fileid.ID][]int{}, Nodes: map[uint64][]int{}, Info: map[int]*procscan.Proc{}}
	ancestors := map[int][]int{}
	for _, h := range l.holders[0] {
		res.Files[l.files[0]] = append(res.Files[l.files[0]], h.PID)
		res.Nodes[7] = append(res.Nodes[7], h.PID)
		res.Info[h.PID] = h
		ancestors[h.PID] = []int{h.PPID}
	}
	targets := g.scanSetLocked()
	for b.Loop() {
		if acts := g.unleasedLocked(res, targets, &judgement{ancestors: ancestors}); len(acts) != 0 || len(g.seen) != 0 {
			b.Fatalf("holders taken for unleased use: %d", len(g.seen))
		}
	}
}

// TestUnleasedAcrossSlowScans: an account's use seen by two scans further
// apart than the grace window (a busy machine's pacing) has gone on from
// the first: reported at the second. It used to count as a new use at
// each scan, and was never reported.
func TestUnleasedAcrossSlowScans(t *testing.T) {
	g := testLedger(&npu.Inventory{Vendor: npu.Ascend, IDs: []int{0}},
		&policy.Config{Status: policy.Status{UnleasedGrace: 3 * time.Second, UnleasedUse: policy.UnleasedReport}})
	g.nodes = map[uint64]npu.Node{7: {Path: "/dev/davinci0", Device: 0, Number: 7}}
	targets := g.scanSetLocked()
	p := &procscan.Proc{PID: 100, PPID: 1, UID: 1000, Start: 5, Cmdline: []string{"python", "x.py"}}
	t0 := time.Now()
	for i, at := range []time.Time{t0, t0.Add(5 * time.Second)} {
		res := &procscan.Result{At: at, Files: map[fileid.ID][]int{}, Nodes: map[uint64][]int{7: {100}}, Info: map[int]*procscan.Proc{100: p}}
		g.unleasedLocked(res, targets, &judgement{ancestors: map[int][]int{}, names: map[uint32]string{1000: "alice"}})
		if got, want := len(g.reported), i; got != want {
			t.Fatalf("scan %d, %s after the first: %d reported, want %d", i+1, at.Sub(t0), got, want)
		}
	}
	if u := g.reported[0]; u.pid != 100 || u.dev != 0 || !u.since.Equal(t0) {
		t.Errorf("report: %+v, want pid 100 on npu 0 since the first scan", u)
	}
}

// TestCommandLineWholeRunes: a command line cut for the board ends with
// a whole character, then "…".
func TestCommandLineWholeRunes(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"short", []string{"python", "train.py"}, "python train.py"},
		{"ascii", []string{strings.Repeat("a", maxCommand+10)}, strings.Repeat("a", maxCommand) + "…"},
		{"euro", []string{"xx" + strings.Repeat("€", maxCommand)}, "xx" + strings.Repeat("€", (maxCommand-2)/3) + "…"},
		{"kernel", nil, "[kworker]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := CommandLine(&procscan.Proc{Comm: "kworker", Cmdline: tc.args})
			if got != tc.want || !utf8.ValidString(got) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestScanJudgesOnlyLeasesHeldThroughout: a lease let go of while /proc
// is read, and a later lease on a file with the same identity (its inode
// number given out again), hold a process the scan finds under that
// identity: it is not taken for the later lease's holder, which was
// granted after the scan began (the next scan judges it). The identity
// alone once decided, and the ender's sweep signalled another lease's
// holder so (leaseend's TestSweepLeaseEndedMeanwhile).
func TestScanJudgesOnlyLeasesHeldThroughout(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "lock")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fid, err := fileid.Of(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	scanner, err := procscan.New("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	scanner.UserBudget = 1 << 30
	sleep := exec.Command("sleep", "60")
	sleep.ExtraFiles = []*os.File{f}
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleep.Process.Kill(); sleep.Wait() }()
	pid := sleep.Process.Pid
	g := testLedger(&npu.Inventory{Vendor: npu.Fake, IDs: []int{0}}, &policy.Config{})
	g.scanner = scanner
	holder := lease.Holder{Kind: lease.Inline, UID: uint32(os.Getuid()), User: "u", PID: pid}
	before := newEntry(&lease.Lease{Holder: holder, Devices: []int{0}, Files: []fileid.ID{fid}, Since: time.Now()})
	g.leases = map[int]*entry{0: before}
	g.mu.Lock()
	set := g.scanSetLocked()
	// Meanwhile: the lease let go of, a later one on a file of the same
	// identity (here the very file: what the scan finds is the same).
	later := newEntry(&lease.Lease{Holder: holder, Devices: []int{0}, Files: []fileid.ID{fid}, Since: time.Now()})
	g.leases = map[int]*entry{0: later}
	g.unlock()
	res, err := scanner.Scan(set.Targets)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(res.Files[fid], pid) {
		t.Fatalf("the scan did not find pid %d holding the file: %v", pid, res.Files)
	}
	g.mu.Lock()
	g.holdersFromScanLocked(res, set, nil)
	got := holderPIDs(later, 0)
	g.unlock()
	if len(got) != 0 {
		t.Errorf("the later lease's holders, from a scan begun before its grant: %v; want none yet", got)
	}
}
