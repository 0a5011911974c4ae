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

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// TestUnleasedUse: a process with a device node open and no lease on it
// is reported once the grace window has passed, never before; a process
// whose ancestor holds the device's lease never is (though it closed the
// lock itself), while its use of another device is; an exempt account's
// process is not, and a program is not exempt by its name (a copy of
// sleep named npu-smi, the name of a tool exempted by name before, is
// reported); status shows the report in its table.
func TestUnleasedUse(t *testing.T) {
	dev := harness.FakeDev(t, 4)
	open := harness.Opener(t)
	exemptUser := harness.NewUser(t)
	npuSmi := filepath.Join(harness.SharedDir(t), "npu-smi")
	harness.CopyFile(t, "/bin/sleep", npuSmi, 0o755)
	const grace = 3 * time.Second
	b := harness.StartBroker(t, harness.AscendConfig(dev, 4, "[status]\nscan_interval = \"1s\"\nunleased_grace = \"3s\"\nunleased_exempt_users = [\""+exemptUser.Name+"\"]\n"))
	w := harness.WatchBoards(t, b, nil)

	// A leased tree: its lease is on npu0; a child of the lease's holder
	// closes the lock, then opens npu0's node (covered by its ancestor's
	// lease) and another opens npu2's (not leased: reported).
	leased := harness.StartProc(t, "leased", b.Npurun("-d", "0", "sh", "-c",
		open+" "+dev+"/davinci0 & a=$!; "+open+" "+dev+"/davinci2 & b=$!; echo held; read x; kill $a $b; exit 0"))
	leased.WaitLine("held")
	own := harness.OpenedPID(t, leased, dev+"/davinci0")
	other := harness.OpenedPID(t, leased, dev+"/davinci2")
	onNode := func(cmd *exec.Cmd) *exec.Cmd {
		node, err := os.Open(dev + "/davinci3")
		if err != nil {
			t.Fatal(err)
		}
		defer node.Close()
		cmd.Stdin = node
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	exempted := onNode(exemptUser.As(exec.Command("sleep", "600"), b.Dir))
	named := onNode(exec.Command(npuSmi, "600"))

	start := time.Now()
	ctl := harness.StartProc(t, "unleased", exec.Command(open, dev+"/davinci1"))
	ctlPID := harness.OpenedPID(t, ctl, dev+"/davinci1")

	board, before := w.Next("pid "+strconv.Itoa(ctlPID)+" reported on npu1", func(bd *wire.Board) bool {
		return slices.Contains(harness.UnleasedPIDs(bd, 1), ctlPID)
	})
	if at := time.UnixMilli(board.Time); at.Sub(start) < grace {
		t.Errorf("reported %s after it opened the node, before the grace window of %s", at.Sub(start), grace)
	}
	var u wire.Unleased
	for _, x := range board.Unleased {
		if x.PID == ctlPID {
			u = x
		}
	}
	if u.Node != dev+"/davinci1" || u.Name != "npu1" || u.User != harness.Me(t) || u.Command != "sleep 600" || u.Action != "report" || u.Restricted || time.UnixMilli(u.Since).Before(start.Add(-time.Second)) {
		t.Errorf("report: %+v", u)
	}
	// One full scan later: the other device of the leased tree is
	// reported, and so is the program named npu-smi; the leased tree's own
	// device and the exempt account's process never were.
	board, more := w.Next("a scan after the report, with npu2's use and npu-smi's", func(bd *wire.Board) bool {
		return bd.Scan.Last > board.Scan.Last && slices.Contains(harness.UnleasedPIDs(bd, 2), other) && slices.Contains(harness.UnleasedPIDs(bd, 3), named.Process.Pid)
	})
	for _, bd := range append(append(before, more...), board) {
		if slices.Contains(harness.UnleasedPIDs(bd, 0), own) {
			t.Fatalf("pid %d, whose parent holds npu0's lease, was reported using npu0: %+v", own, bd.Unleased)
		}
		if slices.Contains(harness.UnleasedPIDs(bd, 3), exempted.Process.Pid) {
			t.Fatalf("the exempt account's process was reported: %+v", bd.Unleased)
		}
	}
	table := b.Status(t)
	if !strings.Contains(table, "UNLEASED USE") || !strings.Contains(harness.LineWithField(table, strconv.Itoa(ctlPID)), dev+"/davinci1 open without a lease for") {
		t.Errorf("table:\n%s", table)
	}
	if !strings.Contains(b.Log(), "pid "+strconv.Itoa(ctlPID)+" ("+harness.Me(t)+": sleep 600) has "+dev+"/davinci1 open without a lease") {
		t.Errorf("broker log:\n%s", b.Log())
	}
	if !ctl.Exited() {
		ctl.Cmd.Process.Kill()
	}
	w.Next("npu1's report gone with its process", func(bd *wire.Board) bool { return !slices.Contains(harness.UnleasedPIDs(bd, 1), ctlPID) })
	leased.Stdin.Close()
	leased.MustSucceed()
}

// TestUnleasedActions: unleased_use = "term" or "kill" signals a
// restricted account's process past the grace window, and only such: an
// unrestricted user's is reported and left alone.
func TestUnleasedActions(t *testing.T) {
	for _, tc := range []struct {
		action string
		sig    syscall.Signal
	}{{"term", syscall.SIGTERM}, {"kill", syscall.SIGKILL}} {
		t.Run(tc.action, func(t *testing.T) {
			alice, bob := harness.NewUser(t), harness.NewUser(t)
			dev := harness.FakeDev(t, 2)
			open := harness.Opener(t)
			const grace = 2 * time.Second
			b := harness.StartBroker(t, harness.AscendConfig(dev, 2, "[status]\nscan_interval = \"1s\"\nunleased_grace = \"2s\"\nunleased_use = \""+
				tc.action+"\"\n[restrict]\nusers = [\""+alice.Name+"\"]\n"))
			w := harness.WatchBoards(t, b, nil)
			start := time.Now()
			pa := harness.StartProc(t, "alice", alice.As(exec.Command(open, dev+"/davinci0"), b.Dir))
			harness.OpenedPID(t, pa, dev+"/davinci0")
			pb := harness.StartProc(t, "bob", bob.As(exec.Command(open, dev+"/davinci1"), b.Dir))
			bobPID := harness.OpenedPID(t, pb, dev+"/davinci1")

			if _, sig := pa.Wait(); sig != tc.sig {
				t.Fatalf("alice's process ended by signal %v, want %v", sig, tc.sig)
			}
			if d := time.Since(start); d < grace {
				t.Errorf("alice's process was signalled %s after it opened the node, within the grace window", d)
			}
			board, _ := w.Next("bob's use reported", func(bd *wire.Board) bool { return slices.Contains(harness.UnleasedPIDs(bd, 1), bobPID) })
			for _, u := range board.Unleased {
				if u.PID == bobPID && (u.Restricted || u.Action != "report" || u.User != bob.Name) {
					t.Errorf("bob's report: %+v, want an unrestricted report", u)
				}
			}
			w.Next("a later scan", func(bd *wire.Board) bool { return bd.Scan.Last > board.Scan.Last })
			if pb.Exited() {
				t.Fatalf("bob, not restricted, lost his process: %s", pb.Output())
			}
			if want := "sending it " + map[string]string{"term": "SIGTERM", "kill": "SIGKILL"}[tc.action] + " (unleased_use = \"" + tc.action + "\", " + alice.Name + " is restricted)"; !strings.Contains(b.Log(), want) {
				t.Errorf("broker log lacks %q:\n%s", want, b.Log())
			}
		})
	}
}
