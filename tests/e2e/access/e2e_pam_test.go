package access

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// envOf is the PAM environment in a helper's output.
func envOf(out string) map[string]string {
	env := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if kv, ok := strings.CutPrefix(line, "env "); ok {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
	}
	return env
}

// TestPAMLease: the module in lease mode (login, su-l) on the real PAM
// stack: a restricted user's open_session holds the login lease (variables
// put, descriptors kept, the node open to the user); close_session, End
// alone, and a killed PAM process each release it.
func TestPAMLease(t *testing.T) {
	dev := harness.NewDevTree(t, 2)
	student, staff := harness.NewUser(t), harness.NewUser(t)
	b := harness.StartBroker(t, restrictConf(dev, []harness.TestUser{student}, ""))
	conf := harness.PAMService(t, "npurun-login", "required", "socket="+b.Socket+" lease debug")

	for _, end := range []string{"close_session", "end only", "kill -9"} {
		t.Run(end, func(t *testing.T) {
			flags := []string{"-hold", "-tty", "tty7"}
			if end == "end only" {
				flags = append(flags, "-no-close")
			}
			p := harness.StartPAM(t, conf, "npurun-login", student.Name, flags...)
			p.WaitLine("held")
			out := p.Output()
			env := envOf(out)
			if !strings.Contains(out, "open ok") || env["NPURUN_DEVICES"] != "0" || env["ASCEND_RT_VISIBLE_DEVICES"] != "0" || !strings.HasPrefix(env["NPURUN_LEASE"], "0:") {
				t.Fatalf("open_session:\n%s", out)
			}
			if !strings.Contains(out, `info npurun: npu 0 is yours until you log out (pool "interactive")`) {
				t.Errorf("no grant message:\n%s", out)
			}
			if !harness.CanOpen(t, student, dev.Node("davinci0")) {
				t.Error("the session's user cannot open its device")
			}
			if c := b.Dial(); true {
				c.Send(&wire.Request{Op: wire.OpAcquire, Devices: []int{0}, NoWait: true})
				if _, _, err := c.Recv(harness.EventTimeout); errCode(err) != wire.CodeBusy {
					t.Errorf("device 0 during the session: %v, want busy", err)
				}
			}
			switch end {
			case "kill -9":
				p.Cmd.Process.Signal(syscall.SIGKILL)
				p.Wait()
			default:
				p.Stdin.Close()
				p.MustSucceed()
				<-p.OutDone // its output, read to the end
				if end == "close_session" && !strings.Contains(p.Output(), "close ok") {
					t.Errorf("close_session:\n%s", p.Output())
				}
			}
			harness.WaitFree(t, b, 0)
			if harness.CanOpen(t, student, dev.Node("davinci0")) {
				t.Error("the device still opens after the session ended")
			}
		})
	}

	t.Run("unrestricted", func(t *testing.T) {
		out, _ := harness.RunPAM(t, conf, "npurun-login", staff.Name)
		if env := envOf(out); !strings.Contains(out, "open ok") || len(env) != 0 {
			t.Errorf("unrestricted user: want the session as it is:\n%s", out)
		}
	})
	t.Run("root", func(t *testing.T) {
		out, _ := harness.RunPAM(t, conf, "npurun-login", "root")
		if env := envOf(out); !strings.Contains(out, "open ok") || len(env) != 0 {
			t.Errorf("root: want the session as it is:\n%s", out)
		}
	})
}

// TestPAMLeaseServices: one line for every service, as pam-auth-update
// writes into common-session, with lease_services=: a service it names
// takes the login lease, any other (sshd, su without -l, a service named
// only as a prefix of a listed one) marks the session without one.
func TestPAMLeaseServices(t *testing.T) {
	dev := harness.NewDevTree(t, 2)
	student := harness.NewUser(t)
	b := harness.StartBroker(t, restrictConf(dev, []harness.TestUser{student}, ""))
	dir := t.TempDir()
	line := fmt.Sprintf("session required %s socket=%s lease_services=npurun-login,,npurun-su-l\nsession required pam_permit.so\n", harness.PAMBins(t).Module, b.Socket)
	for _, service := range []string{"npurun-login", "npurun-su-l", "npurun-su", "npurun-sshd", "npurun-su-l2"} {
		if err := os.WriteFile(filepath.Join(dir, service), []byte(line), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		service string
		lease   bool
	}{
		{"npurun-login", true},
		{"npurun-su-l", true},
		{"npurun-su", false},
		{"npurun-sshd", false},
		{"npurun-su-l2", false},
	} {
		t.Run(tc.service, func(t *testing.T) {
			p := harness.StartPAM(t, dir, tc.service, student.Name, "-hold")
			p.WaitLine("held")
			out := p.Output()
			env := envOf(out)
			if !strings.Contains(out, "open ok") {
				t.Fatalf("open_session:\n%s", out)
			}
			_, leased := env["NPURUN_LEASE"]
			switch {
			case tc.lease && (!leased || env["NPURUN_DEVICES"] != "0"):
				t.Errorf("%s is listed in lease_services: want the login lease of npu 0:\n%s", tc.service, out)
			case !tc.lease && (leased || env["NPURUN_DEVICES"] != "" || len(env) != 3):
				t.Errorf("%s is not listed in lease_services: want the session marked, devices hidden:\n%s", tc.service, out)
			}
			p.Stdin.Close()
			p.MustSucceed()
			harness.WaitFree(t, b, 0)
		})
	}
}

// TestPAMMark: without "lease" (sshd, where PAM cannot tell a shell from a
// command) a restricted session gets the devices hidden and no lease.
func TestPAMMark(t *testing.T) {
	dev := harness.NewDevTree(t, 2)
	student := harness.NewUser(t)
	b := harness.StartBroker(t, restrictConf(dev, []harness.TestUser{student}, ""))
	conf := harness.PAMService(t, "npurun-sshd", "required", "socket="+b.Socket)
	p := harness.StartPAM(t, conf, "npurun-sshd", student.Name, "-hold", "-rhost", "192.0.2.7")
	p.WaitLine("held")
	env := envOf(p.Output())
	for _, v := range []string{"NPURUN_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"} {
		if val, ok := env[v]; !ok || val != "" {
			t.Errorf("%s = %q (set %v), want set and empty:\n%s", v, val, ok, p.Output())
		}
	}
	if _, ok := env["NPURUN_LEASE"]; ok {
		t.Error("a marked session got a lease")
	}
	// Both devices are free while the session is open.
	for _, id := range []int{0, 1} {
		c := b.Dial()
		c.Send(&wire.Request{Op: wire.OpAcquire, Devices: []int{id}, NoWait: true})
		r, fds, err := c.Recv(harness.EventTimeout)
		if err != nil || r.Type != wire.TypeGrant {
			t.Errorf("npu %d during a marked session: %v", id, err)
		}
		for _, fd := range fds {
			syscall.Close(fd)
		}
		c.Close()
	}
	p.Stdin.Close()
	p.MustSucceed()
}

// TestPAMBrokerDown: no broker answering, the module follows the
// session-policy file within timeout=: deny refuses a restricted session,
// hide opens it with the devices hidden; an unrestricted one is let be.
func TestPAMBrokerDown(t *testing.T) {
	dev := harness.NewDevTree(t, 1)
	student, staff := harness.NewUser(t), harness.NewUser(t)
	for _, down := range []string{"deny", "hide"} {
		t.Run(down, func(t *testing.T) {
			b := harness.StartBroker(t, dev.Config("0", fmt.Sprintf("[restrict]\nusers = [%q]\non_broker_down = %q\n", student.Name, down)))
			b.Stop()
			conf := harness.PAMService(t, "npurun-down", "required", "socket="+b.Socket+" timeout=1 lease")
			out, took := harness.RunPAM(t, conf, "npurun-down", student.Name)
			switch down {
			case "deny":
				if strings.Contains(out, "open ok") || !strings.Contains(out, "error npurun: the device broker does not answer") {
					t.Errorf("deny: want the session refused:\n%s", out)
				}
			case "hide":
				if env := envOf(out); !strings.Contains(out, "open ok") || env["NPURUN_DEVICES"] != "" || len(env) != 3 {
					t.Errorf("hide: want the session with the devices hidden:\n%s", out)
				}
			}
			if took > 3*time.Second {
				t.Errorf("a stopped broker cost the login %s", took)
			}
			out, _ = harness.RunPAM(t, conf, "npurun-down", staff.Name)
			if !strings.Contains(out, "open ok") || len(envOf(out)) != 0 {
				t.Errorf("unrestricted user with no broker:\n%s", out)
			}
		})
	}
}

// TestPAMOriginBytes: a remote host or terminal name that is long, cut
// inside a character by the module's caps, or not UTF-8 at all costs no
// login: the module sends it as valid UTF-8 within the broker's caps (an
// invalid byte would decode to three), so an unrestricted user's session
// is left as it is and a restricted one's is marked.
func TestPAMOriginBytes(t *testing.T) {
	dev := harness.NewDevTree(t, 2)
	student, staff := harness.NewUser(t), harness.NewUser(t)
	b := harness.StartBroker(t, restrictConf(dev, []harness.TestUser{student}, ""))
	conf := harness.PAMService(t, "npurun-origin", "required", "socket="+b.Socket)
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"rhost not UTF-8", []string{"-rhost", strings.Repeat("\xff", 400)}},
		{"rhost cut in a character", []string{"-rhost", strings.Repeat("a", 1023) + "é"}},
		{"tty cut in a character", []string{"-tty", "a" + strings.Repeat("é", 200)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _ := harness.RunPAM(t, conf, "npurun-origin", staff.Name, tc.flags...)
			if !strings.Contains(out, "open ok") || len(envOf(out)) != 0 {
				t.Errorf("unrestricted user: want the session as it is:\n%s", out)
			}
			out, _ = harness.RunPAM(t, conf, "npurun-origin", student.Name, tc.flags...)
			if env := envOf(out); !strings.Contains(out, "open ok") || len(env) != 3 || env["NPURUN_DEVICES"] != "" {
				t.Errorf("restricted user: want the session with the devices hidden:\n%s", out)
			}
		})
	}
	if log := b.Log(); strings.Contains(log, "too long") {
		t.Errorf("the broker refused a request:\n%s", log)
	}
}

// TestPAMBrokerDownBigAccount: with no broker, a restricted group's member
// whose account entry is large (a long GECOS field) is still found in the
// group: the module's lookups grow their buffers rather than take the
// account for an unknown one, and the session for an unrestricted one.
func TestPAMBrokerDownBigAccount(t *testing.T) {
	student := harness.NewUser(t)
	if out, err := exec.Command("usermod", "-c", strings.Repeat("x", 5000), student.Name).CombinedOutput(); err != nil {
		t.Fatalf("usermod: %v: %s", err, out)
	}
	g, err := user.LookupGroupId(fmt.Sprint(student.GID))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{g.Gid, "-"} {
		t.Run("group id "+id, func(t *testing.T) {
			dir := harness.SharedDir(t)
			policy := fmt.Sprintf("on_broker_down deny\ngroup %s %s\n", g.Name, id)
			if err := os.WriteFile(filepath.Join(dir, "session-policy"), []byte(policy), 0o644); err != nil {
				t.Fatal(err)
			}
			conf := harness.PAMService(t, "npurun-down", "required", "socket="+filepath.Join(dir, "broker.sock")+" timeout=1")
			out, _ := harness.RunPAM(t, conf, "npurun-down", student.Name)
			if strings.Contains(out, "open ok") || !strings.Contains(out, "error npurun: the device broker does not answer") {
				t.Errorf("a member of restricted group %s with a large account entry: want the session refused:\n%s", g.Name, out)
			}
		})
	}
}
