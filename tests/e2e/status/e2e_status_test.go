package status

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// TestStatusHolders: status lists each lease's holders as /proc shows
// them: the process granted it and a child that inherited the lock; a
// process the descriptor was passed to over a Unix socket, once the
// granted one is gone; the child of a holder that forked and exited.
func TestStatusHolders(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(4)+"[status]\nscan_interval = \"1s\"\n")
	user := harness.Me(t)

	// npu0: a holder and a child that inherited the lock.
	p0 := harness.StartProc(t, "npu0", b.Npurun("-d", "0", "sh", "-c", `sleep 600 & echo "child $!"; echo held; read x; kill $!`))
	child := harness.PIDOf(t, p0.WaitLine("child"))
	p0.WaitLine("held")
	board := b.Board(t)
	d := harness.Device(t, board, 0)
	if d.State != wire.DeviceLeased || d.Lease == nil || d.Lease.Kind != wire.KindInline || d.Lease.User != user || d.Lease.PID != p0.Cmd.Process.Pid {
		t.Fatalf("npu0: %+v (lease %+v), want leased inline to %s, pid %d", d, d.Lease, user, p0.Cmd.Process.Pid)
	}
	if got, want := harness.HolderPIDs(board, 0), []int{p0.Cmd.Process.Pid, child}; !slices.Equal(got, sorted(want)) {
		t.Fatalf("npu0 holders %v, want %v", got, sorted(want))
	}
	if h := harness.HolderOf(t, board, 0, p0.Cmd.Process.Pid); h.User != user || !strings.HasPrefix(h.Command, "sh -c sleep 600 &") || h.PPID != os.Getpid() {
		t.Errorf("npu0 holder: %+v", h)
	}
	if h := harness.HolderOf(t, board, 0, child); h.User != user || h.Command != "sleep 600" || h.PPID != p0.Cmd.Process.Pid {
		t.Errorf("npu0 child: %+v", h)
	}
	if d.Lease.Holders[0].PID != p0.Cmd.Process.Pid {
		t.Errorf("npu0: the root holder %d is not listed first: %+v", p0.Cmd.Process.Pid, d.Lease.Holders)
	}
	for _, id := range []int{1, 2, 3} {
		if d := harness.Device(t, board, id); d.State != wire.DeviceFree || d.Lease != nil {
			t.Errorf("npu%d: %+v, want free", id, d)
		}
	}
	table := b.Status(t)
	line := harness.LineWith(table, "npu0 ")
	for _, want := range []string{"leased", user, strconv.Itoa(p0.Cmd.Process.Pid), "sh -c sleep 600", "(+1)"} {
		if !strings.Contains(line, want) {
			t.Errorf("table line of npu0 lacks %q:\n%s", want, table)
		}
	}

	// npu1: the descriptor passed on to a process outside the tree.
	w := harness.WatchBoards(t, b, nil)
	sock := filepath.Join(b.Dir, "pass.sock")
	recv := harness.StartProc(t, "receiver", exec.Command(b.Bin.Workload, "-receive", sock))
	recv.WaitLine("listening")
	pass := harness.StartProc(t, "passer", b.Npurun("-d", "1", b.Bin.Workload, "-pass", sock))
	recv.WaitLine("received")
	pass.MustSucceed()
	board, _ = w.NextWithin(harness.ScanTimeout, "the receiver holding npu1", func(bd *wire.Board) bool {
		return slices.Equal(harness.HolderPIDs(bd, 1), []int{recv.Cmd.Process.Pid})
	})
	if d := harness.Device(t, board, 1); d.State != wire.DeviceLeased || d.Lease.PID != pass.Cmd.Process.Pid {
		t.Errorf("npu1: %+v, want leased, granted to pid %d", d, pass.Cmd.Process.Pid)
	}
	if h := harness.HolderOf(t, board, 1, recv.Cmd.Process.Pid); !strings.Contains(h.Command, "-receive") || h.User != user {
		t.Errorf("npu1 holder: %+v", h)
	}
	if want := "pid " + strconv.Itoa(pass.Cmd.Process.Pid) + ", granted the lease of " + user + ", holds it no more"; !strings.Contains(b.Log(), want) {
		t.Errorf("the broker did not log that /proc disagrees with its record (%q):\n%s", want, b.Log())
	}

	// npu2: a holder forks and exits; its child holds the lease on.
	p2 := harness.StartProc(t, "npu2", b.Npurun("-d", "2", "sh", "-c", `sleep 600 & echo "child $!"`))
	orphan := harness.PIDOf(t, p2.WaitLine("child"))
	t.Cleanup(func() { syscall.Kill(orphan, syscall.SIGKILL) })
	p2.MustSucceed()
	board, _ = w.NextWithin(harness.ScanTimeout, "the orphan holding npu2", func(bd *wire.Board) bool {
		return slices.Equal(harness.HolderPIDs(bd, 2), []int{orphan})
	})
	if h := harness.HolderOf(t, board, 2, orphan); h.Command != "sleep 600" {
		t.Errorf("npu2 holder: %+v", h)
	}

	// Releases show at once.
	recv.Stdin.Close()
	recv.MustSucceed()
	w.Next("npu1 free", func(bd *wire.Board) bool { return harness.Device(t, bd, 1).State == wire.DeviceFree })
	syscall.Kill(orphan, syscall.SIGKILL)
	w.Next("npu2 free", func(bd *wire.Board) bool { return harness.Device(t, bd, 2).State == wire.DeviceFree })
	p0.Stdin.Close()
	p0.MustSucceed()
}

func sorted(s []int) []int {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestStatusUsers: holders show with their own users, a descriptor passed
// to another user's process is logged, and show_commands = "own" hides
// other users' command lines from everyone but root and their owners.
func TestStatusUsers(t *testing.T) {
	alice, bob := harness.NewUser(t), harness.NewUser(t)
	b := harness.StartBroker(t, harness.FakeConfig(2)+"[status]\nscan_interval = \"1s\"\nshow_commands = \"own\"\n")
	pa := harness.StartProc(t, "alice", alice.As(b.Npurun("-d", "0", "sh", "-c", "echo held; read x; exit 0"), b.Dir))
	pa.WaitLine("held")
	socks := filepath.Join(b.Dir, "socks")
	if err := os.Mkdir(socks, 0o777); err != nil || os.Chmod(socks, 0o777) != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(socks, "bob.sock")
	recv := harness.StartProc(t, "bob", bob.As(exec.Command(b.Bin.Workload, "-receive", sock), b.Dir))
	recv.WaitLine("listening")
	pass := harness.StartProc(t, "alice passes", alice.As(b.Npurun("-d", "1", b.Bin.Workload, "-pass", sock), b.Dir))
	recv.WaitLine("received")
	pass.MustSucceed()

	w := harness.WatchBoards(t, b, nil)
	board, _ := w.Next("bob holding npu1", func(bd *wire.Board) bool {
		return slices.Equal(harness.HolderPIDs(bd, 1), []int{recv.Cmd.Process.Pid})
	})
	if d := harness.Device(t, board, 1); d.Lease.User != alice.Name || d.Lease.UID != alice.UID {
		t.Errorf("npu1 lease: %+v, want granted to %s", d.Lease, alice.Name)
	}
	if h := harness.HolderOf(t, board, 1, recv.Cmd.Process.Pid); h.User != bob.Name || h.UID != bob.UID || h.Command == "" {
		t.Errorf("npu1 holder as root sees it: %+v, want %s with a command", h, bob.Name)
	}
	if h := harness.HolderOf(t, board, 0, pa.Cmd.Process.Pid); h.User != alice.Name || h.Command != "sh -c echo held; read x; exit 0" {
		t.Errorf("npu0 holder: %+v", h)
	}
	// The broker logs it just after the look that found bob: await it.
	b.WaitLog(0, "the lease of "+alice.Name+" is held by pid "+strconv.Itoa(recv.Cmd.Process.Pid)+" of "+bob.Name)
	// The table's USER is the lease's, as --json's user (issue 27.23);
	// the holder that /proc shows, another account's, is named too.
	if row := harness.LineWith(b.Status(t), "npu1 "); !regexp.MustCompile(`leased +` + alice.Name + ` +` + strconv.Itoa(recv.Cmd.Process.Pid) + ` .*\(held by ` + bob.Name + `\)`).MatchString(row) {
		t.Errorf("the table's npu1 row is not alice's lease held by bob's pid %d:\n%s", recv.Cmd.Process.Pid, row)
	}

	// Each user sees every device, holder and pid, and only their own
	// commands.
	for _, u := range []harness.TestUser{alice, bob} {
		cmd := u.As(exec.Command(b.Bin.Broker, "status", "--json"), b.Dir)
		cmd.Env = b.Env()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("status as %s: %v\n%s", u.Name, err, harness.StderrOf(err))
		}
		var bd wire.Board
		if err := json.Unmarshal(out, &bd); err != nil {
			t.Fatal(err)
		}
		for _, id := range []int{0, 1} {
			d := harness.Device(t, &bd, id)
			if d.Lease == nil || len(d.Lease.Holders) != 1 {
				t.Fatalf("as %s: npu%d: %+v", u.Name, id, d)
			}
			h := d.Lease.Holders[0]
			if own := h.UID == u.UID; own != (h.Command != "") {
				t.Errorf("as %s: npu%d holder %s: command %q: want it shown exactly when it is the asker's", u.Name, id, h.User, h.Command)
			}
		}
	}
	recv.Stdin.Close()
	recv.MustSucceed()
	pa.Stdin.Close()
	pa.MustSucceed()
}

// TestStatusRestart: after the broker is killed with -9 and started again,
// a lease that survived shows with its user, grant and holders, and counts
// against max_devices again, whether the accounting log knew it or not.
func TestStatusRestart(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(2)+"[limits]\nmax_devices = 1\n[status]\nscan_interval = \"1s\"\n")
	user := harness.Me(t)
	h := harness.Hold(t, b, "npu0", "-d", "0")
	before := harness.Device(t, b.Board(t), 0)

	b.Kill()
	b.Start()
	board := b.Board(t)
	d := harness.Device(t, board, 0)
	if d.State != wire.DeviceLeased || d.Lease == nil || !d.Lease.Adopted || d.Lease.ID != before.Lease.ID ||
		d.Lease.User != user || d.Lease.Since != before.Lease.Since || d.Lease.PID != h.Cmd.Process.Pid {
		t.Fatalf("npu0 after the restart: %+v (lease %+v), want the lease from before (%+v)", d, d.Lease, before.Lease)
	}
	if !slices.Equal(harness.HolderPIDs(board, 0), []int{h.Cmd.Process.Pid}) {
		t.Errorf("npu0 holders after the restart: %v, want %d", harness.HolderPIDs(board, 0), h.Cmd.Process.Pid)
	}
	assertAtLimit := func(when string) {
		t.Helper()
		if d := harness.Device(t, b.Board(t), 1); d.State != wire.DeviceFree {
			t.Fatalf("%s: npu1 is %s, want free", when, d.State)
		}
		if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "-d", "1", "true")); code != 75 {
			t.Errorf("%s: npurun --no-wait -d 1 with npu0 held, max_devices = 1: exit %d, want 75 (the surviving lease counts)\n%s", when, code, out)
		}
	}
	assertAtLimit("after a restart")

	// Without the accounting log the lease is found from /proc.
	b.Kill()
	if err := os.Remove(filepath.Join(b.StateDir, "usage.log")); err != nil {
		t.Fatal(err)
	}
	b.Start()
	d = harness.Device(t, b.Board(t), 0)
	if d.State != wire.DeviceHeld || d.Lease == nil || d.Lease.User != user || d.Lease.PID != h.Cmd.Process.Pid || !d.Lease.Adopted {
		t.Fatalf("npu0 after a restart without the log: %+v (lease %+v), want held by %s, pid %d", d, d.Lease, user, h.Cmd.Process.Pid)
	}
	if !strings.Contains(b.Log(), "no record of its grant: held by pid "+strconv.Itoa(h.Cmd.Process.Pid)) {
		t.Errorf("broker log:\n%s", b.Log())
	}
	assertAtLimit("after a restart without the log")

	w := harness.WatchBoards(t, b, nil)
	h.Release()
	w.Next("npu0 free", func(bd *wire.Board) bool { return harness.Device(t, bd, 0).State == wire.DeviceFree })
	if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "-d", "1", "true")); code != 0 {
		t.Errorf("npurun -d 1 once npu0 is released: exit %d\n%s", code, out)
	}
}

// TestStatusWaiting: the line shows on the board in order, with a device
// reserved for the head of it, and the table says so; waiting their turn,
// the requests have no why.
func TestStatusWaiting(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(2))
	h := harness.Hold(t, b, "npu0", "-d", "0")
	q1 := harness.Queue(t, b, "q1", "-n", "2", "true")
	q2 := harness.Queue(t, b, "q2", "-d", "0", "true")
	board := b.Board(t)
	if len(board.Waiting) != 1 || board.Waiting[0].Pool != "default" || board.Waiting[0].Count != 2 {
		t.Fatalf("waiting: %+v", board.Waiting)
	}
	ws := board.Waiting[0].Waiters
	if len(ws) != 2 || ws[0].Position != 1 || ws[0].N != 2 || ws[0].Kind != wire.KindInline || ws[1].Position != 2 || !slices.Equal(ws[1].Devices, []int{0}) || ws[0].Why != "" || ws[1].Why != "" {
		t.Errorf("waiters: %+v", ws)
	}
	d := harness.Device(t, board, 1)
	if d.State != wire.DeviceReserved || d.ReservedFor == nil || d.ReservedFor.N != 2 {
		t.Errorf("npu1: %+v, want reserved for the 2-device request", d)
	}
	table := b.Status(t)
	for _, want := range []string{`WAITING  pool "default": 2`, "for npurun of " + harness.Me(t) + " (needs 2)", "2 devices", "npu 0"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	h.Release()
	q1.MustSucceed()
	q2.MustSucceed()
}

// TestStatusWaitingWhy: a request that waits although a device is free,
// because its user holds max_devices already, says so on the board and in
// the table (TestStatusWaiting: one waiting its turn says nothing).
func TestStatusWaitingWhy(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(2)+"[limits]\nmax_devices = 1\n")
	h := harness.Hold(t, b, "npu0", "-d", "0")
	q := harness.Queue(t, b, "q", "true")
	ws := b.Board(t).Waiting[0].Waiters
	want := harness.Me(t) + " holds 1 of 1 device allowed"
	if len(ws) != 1 || !strings.Contains(ws[0].Why, want) {
		t.Errorf("waiters: %+v; want one whose why says %q", ws, want)
	}
	if table := b.Status(t); !strings.Contains(table, "waits: "+want) {
		t.Errorf("table lacks %q:\n%s", "waits: "+want, table)
	}
	h.Release()
	q.MustSucceed()
}

// TestStatusWatchBrokerStops: a status watch whose broker stops says so in
// words and exits 69, as when no broker answers at all.
func TestStatusWatchBrokerStops(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(1))
	w := harness.WatchBoards(t, b, nil)
	w.Next("the first board", func(*wire.Board) bool { return true })
	b.Stop()
	w.WaitLine("npubroker: the broker closed the connection: it stopped or is restarting")
	if code, sig := w.Wait(); code != 69 || sig != 0 {
		t.Errorf("status --watch after the broker stopped: exit %d signal %v, want 69; output:\n%s", code, sig, w.Output())
	}
	if out := w.Output(); strings.Contains(out, "closed by peer") {
		t.Errorf("status --watch says %q", out)
	}
}
