package access

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// The ways a process could use a device node and not be reported (issue
// 14.11), each beside a control process that uses a node plainly and is
// reported in the same run: a node reached by another path (a bind mount
// in a user namespace), a node mapped and its descriptor closed, a use
// handed from process to process each younger than the grace window, and
// a control node used with no lease at all. A program's name exempts
// nothing (TestUnleasedUse).

// hideConfig is the configuration of these tests: a fake Ascend tree of
// n devices, a scan every second, a grace window of 3 s, extra appended.
func hideConfig(dev string, n int, extra string) string {
	return harness.AscendConfig(dev, n, "[status]\nscan_interval = \"1s\"\nunleased_grace = \"3s\"\n"+extra)
}

// unleasedOf returns the board's report of pid, if any.
func unleasedOf(b *wire.Board, pid int) (wire.Unleased, bool) {
	for _, u := range b.Unleased {
		if u.PID == pid {
			return u, true
		}
	}
	return wire.Unleased{}, false
}

// inGroup runs cmd in a process group of its own, killed whole when the
// test ends: for scripts that leave children behind.
func inGroup(t testing.TB, cmd *exec.Cmd) *exec.Cmd {
	t.Helper()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	t.Cleanup(func() {
		if cmd.Process != nil {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	})
	return cmd
}

// needUserNS checks that u may make a user and mount namespace of its own
// (unshare -Urm): the kernel or a security module may forbid it. Outside
// CI the test is skipped then, with the reason; in CI it fails.
func needUserNS(t *testing.T, u harness.TestUser, dir string) {
	t.Helper()
	out, err := u.As(exec.Command("unshare", "-Urm", "true"), dir).CombinedOutput()
	if err == nil {
		return
	}
	why := "user namespaces are not allowed to " + u.Name + " here (unshare -Urm: " + strings.TrimSpace(string(out)) + ", " + err.Error() + ")"
	if os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Skip(why)
}

// TestUnleasedBindMount: a node reached through a bind mount of the device
// directory, in a user and mount namespace of the process's own, is the
// same device: its use is reported, with the node as the broker knows it.
// (The scan used to look at descriptors whose link named a path under the
// device directory only.)
func TestUnleasedBindMount(t *testing.T) {
	alice := harness.NewUser(t)
	dev := harness.FakeDev(t, 2)
	b := harness.StartBroker(t, hideConfig(dev, 2, ""))
	needUserNS(t, alice, b.Dir)
	mnt := filepath.Join(harness.SharedDir(t), "d")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	w := harness.WatchBoards(t, b, nil)
	hidden := harness.StartProc(t, "bind mount", alice.As(exec.Command("unshare", "-Urm", "sh", "-c",
		`mount --bind "$1" "$2" && exec 8<"$2/davinci0" && echo "open $2/davinci0 $$" && exec sleep 600`, "sh", dev, mnt), b.Dir))
	pid := harness.PIDOf(t, hidden.WaitLine("open "+mnt+"/davinci0"))
	if target, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/8"); !strings.HasPrefix(target, mnt+"/") {
		t.Fatalf("descriptor 8 of the hidden process shows %q, want a path under the mount %s", target, mnt)
	}
	ctl := harness.StartProc(t, "control", alice.As(exec.Command(harness.Opener(t), dev+"/davinci1"), b.Dir))
	ctlPID := harness.OpenedPID(t, ctl, dev+"/davinci1")

	board, _ := w.Next("the bind-mounted use reported", func(bd *wire.Board) bool {
		_, ok := unleasedOf(bd, pid)
		return ok
	})
	u, _ := unleasedOf(board, pid)
	if u.Device != 0 || u.Node != dev+"/davinci0" || u.User != alice.Name || u.Mapped || u.Control {
		t.Errorf("report: %+v, want npu0's node %s, %s's, open", u, dev+"/davinci0", alice.Name)
	}
	w.Next("the control process reported", func(bd *wire.Board) bool { return slices.Contains(harness.UnleasedPIDs(bd, 1), ctlPID) })
}

// TestUnleasedMapped: a process that mapped a node and closed its
// descriptor (fuser shows "m") uses it still: reported, and said mapped.
func TestUnleasedMapped(t *testing.T) {
	alice := harness.NewUser(t)
	dev := harness.FakeDev(t, 2)
	b := harness.StartBroker(t, hideConfig(dev, 2, ""))
	w := harness.WatchBoards(t, b, nil)
	// davinci1 is of /dev/zero's kind: a private mapping keeps the node.
	mapper := harness.StartProc(t, "mapper", alice.As(exec.Command(b.Bin.Workload, "-mmap", dev+"/davinci1"), b.Dir))
	pid := harness.PIDOf(t, mapper.WaitLine("mapped"))
	ctl := harness.StartProc(t, "control", alice.As(exec.Command(harness.Opener(t), dev+"/davinci0"), b.Dir))
	ctlPID := harness.OpenedPID(t, ctl, dev+"/davinci0")

	board, _ := w.Next("the mapped use reported", func(bd *wire.Board) bool {
		_, ok := unleasedOf(bd, pid)
		return ok
	})
	if u, _ := unleasedOf(board, pid); u.Device != 1 || !u.Mapped || u.User != alice.Name {
		t.Errorf("report: %+v, want npu1, mapped, %s's", u, alice.Name)
	}
	if table := b.Status(t); !strings.Contains(harness.LineWithField(table, strconv.Itoa(pid)), dev+"/davinci1 mapped without a lease for") {
		t.Errorf("table:\n%s", table)
	}
	w.Next("the control process reported", func(bd *wire.Board) bool { return slices.Contains(harness.UnleasedPIDs(bd, 0), ctlPID) })
}

// TestUnleasedHopping: a node handed from process to process, each living
// about a second (a third of the grace window), is one account's use all
// along: reported once that use has gone on for the grace window. (The
// grace window used to be each process's own, and such a use was never
// reported.)
func TestUnleasedHopping(t *testing.T) {
	alice := harness.NewUser(t)
	dev := harness.FakeDev(t, 2)
	b := harness.StartBroker(t, hideConfig(dev, 2, ""))
	w := harness.WatchBoards(t, b, nil)
	// Each subshell holds the node (and its `sleep 1` does), starts the
	// next one, which inherits it, and exits.
	hop := harness.StartProc(t, "hopping", inGroup(t, alice.As(exec.Command("sh", "-c",
		`hop() { sleep 1; hop & exit 0; }; hop 8<"$1" & echo started; wait`, "sh", dev+"/davinci1"), b.Dir)))
	hop.WaitLine("started")
	start := time.Now()
	board, _ := w.Next("the hopping use reported", func(bd *wire.Board) bool {
		for _, u := range bd.Unleased {
			if u.User == alice.Name && u.Device == 1 {
				return true
			}
		}
		return false
	})
	for _, u := range board.Unleased {
		if u.User != alice.Name {
			continue
		}
		if at := time.UnixMilli(board.Time); at.Sub(time.UnixMilli(u.Since)) < 3*time.Second || at.Sub(start) < 3*time.Second {
			t.Errorf("reported at %s, %s after the use began (since %s), before the grace window", at, at.Sub(start), time.UnixMilli(u.Since))
		}
		if age := processAge(t, u.PID); age > 2500*time.Millisecond {
			t.Errorf("the reported process %d is %s old: not one of the short-lived hops", u.PID, age)
		}
	}
}

// processAge is how long ago process pid started, 0 if it is gone.
func processAge(t *testing.T, pid int) time.Duration {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	ticks, err := strconv.ParseInt(f[19], 10, 64) // starttime: field 22
	if err != nil {
		t.Fatal(err)
	}
	var info unix.Sysinfo_t
	if err := unix.Sysinfo(&info); err != nil {
		t.Fatal(err)
	}
	return time.Duration(info.Uptime)*time.Second - time.Duration(ticks)*time.Second/100
}

// TestUnleasedControlNode: a process with a control node open and no
// lease at all, neither its own nor an ancestor's, uses the devices
// without a lease: reported, as a control node's use. One whose parent
// holds a lease is not.
func TestUnleasedControlNode(t *testing.T) {
	alice := harness.NewUser(t)
	dev := harness.FakeDev(t, 2) // davinci_manager may be opened: it has /dev/random's number
	manager := dev + "/davinci_manager"
	b := harness.StartBroker(t, hideConfig(dev, 2, ""))
	w := harness.WatchBoards(t, b, nil)
	open := harness.Opener(t)
	leased := harness.StartProc(t, "leased", alice.As(b.Npurun("-d", "0", "sh", "-c", open+" "+manager+" & echo held; read x; kill $!; exit 0"), b.Dir))
	leased.WaitLine("held")
	covered := harness.OpenedPID(t, leased, manager)
	bare := harness.StartProc(t, "no lease", alice.As(exec.Command(open, manager), b.Dir))
	pid := harness.OpenedPID(t, bare, manager)

	board, before := w.Next("the control node's use reported", func(bd *wire.Board) bool {
		_, ok := unleasedOf(bd, pid)
		return ok
	})
	if u, _ := unleasedOf(board, pid); !u.Control || u.Device != -1 || u.Name != "" || u.Node != manager || u.User != alice.Name {
		t.Errorf("report: %+v, want the control node %s, %s's", u, manager, alice.Name)
	}
	after, more := w.Next("a later scan", func(bd *wire.Board) bool { return bd.Scan.Last > board.Scan.Last })
	for _, bd := range append(append(before, more...), board, after) {
		if _, ok := unleasedOf(bd, covered); ok {
			t.Fatalf("pid %d, whose parent holds a lease, was reported: %+v", covered, bd.Unleased)
		}
	}
	if table := b.Status(t); !strings.Contains(harness.LineWithField(table, strconv.Itoa(pid)), manager+" open without a lease for") ||
		!strings.Contains(harness.LineWithField(table, strconv.Itoa(pid)), "control node") {
		t.Errorf("table:\n%s", table)
	}
	leased.Stdin.Close()
	leased.MustSucceed()
}

// TestUnleasedSharedNumbers: nodes that share a device number (fake nodes
// made with one `mknod … c 1 7` each) cannot be told apart: the broker
// says so at start and does not watch them, rather than report the use of
// one as the other's; a node with a number of its own is watched as ever.
func TestUnleasedSharedNumbers(t *testing.T) {
	alice := harness.NewUser(t)
	dev := harness.MkNodes(t, map[string]uint64{"davinci0": unix.Mkdev(1, 7), "davinci1": unix.Mkdev(1, 7), "davinci2": unix.Mkdev(1, 5)})
	b := harness.StartBroker(t, hideConfig(dev, 3, ""))
	want := dev + "/davinci0, " + dev + "/davinci1 share device number 1:7"
	if !strings.Contains(b.Log(), want) {
		t.Errorf("the broker's start log does not say %q:\n%s", want, b.Log())
	}
	w := harness.WatchBoards(t, b, nil)
	open := harness.Opener(t)
	shared := harness.StartProc(t, "shared", alice.As(exec.Command(open, dev+"/davinci0"), b.Dir))
	sharedPID := harness.OpenedPID(t, shared, dev+"/davinci0")
	own := harness.StartProc(t, "own", alice.As(exec.Command(open, dev+"/davinci2"), b.Dir))
	ownPID := harness.OpenedPID(t, own, dev+"/davinci2")

	board, before := w.Next("npu2's use reported", func(bd *wire.Board) bool { return slices.Contains(harness.UnleasedPIDs(bd, 2), ownPID) })
	after, more := w.Next("a later scan", func(bd *wire.Board) bool { return bd.Scan.Last > board.Scan.Last })
	for _, bd := range append(append(before, more...), board, after) {
		if u, ok := unleasedOf(bd, sharedPID); ok {
			t.Fatalf("the use of a node whose number another shares was reported, as npu %d's: %+v", u.Device, u)
		}
	}
}

// TestUnleasedBecameRoot: a restricted account's process that opened a
// node and then became root through a set-user-ID program is root's
// process: not signalled, though its use was first seen as the account's
// (issue 14.14). Another process of the account, left as it is, is killed
// in the same run.
func TestUnleasedBecameRoot(t *testing.T) {
	alice := harness.NewUser(t)
	dev := harness.FakeDev(t, 2)
	b := harness.StartBroker(t, hideConfig(dev, 2, "unleased_use = \"kill\"\n[restrict]\nusers = [\""+alice.Name+"\"]\n"))
	// A set-user-ID copy of the workload, owned by root, that only alice
	// may run (mode 4750, her group).
	dir := harness.SharedDir(t)
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Flags&unix.ST_NOSUID != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is mounted nosuid: no set-user-ID program can run there", dir)
		}
		t.Skipf("%s is mounted nosuid: no set-user-ID program can run there", dir)
	}
	suid := filepath.Join(dir, "become-root")
	harness.CopyFile(t, b.Bin.Workload, suid, 0o750)
	if err := os.Chown(suid, 0, int(alice.GID)); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(suid, 0o4750); err != nil { // os.Chmod would want os.ModeSetuid

		t.Fatal(err)
	}
	w := harness.WatchBoards(t, b, nil)
	p := harness.StartProc(t, "becomes root", alice.As(exec.Command("sh", "-c", `exec 8<"$1"; echo "open $$"; read x; exec "$2" -become-root`, "sh", dev+"/davinci0", suid), b.Dir))
	opened := time.Now()
	pid := harness.PIDOf(t, p.WaitLine("open"))
	// Once a scan has seen it as alice's, it becomes root.
	w.Next("a scan after alice's process opened npu0", func(bd *wire.Board) bool { return time.UnixMilli(bd.Scan.Last).After(opened) })
	p.Stdin.Write([]byte("go\n"))
	if got := harness.PIDOf(t, p.WaitLine("root")); got != pid {
		t.Fatalf("pid %d became root, want %d", got, pid)
	}
	if st := procStatus(t, pid, "Uid:"); st != "0\t0\t0\t0" {
		t.Fatalf("pid %d has uids %q, want root's", pid, st)
	}
	ctl := harness.StartProc(t, "control", alice.As(exec.Command(harness.Opener(t), dev+"/davinci1"), b.Dir))
	harness.OpenedPID(t, ctl, dev+"/davinci1")
	if _, sig := ctl.Wait(); sig != syscall.SIGKILL {
		t.Fatalf("alice's control process ended by signal %v, want SIGKILL", sig)
	}
	killed := time.Now()
	w.Next("two scans after the control process was killed", func(bd *wire.Board) bool {
		return time.UnixMilli(bd.Scan.Last).After(killed.Add(time.Second))
	})
	if p.Exited() {
		t.Fatalf("the process that became root was killed; broker log:\n%s", b.Log())
	}
	if strings.Contains(b.Log(), "pid "+strconv.Itoa(pid)+" ") && strings.Contains(harness.LineWith(b.Log(), "pid "+strconv.Itoa(pid)+" "), "SIGKILL") {
		t.Errorf("the broker meant to kill pid %d:\n%s", pid, b.Log())
	}
}

// procStatus returns the value of a line of /proc/PID/status.
func procStatus(t *testing.T, pid int, key string) string {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestUnleasedManyDescriptors: one user's processes with over a million
// descriptors (copies of one) do not delay the finding of another user's
// use: a scan does a bounded share of one user's work and goes on with it
// the next time (issue 14.15). Reading them all made a scan take seconds,
// and the pacing put the next one minutes later. The time to report a
// use is measured before the descriptors are there (carol's) and with
// them (bob's), on one broker: bob's may take longer, as the machine's
// load varies, but not the scan of a million descriptors longer.
func TestUnleasedManyDescriptors(t *testing.T) {
	alice, bob, carol := harness.NewUser(t), harness.NewUser(t), harness.NewUser(t)
	dev := harness.FakeDev(t, 2)
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	per := min(16000, int(lim.Max)-200)
	if per < 1000 {
		t.Fatalf("the descriptor limit is %d: too few for this test", lim.Max)
	}
	const total = 1600000
	b := harness.StartBroker(t, hideConfig(dev, 2, ""))
	w := harness.WatchBoards(t, b, nil)
	reported := func(u harness.TestUser, node string, limit time.Duration) time.Duration {
		t.Helper()
		opened := time.Now()
		p := harness.StartProc(t, u.Name, u.As(exec.Command(harness.Opener(t), node), b.Dir))
		pid := harness.OpenedPID(t, p, node)
		board, _ := w.NextWithin(limit, u.Name+"'s use reported", func(bd *wire.Board) bool {
			_, ok := unleasedOf(bd, pid)
			return ok
		})
		took := time.UnixMilli(board.Time).Sub(opened)
		t.Logf("%s's use reported %s after it began (grace 3s); the last scan took %.1f ms over %d processes",
			u.Name, took.Round(time.Millisecond), board.Scan.TookMS, board.Scan.Procs)
		return took
	}
	baseline := reported(carol, dev+"/davinci1", 2*time.Minute)
	for i := range (total + per - 1) / per {
		// Its standard input is /dev/null, not StartProc's pipe: the
		// pipe would keep it waiting for a reader.
		cmd := alice.As(exec.Command("sh", "-c", `exec "$1" -dups "$2" </dev/null`, "sh", b.Bin.Workload, strconv.Itoa(per)), b.Dir)
		p := harness.StartProc(t, "dups"+strconv.Itoa(i), cmd)
		p.WaitLine("duped")
	}
	// Before the fix this took minutes, a scan of 1.6 million descriptors
	// 60 times over: the wait fails at the limit.
	limit := 3*baseline + 30*time.Second
	t.Logf("with %d descriptors of %s's, %s's use must be reported within %s (3 times %s's, and 30 s)", total, alice.Name, bob.Name, limit, carol.Name)
	reported(bob, dev+"/davinci0", limit)
}

// TestUnleasedExemptRetiredWarns: a configuration written for a broker
// that exempted programs by name still starts, and both check-config and
// the broker's start say that unleased_exempt is no longer read, where it
// is: its meaning does not change silently.
func TestUnleasedExemptRetiredWarns(t *testing.T) {
	conf := harness.FakeConfig(1) + "[status]\nunleased_exempt = [\"npu-smi\"]\n"
	b := harness.StartBroker(t, conf)
	want := "npurun.conf:5: [status] unleased_exempt: warning: no longer read"
	if !strings.Contains(b.Log(), want) {
		t.Errorf("the broker's start log lacks %q:\n%s", want, b.Log())
	}
	code, out := harness.ExitCode(t, exec.Command(b.Bin.Broker, "check-config", b.Conf))
	if code != 0 || !strings.Contains(out, want) || !strings.Contains(out, "unleased_exempt_users") {
		t.Errorf("check-config: exit %d\n%s\nwant 0 and %q, naming unleased_exempt_users", code, out, want)
	}
}
