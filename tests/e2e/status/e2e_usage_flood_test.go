package status

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// Issue 14.16: one user's raw session requests could flood the accounting
// log away, and their origins read as the PAM module's.

// sessionConfig is a configuration in which alice's own session requests
// get login leases: she is restricted, and a login waits for a device.
func sessionConfig(alice harness.TestUser) string {
	return harness.FakeConfig(2) + "[restrict]\nusers = [\"" + alice.Name + "\"]\nlogin_devices = 1\non_busy = \"wait 10s\"\n"
}

// TestUsageFloodSummed: 400 login leases of one user, made as fast as
// the broker grants them, each with a 1 KiB remote host, write the
// accounting log at the user's rate (60 at once, then one every 6 s) and
// sum the rest: the log stays small, and npubroker usage counts every
// lease, before the sums are written (they are written once a minute) and
// after, from the log, once the broker has stopped and started again.
func TestUsageFloodSummed(t *testing.T) {
	alice := harness.NewUser(t)
	b := harness.StartBroker(t, sessionConfig(alice))
	const n = 400
	rhost := strings.Repeat("h", 1000)
	cmd := alice.As(exec.Command(b.Bin.Workload, "-sessions", strconv.Itoa(n), "-origin", "sshd,pts/7,"+rhost), b.Dir)
	cmd.Env = b.Env()
	p := harness.StartProc(t, "sessions", cmd)
	p.WaitLine("sessions " + strconv.Itoa(n))
	p.MustSucceed()

	count := func(when string) {
		t.Helper()
		rep := usageReport(t, b, "--since", "1h", "--user", alice.Name)
		if len(rep.Rows) != 1 || rep.Rows[0].Kind != wire.KindLogin || rep.Rows[0].Leases != n || rep.Rows[0].DeviceSeconds <= 0 {
			t.Errorf("%s: usage rows %+v, want %d login leases of %s", when, rep.Rows, n, alice.Name)
		}
	}
	count("before the sums are written")
	b.Stop() // writes the sums
	log, err := os.ReadFile(filepath.Join(b.StateDir, "usage.log"))
	if err != nil {
		t.Fatal(err)
	}
	// Each lease logged on its own is a start with the 1 KiB remote host
	// and an end; 60 of them, and a few sums.
	if len(log) > 100<<10 {
		t.Errorf("usage.log is %d bytes after %d leases of one user, want at most 100 KiB", len(log), n)
	}
	if strings.Count(string(log), `"ev":"sum"`) == 0 {
		t.Errorf("usage.log has no sum record:\n%.2000s", log)
	}
	b.Start()
	count("from the log, after a restart")
}

// TestUsageClaimedOrigin: a session's origin (service, tty, remote host)
// that a user's own request named is that user's claim, and says so on
// the board and in the accounting log (and the table, where it shows the
// origin: TestTableClaimedOrigin); the PAM module's
// (root's, on the user's behalf) is not marked.
func TestUsageClaimedOrigin(t *testing.T) {
	alice := harness.NewUser(t)
	b := harness.StartBroker(t, sessionConfig(alice))
	cmd := alice.As(exec.Command(b.Bin.Workload, "-sessions", "0", "-origin", "sshd,pts/7,10.20.30.40", "-hold", "1s"), b.Dir)
	cmd.Env = b.Env()
	p := harness.StartProc(t, "own session", cmd)
	p.WaitLine("holding")
	var li *wire.LeaseInfo
	for _, d := range b.Board(t).Devices {
		if d.Lease != nil && d.Lease.User == alice.Name {
			li = d.Lease
		}
	}
	if li == nil || li.Kind != wire.KindLogin || li.Service != "sshd" || li.TTY != "pts/7" || li.RHost != "10.20.30.40" || !li.Claimed {
		t.Fatalf("alice's own session's lease on the board: %+v, want a login from sshd pts/7 10.20.30.40, claimed", li)
	}
	p.Stdin.Close()
	p.MustSucceed()

	// Root asks on alice's behalf, as pam_npurun does.
	ask := exec.Command(b.Bin.Workload, "-ask", wire.OpSession, "-user", alice.Name)
	ask.Env = b.Env()
	if code, out := harness.ExitCode(t, ask); code != 0 || !strings.Contains(out, wire.TypeGrant) {
		t.Fatalf("root's session request for alice: exit %d, %s", code, out)
	}
	b.Stop()
	data, err := os.ReadFile(filepath.Join(b.StateDir, "usage.log"))
	if err != nil {
		t.Fatal(err)
	}
	var starts []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var r map[string]any
		if json.Unmarshal([]byte(line), &r) == nil && r["ev"] == "start" && r["user"] == alice.Name {
			starts = append(starts, r)
		}
	}
	if len(starts) != 2 || starts[0]["claimed"] != true || starts[0]["rhost"] != "10.20.30.40" || starts[1]["claimed"] != nil {
		t.Errorf("alice's lease starts in usage.log: %v, want her own claimed, then root's not", starts)
	}
}

// TestUsageSkipsOldFiles: npubroker usage --since 1h reads no rotated file
// whose records are all older (the broker's read bytes, from
// /proc/PID/io, tell), and counts what is recent all the same. The log
// used to be read whole, 80 MB by default, at each request.
func TestUsageSkipsOldFiles(t *testing.T) {
	b := harness.NewBroker(t, harness.FakeConfig(1))
	if err := os.MkdirAll(b.StateDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Three rotated files of 30-day-old leases, 8 MB each.
	old := time.Now().Add(-30 * 24 * time.Hour).UnixMilli()
	size := 0
	for i := 1; i <= 3; i++ {
		var buf strings.Builder
		for k := 0; buf.Len() < 8<<20; k++ {
			id := uint64(i)<<32 | uint64(k)
			t0 := old + int64(k)
			fmt.Fprintf(&buf, `{"t":%d,"ev":"start","lease":%d,"kind":"inline","user":"ghost","uid":4242,"pool":"default","devices":[0],"fsdev":1,"inodes":[%d]}`+"\n", t0, id, id)
			fmt.Fprintf(&buf, `{"t":%d,"ev":"end","lease":%d,"device":0,"how":"released","dur_ms":1}`+"\n", t0+1, id)
		}
		size += buf.Len()
		if err := os.WriteFile(filepath.Join(b.StateDir, "usage.log."+strconv.Itoa(4-i)), []byte(buf.String()), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b.Start()
	if code, out := harness.ExitCode(t, b.Npurun("true")); code != 0 {
		t.Fatalf("npurun true: %d\n%s", code, out)
	}
	before := readBytes(t, b.Pid())
	rep := usageReport(t, b, "--since", "1h")
	read := readBytes(t, b.Pid()) - before
	if len(rep.Rows) != 1 || rep.Rows[0].User != harness.Me(t) || rep.Rows[0].Leases != 1 {
		t.Errorf("usage since 1h: %+v, want the one lease of now", rep.Rows)
	}
	if read > int64(size)/8 {
		t.Errorf("the broker read %d bytes for usage --since 1h, with %d bytes of rotated files a month old", read, size)
	}
	all := usageReport(t, b, "--since", "60d")
	if len(all.Rows) != 2 {
		t.Errorf("usage since 60d: %+v, want the ghost's old leases and the one of now", all.Rows)
	}
}

// readBytes is what process pid has read so far (rchar of /proc/PID/io).
func readBytes(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/io")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no rchar in /proc/%d/io", pid)
	return 0
}
