package cli

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// TestBrokerLogsStop: a broker stopped by SIGTERM or SIGINT says which
// signal stopped it, and that it stopped.
func TestBrokerLogsStop(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			b := harness.StartBroker(t, harness.FakeConfig(1))
			b.Signal(sig)
			name := map[syscall.Signal]string{syscall.SIGTERM: "SIGTERM", syscall.SIGINT: "SIGINT"}[sig]
			log := b.Log()
			stopping := strings.Index(log, "npubroker: "+name+": stopping")
			stopped := strings.LastIndex(log, "npubroker: stopped\n")
			if stopping < 0 || stopped < stopping || !strings.HasSuffix(log, "npubroker: stopped\n") {
				t.Errorf("broker log after %s lacks %q then a last line %q:\n%s", name, name+": stopping", "stopped", log)
			}
		})
	}
}

// TestConfigOneValidation: check-config, serve and reload validate a file
// the same way (broker.LoadConfig, and the running broker's own checks of
// a reload): a device node that does not exist is refused by all three
// with the same words; a [share] change while a share runs is refused by
// reload (it needs a restart), which check-config, asking the broker
// running, warns of, and taken by serve at the restart, the share going
// on.
func TestConfigOneValidation(t *testing.T) {
	harness.NeedRoot(t)
	serve := func(t *testing.T, b *harness.Broker) harness.TaskResult {
		t.Helper()
		cmd := exec.Command(b.Bin.Broker, "serve", "--config", b.Conf, "--run-dir", b.RunDir, "--socket", b.Socket, "--state-dir", b.StateDir, "--cgroup", "off", "--log", "stderr")
		cmd.Env = append(os.Environ(), b.ExtraEnv...)
		return harness.RunTaskCmd(t, cmd)
	}

	t.Run("device node missing", func(t *testing.T) {
		dev := harness.NewDevTree(t, 2)
		b := harness.StartBroker(t, dev.Config("0-1", ""))
		node := dev.Node("davinci1")
		if err := os.Remove(node); err != nil {
			t.Fatal(err)
		}
		want := b.Conf + ": [devices]: no npu 1: " + node + " does not exist"
		if code, out, errs := harness.DrainCmd(t, b, nil, "check-config", b.Conf); code != 1 || !strings.Contains(errs, want) || out != "" {
			t.Errorf("check-config: exit %d, %q, %q; want 1 and %q", code, out, errs, want)
		}
		if code, _, errs := harness.Reload(t, b); code != 1 || !strings.Contains(errs, want) {
			t.Errorf("reload: exit %d, %q; want 1 and %q", code, errs, want)
		}
		b.Stop()
		if r := serve(t, b); r.Code != 1 || !strings.Contains(r.Stderr, want) {
			t.Errorf("serve: want exit 1 and %q; %s", want, r)
		}
	})

	t.Run("share change with a share running", func(t *testing.T) {
		b := harness.StartBroker(t, harness.ShareConfig(1, "16G"))
		h := harness.Hold(t, b, "share", "--mem", "5G")
		harness.WriteConf(t, b, harness.FakeConfig(1))
		want := b.Conf + ": [share] pools, capacity, capacities, margin cannot change without a restart of the broker"
		code, out, errs := harness.DrainCmd(t, b, nil, "check-config", b.Conf)
		if code != 0 || !strings.Contains(out, b.Conf+": ok") || !strings.Contains(errs, b.Conf+": warning: npubroker reload of the broker running here refuses it: "+want) {
			t.Errorf("check-config: exit %d, %q, %q; want 0, ok, and the reload's refusal %q as a warning", code, out, errs, want)
		}
		if code, _, errs := harness.Reload(t, b); code != 1 || !strings.Contains(errs, want) {
			t.Errorf("reload: exit %d, %q; want 1 and %q", code, errs, want)
		}
		// serve takes it: the share runs on, the device whole once it ends.
		b.Kill()
		b.Start()
		b.WaitLog(0, "npu 0 holds a share of 5120 MiB from before this start, and is not shared now")
		if code, _, errs := harness.DrainCmd(t, b, nil, "check-config", b.Conf); code != 0 || strings.Contains(errs, "warning") {
			t.Errorf("check-config of the file the broker runs: exit %d, %q; want 0, no warning", code, errs)
		}
		h.Release()
		harness.WaitFree(t, b, 0)
	})
}
