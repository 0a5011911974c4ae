package cli

import (
	"slices"
	"strings"
	"testing"

	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/tests/harness"
)

// TestNoDeviceInsideLease: npurun --no-device under a lease hides the
// devices from its command but keeps the lease, checked by the workload: a
// second npurun --no-wait on those devices finds them busy while the
// command runs, and free once it is gone.
func TestNoDeviceInsideLease(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(2))
	npurun := b.Bin.Npurun
	busy := func(t *testing.T, dev string) {
		t.Helper()
		code, out := harness.ExitCode(t, b.Npurun("--no-wait", "-d", dev, "true"))
		if code != 75 || !strings.Contains(out, "npu "+dev+" is in use") {
			t.Fatalf("npurun --no-wait -d %s while the outer lease should hold it: exit %d, want 75 (busy); output:\n%s", dev, code, out)
		}
	}

	t.Run("exec'd directly by the leased npurun", func(t *testing.T) {
		// The outer npurun becomes the inner one: the inner is the only
		// process that holds the lease, so dropping it would free both.
		p := harness.StartProc(t, "outer", b.Npurun("-n", "2", npurun, "--no-device", "sh", "-c",
			`echo "inner [$NPURUN_DEVICES] [$ASCEND_RT_VISIBLE_DEVICES] lease=${NPURUN_LEASE:+set}"; read x; exit 0`))
		line := p.WaitLine("inner")
		if line != "inner [] [] lease=set" {
			t.Errorf("the --no-device command saw %q, want the devices hidden and the lease kept", line)
		}
		busy(t, "0")
		busy(t, "1")
		p.Stdin.Close()
		p.MustSucceed()
		if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "-d", "0-1", "true")); code != 0 {
			t.Fatalf("npu 0-1 not free after the --no-device command ended: exit %d; output:\n%s", code, out)
		}
	})

	t.Run("from a shell under the lease", func(t *testing.T) {
		p := harness.StartProc(t, "shell", b.Npurun("-n", "2", "sh", "-c",
			npurun+` --no-device sh -c 'echo "inner [$NPURUN_DEVICES]"'; echo "shell [$NPURUN_DEVICES]"; read x; exit 0`))
		p.WaitLine("inner []")
		p.WaitLine("shell [0,1]")
		busy(t, "0")
		busy(t, "1")
		p.Stdin.Close()
		p.MustSucceed()
	})

	t.Run("npurun below it refuses", func(t *testing.T) {
		// With one device left to ask for, asking the broker could wait
		// for the device the ancestor holds; running the command would run
		// it with every device hidden.
		code, out := harness.ExitCode(t, b.Npurun("-n", "2", npurun, "--no-device", npurun, "--timeout", "5s", "true"))
		if code != 1 || !strings.Contains(out, "npurun: inside a lease of devices 0-1 whose devices an npurun --no-device above hides") {
			t.Fatalf("nested npurun under --no-device: exit %d, want 1 with a message; output:\n%s", code, out)
		}
	})
}

// TestTaskSubmitDeviceList: task-submit -d takes the configuration's
// device-list syntax, and the task runs on those devices. (The rest of what
// was TestDeviceListFlags, npurun's -d and both programs' usage errors, is
// the script testdata/cli/device_list_flags.txtar.)
func TestTaskSubmitDeviceList(t *testing.T) {
	b := harness.StartBroker(t, harness.TaskConfig(6))

	t.Run("task-submit -d 1-2", func(t *testing.T) {
		id := harness.SubmitTask(t, b, nil, harness.SharedDir(t), "-d", "1-2", "--", "sh", "-c", `test "$NPURUN_DEVICES" = 1,2`)
		if r := harness.WaitTask(t, b, id); r.Code != 0 {
			t.Fatalf("task on -d 1-2 did not see NPURUN_DEVICES=1,2: %s", r)
		}
		if ti := harness.ShowTask(t, b, id); !slices.Equal(ti.Devices, []int{1, 2}) {
			t.Errorf("task devices = %v, want [1 2]", ti.Devices)
		}
	})
}

// TestDeviceListSyntaxMatchesConfig: -d (npu.ParseIDs) accepts exactly the
// device lists the configuration's ids accept (policy keeps its own copy
// of the parser, as it imports nothing of the project), and reads them
// alike.
func TestDeviceListSyntaxMatchesConfig(t *testing.T) {
	for _, in := range []string{
		"0", "7", "0-3", "0-3,8", "8,0-3", " 1 , 2 ", "0 - 3", "3-3", "1,1", "0-3,2",
		"x", "-1", "3-1", "1,,2", ",1", "1,", "1-", "-", "0-3-5", "+1", "1.5", "0x1",
		"0-4095", "0-4096", "99999999999999999999999",
	} {
		ids, errFlag := npu.ParseIDs(in)
		cfg, errConf := policy.Parse("t.conf", []byte("[devices]\nvendor = \"fake\"\nids = \""+in+"\"\n"))
		switch {
		case (errFlag == nil) != (errConf == nil):
			t.Errorf("%q: -d says %v, the config says %v", in, errFlag, errConf)
		case errFlag == nil && !slices.Equal(ids, cfg.IDs):
			t.Errorf("%q: -d reads %v, the config %v", in, ids, cfg.IDs)
		}
	}
}
