package lease

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// TestOneBrokerPerDevice: a second broker on the same device nodes, with
// run and state directories of its own, refuses to start, naming the
// device and the first broker's pid, before it makes a lock file or
// changes an ACL: the first one's lease and the restricted user's ACL
// entry stay. Once the first broker is gone (kill -9), the devices are
// free for another.
func TestOneBrokerPerDevice(t *testing.T) {
	dev := harness.NewDevTree(t, 2)
	student := harness.NewUser(t)
	conf := dev.Config("0-1", fmt.Sprintf("[restrict]\nusers = [%q]\n", student.Name))
	b := harness.StartBroker(t, conf)
	claims := "NPUBROKER_CLAIM_DIR=" + filepath.Join(b.Dir, "claims") // as every broker of a machine shares /run/npurun-devices

	h := harness.LeaseAs(t, b, student, "student", "-d", "0")
	entry := fmt.Sprintf("user:%d:rw-", student.UID)
	acl := harness.ACLText(t, dev.Node("davinci0"))
	if !strings.Contains(acl, entry) {
		t.Fatalf("during the lease davinci0's ACL has no %s:\n%s", entry, acl)
	}

	other := harness.SharedDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), harness.EventTimeout) // a broker that starts serves for ever
	defer cancel()
	cmd := exec.CommandContext(ctx, b.Bin.Broker, "serve", "--config", b.Conf, "--run-dir", filepath.Join(other, "run"),
		"--state-dir", filepath.Join(other, "spool"), "--cgroup", "off")
	cmd.Env = append(os.Environ(), claims)
	code, out := harness.ExitCode(t, cmd)
	want := fmt.Sprintf("npu 0 (%s, device 1:3): another broker uses it (pid %d)", dev.Node("davinci0"), b.Pid())
	if code != 1 || !strings.Contains(out, want) {
		t.Fatalf("a second broker on the same devices: exit %d, output:\n%s\nwant exit 1 and %q", code, out, want)
	}
	if got := harness.ACLText(t, dev.Node("davinci0")); got != acl {
		t.Errorf("the refused broker changed davinci0's ACL:\n%s\nwas\n%s", got, acl)
	}
	if !harness.CanOpen(t, student, dev.Node("davinci0")) {
		t.Error("the lease's holder can no longer open davinci0")
	}
	if _, err := os.Stat(filepath.Join(other, "run", "locks")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the refused broker made its lock directory (%v)", err)
	}
	// The first broker's lease goes on: npu 0 is not free, npu 1 is.
	if code, out := harness.ExitCode(t, b.Npurun("-d", "0", "--no-wait", "true")); code != 75 {
		t.Errorf("npu 0 during the lease: exit %d, want 75 (held): %s", code, out)
	}
	if code, out := harness.ExitCode(t, b.Npurun("-d", "1", "--no-wait", "true")); code != 0 {
		t.Errorf("npu 1: exit %d: %s", code, out)
	}
	h.Release()
	harness.WaitFree(t, b, 0)
	if strings.Contains(harness.ACLText(t, dev.Node("davinci0")), entry) {
		t.Error("the lease has ended and davinci0 still names the student")
	}

	// kill -9 lets the claims go: another broker, on other directories,
	// starts and serves.
	b.Kill()
	b2 := harness.NewBroker(t, conf, claims)
	b2.Start()
	if code, out := harness.ExitCode(t, b2.Npurun("-d", "0", "--no-wait", "true")); code != 0 {
		t.Errorf("npu 0 from the broker started after the first was killed: exit %d: %s", code, out)
	}
}
