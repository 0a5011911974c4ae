package access

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// restrictConf is a two-device Ascend configuration on dev, device 0 the
// pool "interactive" for logins, with users restricted and extra lines
// added to [restrict].
func restrictConf(dev harness.DevTree, users []harness.TestUser, extra string) string {
	var names []string
	for _, u := range users {
		names = append(names, fmt.Sprintf("%q", u.Name))
	}
	return dev.Config("0-1", fmt.Sprintf("[pools]\ninteractive = \"0\"\nqueue = \"1\"\n\n[restrict]\nusers = [%s]\nlogin_pool = \"interactive\"\n%s",
		strings.Join(names, ", "), extra))
}

// session sends a session request on a new connection and returns the
// first reply that is not "queued", with its descriptors (closed when the
// test ends).
func session(t *testing.T, b *harness.Broker, req *wire.Request) (*wire.Reply, []int, error) {
	t.Helper()
	c := b.Dial()
	req.Op = wire.OpSession
	if err := c.Send(req); err != nil {
		t.Fatal(err)
	}
	for {
		r, fds, err := c.Recv(harness.EventTimeout)
		for _, fd := range fds {
			t.Cleanup(func() { unix.Close(fd) })
		}
		if err == nil && r.Type == wire.TypeQueued {
			continue
		}
		return r, fds, err
	}
}

func errCode(err error) string {
	var be *wire.Error
	if errors.As(err, &be) {
		return be.Code
	}
	return fmt.Sprint(err)
}

// TestSessionOnBehalf: root asks for a user's session and gets what the
// policy gives that user; nobody else may name a user.
func TestSessionOnBehalf(t *testing.T) {
	dev := harness.NewDevTree(t, 2)
	student, staff := harness.NewUser(t), harness.NewUser(t)
	b := harness.StartBroker(t, restrictConf(dev, []harness.TestUser{student}, ""))

	r, fds, err := session(t, b, &wire.Request{User: student.Name, Service: "login", TTY: "tty1", Login: true})
	if err != nil || r.Type != wire.TypeGrant || len(fds) != 1 || r.Devices[0] != 0 {
		t.Fatalf("restricted login: %+v, %d fds, %v", r, len(fds), err)
	}
	if want := `npu 0 is yours until you log out (pool "interactive")`; r.Message != want {
		t.Errorf("message %q, want %q", r.Message, want)
	}
	if !harness.CanOpen(t, student, dev.Node("davinci0")) || !harness.CanOpen(t, student, dev.Node("davinci_manager")) {
		t.Error("the login lease does not open the device to its user")
	}
	if harness.CanOpen(t, student, dev.Node("davinci1")) {
		t.Error("the login lease opens another device")
	}
	unix.Close(fds[0])
	harness.WaitFree(t, b, 0)
	if harness.CanOpen(t, student, dev.Node("davinci0")) {
		t.Error("the device still opens after the session's descriptor closed")
	}

	if r, _, err := session(t, b, &wire.Request{User: student.Name, Service: "sshd"}); err != nil || r.Type != wire.TypeHide || !strings.Contains(strings.Join(r.Env, " "), "NPURUN_DEVICES=") {
		t.Errorf("restricted, not a login: %+v, %v; want hide with the variables", r, err)
	}
	if r, _, err := session(t, b, &wire.Request{User: staff.Name, Service: "sshd", Login: true}); err != nil || r.Type != wire.TypeIgnore {
		t.Errorf("unrestricted: %+v, %v; want ignore", r, err)
	}
	if r, _, err := session(t, b, &wire.Request{User: "root", Service: "su-l", Login: true}); err != nil || r.Type != wire.TypeIgnore {
		t.Errorf("root: %+v, %v; want ignore", r, err)
	}
	if _, _, err := session(t, b, &wire.Request{User: "npurun-t-nobody", Login: true}); errCode(err) != wire.CodeDenied {
		t.Errorf("an unknown user: %v, want denied", err)
	}

	// Anyone but root naming a user, even themselves: denied.
	for _, op := range []string{wire.OpSession, wire.OpAcquire} {
		cmd := staff.As(exec.Command(b.Bin.Workload, "-ask", op, "-user", student.Name), b.Dir)
		cmd.Env = b.Env()
		code, out := harness.ExitCode(t, cmd)
		if code != 0 || !strings.Contains(out, "denied: only root may ask on behalf of another user") {
			t.Errorf("%s naming a user, from %s: exit %d: %s", op, staff.Name, code, out)
		}
	}
}

// login runs npurun --login as u with sh as the login shell reading the
// script on its standard input, and env added.
func login(t *testing.T, b *harness.Broker, u harness.TestUser, name, script string, env ...string) *harness.Proc {
	t.Helper()
	cmd := u.As(b.Npurun("--login"), b.Dir)
	cmd.Env = append(append(cmd.Env, "SHELL=/bin/sh", "HOME=/", "USER="+u.Name), env...)
	p := harness.StartProc(t, name, cmd)
	if _, err := p.Stdin.Write([]byte(script + "\n")); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestLoginShell: npurun --login gives a restricted account's interactive
// login its lease per [restrict], and a command none.
func TestLoginShell(t *testing.T) {
	dev := harness.NewDevTree(t, 2)
	student, other, staff := harness.NewUser(t), harness.NewUser(t), harness.NewUser(t)
	b := harness.StartBroker(t, restrictConf(dev, []harness.TestUser{student, other}, "on_busy = \"hide\"\n"))
	node := dev.Node("davinci0")

	// The login's lease; an npurun in it runs inside it at once.
	first := login(t, b, student, "first login", fmt.Sprintf(`echo "devices=$NPURUN_DEVICES lease=${NPURUN_LEASE:+yes}"; exec 3<>%q && echo opened
%s --no-wait sh -c 'echo "nested=$NPURUN_DEVICES"'; read x; exit 0`, node, b.Bin.Npurun))
	first.WaitLine("is yours until you log out")
	first.WaitLine("devices=0 lease=yes")
	first.WaitLine("opened")
	first.WaitLine("nested=0")
	// npubroker status shows the login's lease as one.
	for _, d := range b.Board(t).Devices {
		if d.ID == 0 && (d.State != wire.DeviceLogin || d.Lease == nil || d.Lease.Kind != wire.KindLogin || d.Lease.User != student.Name) {
			t.Errorf("status shows npu 0 as %+v, want a login lease of %s", d, student.Name)
		}
	}

	// A second restricted login (on_busy = "hide"): in without a device.
	second := login(t, b, other, "second", `echo "in=[$NPURUN_DEVICES]"; exit 0`)
	second.WaitLine("no device free")
	second.WaitLine("in=[]")
	second.MustSucceed()

	// A command over ssh: no lease, devices hidden, the device stays busy
	// to nobody.
	cmdSession := login(t, b, other, "command", "", `SSH_ORIGINAL_COMMAND=echo "cmd devices=[$NPURUN_DEVICES]"; exec 3<>`+node+` 2>/dev/null && echo opened`)
	cmdSession.WaitLine("cmd devices=[]")
	cmdSession.Wait()
	<-cmdSession.OutDone
	if strings.Contains(cmdSession.Output(), "opened") {
		t.Error("a command session opened the login's device")
	}

	// An unrestricted account: the shell as it is, and a command as it is
	// (the broker says so: it is asked for a command too).
	plain := login(t, b, staff, "staff", `echo "staff devices=${NPURUN_DEVICES-unset}"; exit 0`)
	plain.WaitLine("staff devices=unset")
	plain.MustSucceed()
	plainCmd := login(t, b, staff, "staff command", "", `SSH_ORIGINAL_COMMAND=echo "staff cmd devices=${NPURUN_DEVICES-unset} ${ASCEND_RT_VISIBLE_DEVICES-unset}"`)
	plainCmd.WaitLine("staff cmd devices=unset unset")
	plainCmd.MustSucceed()

	first.Stdin.Close()
	first.MustSucceed()
	harness.WaitFree(t, b, 0)
	if harness.CanOpen(t, student, node) {
		t.Error("after logout the device still opens")
	}
}

// TestLoginOnBusy: a second restricted login while the login pool is
// taken waits, hides or is refused, as on_busy says.
func TestLoginOnBusy(t *testing.T) {
	dev := harness.NewDevTree(t, 2)
	first, second := harness.NewUser(t), harness.NewUser(t)
	for _, tt := range []struct {
		onBusy string
		check  func(t *testing.T, b *harness.Broker, hold *harness.Proc)
	}{
		{"deny", func(t *testing.T, b *harness.Broker, hold *harness.Proc) {
			p := login(t, b, second, "denied", `echo "shell ran"`)
			p.WaitLine(`login refused (on_busy = "deny")`)
			code, _ := p.Wait()
			<-p.OutDone
			if code != 75 || strings.Contains(p.Output(), "shell ran") {
				t.Errorf("denied login: exit %d, output:\n%s", code, p.Output())
			}
		}},
		{"wait 20s", func(t *testing.T, b *harness.Broker, hold *harness.Proc) {
			p := login(t, b, second, "waiting", `echo "got=$NPURUN_DEVICES"; exit 0`)
			waitQueued(t, b, "interactive")
			hold.Stdin.Close()
			p.WaitLine("is yours until you log out")
			p.WaitLine("got=0")
			p.MustSucceed()
		}},
	} {
		t.Run(tt.onBusy, func(t *testing.T) {
			b := harness.StartBroker(t, restrictConf(dev, []harness.TestUser{first, second}, fmt.Sprintf("on_busy = %q\n", tt.onBusy)))
			hold := login(t, b, first, "holder", `echo "held=$NPURUN_DEVICES"; read x; exit 0`)
			hold.WaitLine("held=0")
			tt.check(t, b, hold)
			hold.Stdin.Close()
			hold.Wait()
		})
	}
}

// waitQueued returns once a request waits in pool: a probe asking for the
// pool with --no-wait is then told it is busy with someone ahead. (The
// broker reports a waiter's place only to that waiter.)
func waitQueued(t *testing.T, b *harness.Broker, pool string) {
	t.Helper()
	deadline := time.Now().Add(harness.EventTimeout)
	for {
		c := b.Dial()
		c.Send(&wire.Request{Op: wire.OpAcquire, Pool: pool})
		r, _, err := c.Recv(harness.EventTimeout)
		c.Close()
		if err == nil && r.Type == wire.TypeQueued && r.Position >= 2 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nobody waits in pool %q: %+v %v", pool, r, err)
		}
	}
}

// TestLoginBrokerDown: with no broker answering, npurun --login follows
// the session-policy file the broker wrote: deny refuses a restricted
// login, hide lets it in without a device; an unrestricted one is let be.
func TestLoginBrokerDown(t *testing.T) {
	dev := harness.NewDevTree(t, 2)
	student, staff := harness.NewUser(t), harness.NewUser(t)
	for _, down := range []string{"deny", "hide"} {
		t.Run(down, func(t *testing.T) {
			b := harness.StartBroker(t, restrictConf(dev, []harness.TestUser{student}, fmt.Sprintf("on_broker_down = %q\n", down)))
			data, err := os.ReadFile(filepath.Join(b.RunDir, wire.SessionPolicyFile))
			if err != nil || !strings.Contains(string(data), "on_broker_down "+down) {
				t.Fatalf("session-policy file: %v\n%s", err, data)
			}
			b.Stop()
			p := login(t, b, student, "student", `echo "shell devices=[$NPURUN_DEVICES]"; exit 0`)
			code, _ := p.Wait()
			<-p.OutDone
			out := p.Output()
			switch down {
			case "deny":
				if code != 69 || strings.Contains(out, "shell devices") || !strings.Contains(out, "no login for restricted accounts") {
					t.Errorf("deny: exit %d, output:\n%s", code, out)
				}
			case "hide":
				if code != 0 || !strings.Contains(out, "shell devices=[]") {
					t.Errorf("hide: exit %d, output:\n%s", code, out)
				}
			}
			p = login(t, b, staff, "staff", `echo "staff shell"; exit 0`)
			code, _ = p.Wait()
			<-p.OutDone
			if code != 0 || !strings.Contains(p.Output(), "staff shell") {
				t.Errorf("unrestricted with no broker: exit %d, output:\n%s", code, p.Output())
			}
			// A command (SSH_ORIGINAL_COMMAND) follows the same file.
			p = login(t, b, student, "student command", "", `SSH_ORIGINAL_COMMAND=echo "cmd devices=[$NPURUN_DEVICES]"`)
			code, _ = p.Wait()
			<-p.OutDone
			out = p.Output()
			switch down {
			case "deny":
				if code != 69 || strings.Contains(out, "cmd devices") {
					t.Errorf("deny, a command: exit %d, output:\n%s", code, out)
				}
			case "hide":
				if code != 0 || !strings.Contains(out, "cmd devices=[]") || !strings.Contains(out, "the command runs without a device") {
					t.Errorf("hide, a command: exit %d, output:\n%s", code, out)
				}
			}
			p = login(t, b, staff, "staff command", "", `SSH_ORIGINAL_COMMAND=echo "staff cmd=${NPURUN_DEVICES-unset}"`)
			code, _ = p.Wait()
			<-p.OutDone
			if code != 0 || !strings.Contains(p.Output(), "staff cmd=unset") {
				t.Errorf("unrestricted command with no broker: exit %d, output:\n%s", code, p.Output())
			}
		})
	}
}
