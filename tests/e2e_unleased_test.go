package tests

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

	"github.com/npurun/npurun/wire"
)

// opener writes a script that closes the lease's lock descriptor if it
// has one (NPURUN_LEASE=DEV:FD), opens the device node $1 at descriptor 8,
// says "open NODE PID" and becomes `sleep 600`, keeping the node open.
// It is a bash script: the lease lies at 20 or above, and a POSIX sh such
// as dash names only descriptors 0 to 9 in a redirection.
func opener(t testing.TB) string {
	t.Helper()
	p := filepath.Join(SharedDir(t), "opener.sh")
	script := `#!/bin/bash
if [ -n "$NPURUN_LEASE" ]; then
	fd=${NPURUN_LEASE#*:}
	eval "exec ${fd%%,*}<&-"
	[ -e /proc/$$/fd/${fd%%,*} ] && { echo "lock descriptor ${fd%%,*} still open"; exit 1; }
fi
exec 8<"$1"
echo "open $1 $$"
exec sleep 600
`
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// openedPID returns the pid that the opener of node said.
func openedPID(t testing.TB, p *proc, node string) int {
	t.Helper()
	return pidOf(t, p.waitLine("open "+node+" "))
}

// TestUnleasedUse: a process with a device node open and no lease on it
// is reported once the grace window has passed, never before; a process
// whose ancestor holds the device's lease never is (though it closed the
// lock itself), while its use of another device is; an exempt account's
// process is not, and a program is not exempt by its name (a copy of
// sleep named npu-smi, the name of a tool exempted by name before, is
// reported); status shows the report in its table.
func TestUnleasedUse(t *testing.T) {
	dev := fakeDev(t, 4)
	open := opener(t)
	exemptUser := newUser(t)
	npuSmi := filepath.Join(SharedDir(t), "npu-smi")
	copyFile(t, "/bin/sleep", npuSmi, 0o755)
	const grace = 3 * time.Second
	b := StartBroker(t, ascendConfig(dev, 4, "[status]\nscan_interval = \"1s\"\nunleased_grace = \"3s\"\nunleased_exempt_users = [\""+exemptUser.Name+"\"]\n"))
	w := watchBoards(t, b, nil)

	// A leased tree: its lease is on npu0; a child of the lease's holder
	// closes the lock, then opens npu0's node (covered by its ancestor's
	// lease) and another opens npu2's (not leased: reported).
	leased := startProc(t, "leased", b.Npurun("-d", "0", "sh", "-c",
		open+" "+dev+"/davinci0 & a=$!; "+open+" "+dev+"/davinci2 & b=$!; echo held; read x; kill $a $b; exit 0"))
	leased.waitLine("held")
	own := openedPID(t, leased, dev+"/davinci0")
	other := openedPID(t, leased, dev+"/davinci2")
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
	exempted := onNode(exemptUser.as(exec.Command("sleep", "600"), b.Dir))
	named := onNode(exec.Command(npuSmi, "600"))

	start := time.Now()
	ctl := startProc(t, "unleased", exec.Command(open, dev+"/davinci1"))
	ctlPID := openedPID(t, ctl, dev+"/davinci1")

	board, before := w.next("pid "+strconv.Itoa(ctlPID)+" reported on npu1", func(bd *wire.Board) bool {
		return slices.Contains(unleasedPIDs(bd, 1), ctlPID)
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
	if u.Node != dev+"/davinci1" || u.Name != "npu1" || u.User != me(t) || u.Command != "sleep 600" || u.Action != "report" || u.Restricted || time.UnixMilli(u.Since).Before(start.Add(-time.Second)) {
		t.Errorf("report: %+v", u)
	}
	// One full scan later: the other device of the leased tree is
	// reported, and so is the program named npu-smi; the leased tree's own
	// device and the exempt account's process never were.
	board, more := w.next("a scan after the report, with npu2's use and npu-smi's", func(bd *wire.Board) bool {
		return bd.Scan.Last > board.Scan.Last && slices.Contains(unleasedPIDs(bd, 2), other) && slices.Contains(unleasedPIDs(bd, 3), named.Process.Pid)
	})
	for _, bd := range append(append(before, more...), board) {
		if slices.Contains(unleasedPIDs(bd, 0), own) {
			t.Fatalf("pid %d, whose parent holds npu0's lease, was reported using npu0: %+v", own, bd.Unleased)
		}
		if slices.Contains(unleasedPIDs(bd, 3), exempted.Process.Pid) {
			t.Fatalf("the exempt account's process was reported: %+v", bd.Unleased)
		}
	}
	table := b.Status(t)
	if !strings.Contains(table, "UNLEASED USE") || !strings.Contains(lineWithField(table, strconv.Itoa(ctlPID)), dev+"/davinci1 open without a lease for") {
		t.Errorf("table:\n%s", table)
	}
	if !strings.Contains(b.Log(), "pid "+strconv.Itoa(ctlPID)+" ("+me(t)+": sleep 600) has "+dev+"/davinci1 open without a lease") {
		t.Errorf("broker log:\n%s", b.Log())
	}
	if !ctl.exited() {
		ctl.cmd.Process.Kill()
	}
	w.next("npu1's report gone with its process", func(bd *wire.Board) bool { return !slices.Contains(unleasedPIDs(bd, 1), ctlPID) })
	leased.stdin.Close()
	leased.mustSucceed()
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
			alice, bob := newUser(t), newUser(t)
			dev := fakeDev(t, 2)
			open := opener(t)
			const grace = 2 * time.Second
			b := StartBroker(t, ascendConfig(dev, 2, "[status]\nscan_interval = \"1s\"\nunleased_grace = \"2s\"\nunleased_use = \""+
				tc.action+"\"\n[restrict]\nusers = [\""+alice.Name+"\"]\n"))
			w := watchBoards(t, b, nil)
			start := time.Now()
			pa := startProc(t, "alice", alice.as(exec.Command(open, dev+"/davinci0"), b.Dir))
			openedPID(t, pa, dev+"/davinci0")
			pb := startProc(t, "bob", bob.as(exec.Command(open, dev+"/davinci1"), b.Dir))
			bobPID := openedPID(t, pb, dev+"/davinci1")

			if _, sig := pa.wait(); sig != tc.sig {
				t.Fatalf("alice's process ended by signal %v, want %v", sig, tc.sig)
			}
			if d := time.Since(start); d < grace {
				t.Errorf("alice's process was signalled %s after it opened the node, within the grace window", d)
			}
			board, _ := w.next("bob's use reported", func(bd *wire.Board) bool { return slices.Contains(unleasedPIDs(bd, 1), bobPID) })
			for _, u := range board.Unleased {
				if u.PID == bobPID && (u.Restricted || u.Action != "report" || u.User != bob.Name) {
					t.Errorf("bob's report: %+v, want an unrestricted report", u)
				}
			}
			w.next("a later scan", func(bd *wire.Board) bool { return bd.Scan.Last > board.Scan.Last })
			if pb.exited() {
				t.Fatalf("bob, not restricted, lost his process: %s", pb.Output())
			}
			if want := "sending it " + map[string]string{"term": "SIGTERM", "kill": "SIGKILL"}[tc.action] + " (unleased_use = \"" + tc.action + "\", " + alice.Name + " is restricted)"; !strings.Contains(b.Log(), want) {
				t.Errorf("broker log lacks %q:\n%s", want, b.Log())
			}
		})
	}
}
