package tests

import (
	"encoding/json"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/npurun/npurun/wire"
)

// me is the name of the user the tests run as.
func me(t testing.TB) string {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	return u.Username
}

// TestStatusHolders: status lists each lease's holders as /proc shows
// them: the process granted it and a child that inherited the lock; a
// process the descriptor was passed to over a Unix socket, once the
// granted one is gone; the child of a holder that forked and exited.
func TestStatusHolders(t *testing.T) {
	b := StartBroker(t, FakeConfig(4)+"[status]\nscan_interval = \"1s\"\n")
	user := me(t)

	// npu0: a holder and a child that inherited the lock.
	p0 := startProc(t, "npu0", b.Npurun("-d", "0", "sh", "-c", `sleep 600 & echo "child $!"; echo held; read x; kill $!`))
	child := pidOf(t, p0.waitLine("child"))
	p0.waitLine("held")
	board := b.Board(t)
	d := device(t, board, 0)
	if d.State != wire.DeviceLeased || d.Lease == nil || d.Lease.Kind != wire.KindInline || d.Lease.User != user || d.Lease.PID != p0.cmd.Process.Pid {
		t.Fatalf("npu0: %+v (lease %+v), want leased inline to %s, pid %d", d, d.Lease, user, p0.cmd.Process.Pid)
	}
	if got, want := holderPIDs(board, 0), []int{p0.cmd.Process.Pid, child}; !slices.Equal(got, sorted(want)) {
		t.Fatalf("npu0 holders %v, want %v", got, sorted(want))
	}
	if h := holderOf(t, board, 0, p0.cmd.Process.Pid); h.User != user || !strings.HasPrefix(h.Command, "sh -c sleep 600 &") || h.PPID != os.Getpid() {
		t.Errorf("npu0 holder: %+v", h)
	}
	if h := holderOf(t, board, 0, child); h.User != user || h.Command != "sleep 600" || h.PPID != p0.cmd.Process.Pid {
		t.Errorf("npu0 child: %+v", h)
	}
	if d.Lease.Holders[0].PID != p0.cmd.Process.Pid {
		t.Errorf("npu0: the root holder %d is not listed first: %+v", p0.cmd.Process.Pid, d.Lease.Holders)
	}
	for _, id := range []int{1, 2, 3} {
		if d := device(t, board, id); d.State != wire.DeviceFree || d.Lease != nil {
			t.Errorf("npu%d: %+v, want free", id, d)
		}
	}
	table := b.Status(t)
	line := lineWith(table, "npu0 ")
	for _, want := range []string{"leased", user, strconv.Itoa(p0.cmd.Process.Pid), "sh -c sleep 600", "(+1)"} {
		if !strings.Contains(line, want) {
			t.Errorf("table line of npu0 lacks %q:\n%s", want, table)
		}
	}

	// npu1: the descriptor passed on to a process outside the tree.
	w := watchBoards(t, b, nil)
	sock := filepath.Join(b.Dir, "pass.sock")
	recv := startProc(t, "receiver", exec.Command(b.Bin.Workload, "-receive", sock))
	recv.waitLine("listening")
	pass := startProc(t, "passer", b.Npurun("-d", "1", b.Bin.Workload, "-pass", sock))
	recv.waitLine("received")
	pass.mustSucceed()
	board, _ = w.nextWithin(scanTimeout, "the receiver holding npu1", func(bd *wire.Board) bool {
		return slices.Equal(holderPIDs(bd, 1), []int{recv.cmd.Process.Pid})
	})
	if d := device(t, board, 1); d.State != wire.DeviceLeased || d.Lease.PID != pass.cmd.Process.Pid {
		t.Errorf("npu1: %+v, want leased, granted to pid %d", d, pass.cmd.Process.Pid)
	}
	if h := holderOf(t, board, 1, recv.cmd.Process.Pid); !strings.Contains(h.Command, "-receive") || h.User != user {
		t.Errorf("npu1 holder: %+v", h)
	}
	if want := "pid " + strconv.Itoa(pass.cmd.Process.Pid) + ", granted the lease of " + user + ", holds it no more"; !strings.Contains(b.Log(), want) {
		t.Errorf("the broker did not log that /proc disagrees with its record (%q):\n%s", want, b.Log())
	}

	// npu2: a holder forks and exits; its child holds the lease on.
	p2 := startProc(t, "npu2", b.Npurun("-d", "2", "sh", "-c", `sleep 600 & echo "child $!"`))
	orphan := pidOf(t, p2.waitLine("child"))
	t.Cleanup(func() { syscall.Kill(orphan, syscall.SIGKILL) })
	p2.mustSucceed()
	board, _ = w.nextWithin(scanTimeout, "the orphan holding npu2", func(bd *wire.Board) bool {
		return slices.Equal(holderPIDs(bd, 2), []int{orphan})
	})
	if h := holderOf(t, board, 2, orphan); h.Command != "sleep 600" {
		t.Errorf("npu2 holder: %+v", h)
	}

	// Releases show at once.
	recv.stdin.Close()
	recv.mustSucceed()
	w.next("npu1 free", func(bd *wire.Board) bool { return device(t, bd, 1).State == wire.DeviceFree })
	syscall.Kill(orphan, syscall.SIGKILL)
	w.next("npu2 free", func(bd *wire.Board) bool { return device(t, bd, 2).State == wire.DeviceFree })
	p0.stdin.Close()
	p0.mustSucceed()
}

func sorted(s []int) []int {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// lineWith returns the line of text that contains substr.
func lineWith(text, substr string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			return l
		}
	}
	return ""
}

// lineWithField returns the first line of text that has field as one of
// its whitespace-separated fields: a table's row of a pid, which a path
// or an id elsewhere in the table may hold among its digits.
func lineWithField(text, field string) string {
	for _, l := range strings.Split(text, "\n") {
		if slices.Contains(strings.Fields(l), field) {
			return l
		}
	}
	return ""
}

// TestStatusUsers: holders show with their own users, a descriptor passed
// to another user's process is logged, and show_commands = "own" hides
// other users' command lines from everyone but root and their owners.
func TestStatusUsers(t *testing.T) {
	alice, bob := newUser(t), newUser(t)
	b := StartBroker(t, FakeConfig(2)+"[status]\nscan_interval = \"1s\"\nshow_commands = \"own\"\n")
	pa := startProc(t, "alice", alice.as(b.Npurun("-d", "0", "sh", "-c", "echo held; read x; exit 0"), b.Dir))
	pa.waitLine("held")
	socks := filepath.Join(b.Dir, "socks")
	if err := os.Mkdir(socks, 0o777); err != nil || os.Chmod(socks, 0o777) != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(socks, "bob.sock")
	recv := startProc(t, "bob", bob.as(exec.Command(b.Bin.Workload, "-receive", sock), b.Dir))
	recv.waitLine("listening")
	pass := startProc(t, "alice passes", alice.as(b.Npurun("-d", "1", b.Bin.Workload, "-pass", sock), b.Dir))
	recv.waitLine("received")
	pass.mustSucceed()

	w := watchBoards(t, b, nil)
	board, _ := w.next("bob holding npu1", func(bd *wire.Board) bool {
		return slices.Equal(holderPIDs(bd, 1), []int{recv.cmd.Process.Pid})
	})
	if d := device(t, board, 1); d.Lease.User != alice.Name || d.Lease.UID != alice.UID {
		t.Errorf("npu1 lease: %+v, want granted to %s", d.Lease, alice.Name)
	}
	if h := holderOf(t, board, 1, recv.cmd.Process.Pid); h.User != bob.Name || h.UID != bob.UID || h.Command == "" {
		t.Errorf("npu1 holder as root sees it: %+v, want %s with a command", h, bob.Name)
	}
	if h := holderOf(t, board, 0, pa.cmd.Process.Pid); h.User != alice.Name || h.Command != "sh -c echo held; read x; exit 0" {
		t.Errorf("npu0 holder: %+v", h)
	}
	// The broker logs it just after the look that found bob: await it.
	b.WaitLog(0, "the lease of "+alice.Name+" is held by pid "+strconv.Itoa(recv.cmd.Process.Pid)+" of "+bob.Name)
	// The table's USER is the lease's, as --json's user (issue 27.23);
	// the holder that /proc shows, another account's, is named too.
	if row := lineWith(b.Status(t), "npu1 "); !regexp.MustCompile(`leased +` + alice.Name + ` +` + strconv.Itoa(recv.cmd.Process.Pid) + ` .*\(held by ` + bob.Name + `\)`).MatchString(row) {
		t.Errorf("the table's npu1 row is not alice's lease held by bob's pid %d:\n%s", recv.cmd.Process.Pid, row)
	}

	// Each user sees every device, holder and pid, and only their own
	// commands.
	for _, u := range []testUser{alice, bob} {
		cmd := u.as(exec.Command(b.Bin.Broker, "status", "--json"), b.Dir)
		cmd.Env = b.Env()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("status as %s: %v\n%s", u.Name, err, stderrOf(err))
		}
		var bd wire.Board
		if err := json.Unmarshal(out, &bd); err != nil {
			t.Fatal(err)
		}
		for _, id := range []int{0, 1} {
			d := device(t, &bd, id)
			if d.Lease == nil || len(d.Lease.Holders) != 1 {
				t.Fatalf("as %s: npu%d: %+v", u.Name, id, d)
			}
			h := d.Lease.Holders[0]
			if own := h.UID == u.UID; own != (h.Command != "") {
				t.Errorf("as %s: npu%d holder %s: command %q: want it shown exactly when it is the asker's", u.Name, id, h.User, h.Command)
			}
		}
	}
	recv.stdin.Close()
	recv.mustSucceed()
	pa.stdin.Close()
	pa.mustSucceed()
}

// TestStatusRestart: after the broker is killed with -9 and started again,
// a lease that survived shows with its user, grant and holders, and counts
// against max_devices again, whether the accounting log knew it or not.
func TestStatusRestart(t *testing.T) {
	b := StartBroker(t, FakeConfig(2)+"[limits]\nmax_devices = 1\n[status]\nscan_interval = \"1s\"\n")
	user := me(t)
	h := hold(t, b, "npu0", "-d", "0")
	before := device(t, b.Board(t), 0)

	b.Kill()
	b.Start()
	board := b.Board(t)
	d := device(t, board, 0)
	if d.State != wire.DeviceLeased || d.Lease == nil || !d.Lease.Adopted || d.Lease.ID != before.Lease.ID ||
		d.Lease.User != user || d.Lease.Since != before.Lease.Since || d.Lease.PID != h.cmd.Process.Pid {
		t.Fatalf("npu0 after the restart: %+v (lease %+v), want the lease from before (%+v)", d, d.Lease, before.Lease)
	}
	if !slices.Equal(holderPIDs(board, 0), []int{h.cmd.Process.Pid}) {
		t.Errorf("npu0 holders after the restart: %v, want %d", holderPIDs(board, 0), h.cmd.Process.Pid)
	}
	assertAtLimit := func(when string) {
		t.Helper()
		if d := device(t, b.Board(t), 1); d.State != wire.DeviceFree {
			t.Fatalf("%s: npu1 is %s, want free", when, d.State)
		}
		if code, out := exitCode(t, b.Npurun("--no-wait", "-d", "1", "true")); code != 75 {
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
	d = device(t, b.Board(t), 0)
	if d.State != wire.DeviceHeld || d.Lease == nil || d.Lease.User != user || d.Lease.PID != h.cmd.Process.Pid || !d.Lease.Adopted {
		t.Fatalf("npu0 after a restart without the log: %+v (lease %+v), want held by %s, pid %d", d, d.Lease, user, h.cmd.Process.Pid)
	}
	if !strings.Contains(b.Log(), "no record of its grant: held by pid "+strconv.Itoa(h.cmd.Process.Pid)) {
		t.Errorf("broker log:\n%s", b.Log())
	}
	assertAtLimit("after a restart without the log")

	w := watchBoards(t, b, nil)
	h.release()
	w.next("npu0 free", func(bd *wire.Board) bool { return device(t, bd, 0).State == wire.DeviceFree })
	if code, out := exitCode(t, b.Npurun("--no-wait", "-d", "1", "true")); code != 0 {
		t.Errorf("npurun -d 1 once npu0 is released: exit %d\n%s", code, out)
	}
}

// TestStatusWaiting: the line shows on the board in order, with a device
// reserved for the head of it, and the table says so; waiting their turn,
// the requests have no why.
func TestStatusWaiting(t *testing.T) {
	b := StartBroker(t, FakeConfig(2))
	h := hold(t, b, "npu0", "-d", "0")
	q1 := queue(t, b, "q1", "-n", "2", "true")
	q2 := queue(t, b, "q2", "-d", "0", "true")
	board := b.Board(t)
	if len(board.Waiting) != 1 || board.Waiting[0].Pool != "default" || board.Waiting[0].Count != 2 {
		t.Fatalf("waiting: %+v", board.Waiting)
	}
	ws := board.Waiting[0].Waiters
	if len(ws) != 2 || ws[0].Position != 1 || ws[0].N != 2 || ws[0].Kind != wire.KindInline || ws[1].Position != 2 || !slices.Equal(ws[1].Devices, []int{0}) || ws[0].Why != "" || ws[1].Why != "" {
		t.Errorf("waiters: %+v", ws)
	}
	d := device(t, board, 1)
	if d.State != wire.DeviceReserved || d.ReservedFor == nil || d.ReservedFor.N != 2 {
		t.Errorf("npu1: %+v, want reserved for the 2-device request", d)
	}
	table := b.Status(t)
	for _, want := range []string{`WAITING  pool "default": 2`, "for npurun of " + me(t) + " (needs 2)", "2 devices", "npu 0"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	h.release()
	q1.mustSucceed()
	q2.mustSucceed()
}

// TestStatusWaitingWhy: a request that waits although a device is free,
// because its user holds max_devices already, says so on the board and in
// the table (TestStatusWaiting: one waiting its turn says nothing).
func TestStatusWaitingWhy(t *testing.T) {
	b := StartBroker(t, FakeConfig(2)+"[limits]\nmax_devices = 1\n")
	h := hold(t, b, "npu0", "-d", "0")
	q := queue(t, b, "q", "true")
	ws := b.Board(t).Waiting[0].Waiters
	want := me(t) + " holds 1 of 1 device allowed"
	if len(ws) != 1 || !strings.Contains(ws[0].Why, want) {
		t.Errorf("waiters: %+v; want one whose why says %q", ws, want)
	}
	if table := b.Status(t); !strings.Contains(table, "waits: "+want) {
		t.Errorf("table lacks %q:\n%s", "waits: "+want, table)
	}
	h.release()
	q.mustSucceed()
}

// TestStatusWatchBrokerStops: a status watch whose broker stops says so in
// words and exits 69, as when no broker answers at all.
func TestStatusWatchBrokerStops(t *testing.T) {
	b := StartBroker(t, FakeConfig(1))
	w := watchBoards(t, b, nil)
	w.next("the first board", func(*wire.Board) bool { return true })
	b.Stop()
	w.waitLine("npubroker: the broker closed the connection: it stopped or is restarting")
	if code, sig := w.wait(); code != 69 || sig != 0 {
		t.Errorf("status --watch after the broker stopped: exit %d signal %v, want 69; output:\n%s", code, sig, w.Output())
	}
	if out := w.Output(); strings.Contains(out, "closed by peer") {
		t.Errorf("status --watch says %q", out)
	}
}
