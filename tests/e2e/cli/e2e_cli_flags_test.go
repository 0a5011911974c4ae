package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

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

// TestDeviceListFlags: -d takes the configuration's device-list syntax in
// npurun and task-submit; -n 0 and lists that do not parse are usage
// errors that say what is wrong.
func TestDeviceListFlags(t *testing.T) {
	b := harness.StartBroker(t, harness.TaskConfig(6))

	for _, tc := range []struct {
		args []string
		want string // NPURUN_DEVICES
	}{
		{[]string{"-d", "0-3"}, "0,1,2,3"},
		{[]string{"-d", "5,1-2"}, "1,2,5"},
		{[]string{"-d", "4", "-d", "3-4"}, "3,4"},
		{[]string{"-n", "3", "-d", "0-2"}, "0,1,2"},
	} {
		t.Run("npurun "+strings.Join(tc.args, " "), func(t *testing.T) {
			args := append(tc.args, "--no-wait", "sh", "-c", `echo "got $NPURUN_DEVICES"`)
			code, out := harness.ExitCode(t, b.Npurun(args...))
			if code != 0 || !strings.Contains(out, "got "+tc.want+"\n") {
				t.Fatalf("exit %d, want 0 and NPURUN_DEVICES=%s; output:\n%s", code, tc.want, out)
			}
		})
	}

	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-n", "0"}, []string{"npurun: bad device count 0: -n takes 1 or more", "npurun: hint: to run without a device, use --no-device"}},
		{[]string{"-d", "0-x"}, []string{`npurun: bad device list "0-x": "0-x" is not a range of device ids`, "npurun: hint: -d takes physical ids and ranges"}},
		{[]string{"-d", "3-1"}, []string{`npurun: bad device list "3-1": range "3-1" runs backwards`}},
		{[]string{"-d", "1,,2"}, []string{`npurun: bad device list "1,,2": empty item between commas`}},
		{[]string{"-n", "2", "-d", "0-3"}, []string{"npurun: -n 2 does not match the 4 devices named"}},
		{[]string{"-d", "4-9"}, []string{"npurun: no npu 6 here", "npurun: hint: this broker manages npu 0-5"}},
	} {
		t.Run("npurun "+strings.Join(tc.args, " "), func(t *testing.T) {
			code, out := harness.ExitCode(t, b.Npurun(append(tc.args, "true")...))
			if code != 2 {
				t.Fatalf("exit %d, want 2 (usage); output:\n%s", code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, "strconv") {
				t.Errorf("output speaks Go, not to people:\n%s", out)
			}
		})
	}

	t.Run("task-submit -d 1-2", func(t *testing.T) {
		id := harness.SubmitTask(t, b, nil, harness.SharedDir(t), "-d", "1-2", "--", "sh", "-c", `test "$NPURUN_DEVICES" = 1,2`)
		if r := harness.WaitTask(t, b, id); r.Code != 0 {
			t.Fatalf("task on -d 1-2 did not see NPURUN_DEVICES=1,2: %s", r)
		}
		if ti := harness.ShowTask(t, b, id); !slices.Equal(ti.Devices, []int{1, 2}) {
			t.Errorf("task devices = %v, want [1 2]", ti.Devices)
		}
	})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-n", "0"}, "task-submit: bad device count 0: -n takes 1 or more"},
		{[]string{"-d", "x"}, `task-submit: bad device list "x": "x" is not a device id`},
	} {
		t.Run("task-submit "+strings.Join(tc.args, " "), func(t *testing.T) {
			r := harness.RunTaskCmd(t, b.TaskSubmit(append(tc.args, "--run", "true")...))
			if r.Code != 2 || !strings.Contains(r.Stderr, tc.want) {
				t.Fatalf("want exit 2 and %q; %s", tc.want, r)
			}
		})
	}
}

// TestNoBrokerThere: whatever stands at the socket's path instead of a
// broker, npurun and task-submit exit 69 with a message naming the path.
func TestNoBrokerThere(t *testing.T) {
	bin := harness.Bins(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("not a socket\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A socket bound by nobody listening (a dead broker's), and one of
	// another type that listens.
	bound := filepath.Join(dir, "dead.sock")
	stream := filepath.Join(dir, "stream.sock")
	for _, s := range []struct {
		path   string
		typ    int
		listen bool
	}{{bound, unix.SOCK_SEQPACKET, false}, {stream, unix.SOCK_STREAM, true}} {
		fd, err := unix.Socket(unix.AF_UNIX, s.typ|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		if err := unix.Bind(fd, &unix.SockaddrUnix{Name: s.path}); err != nil {
			t.Fatal(err)
		}
		if s.listen {
			if err := unix.Listen(fd, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name, path, why string
	}{
		{"missing", filepath.Join(dir, "absent.sock"), "no such file"},
		{"regular file", file, "a regular file, not a socket"},
		{"directory", dir, "a directory, not a socket"},
		{"under a file", filepath.Join(file, "broker.sock"), "a part of the path is not a directory"},
		{"nothing listening", bound, "nothing listens on the socket"},
		{"socket of another type", stream, "the socket there is of another type than the broker's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := "no broker at " + tc.path + ": " + tc.why
			cmd := exec.Command(bin.Npurun, "true")
			cmd.Env = append(os.Environ(), "NPURUN_SOCKET="+tc.path)
			code, out := harness.ExitCode(t, cmd)
			if code != 69 || !strings.Contains(out, "npurun: "+want) || !strings.Contains(out, "npurun: hint:") {
				t.Errorf("npurun with NPURUN_SOCKET=%s: exit %d, want 69 and %q; output:\n%s", tc.path, code, want, out)
			}
			r := harness.RunTaskCmd(t, exec.Command(bin.TaskSubmit, "--socket", tc.path, "list"))
			if r.Code != 69 || !strings.Contains(r.Stderr, "task-submit: "+want) {
				t.Errorf("task-submit --socket %s list: want exit 69 and %q; %s", tc.path, want, r)
			}
		})
	}
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
