package access

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// TestBrokerDownRule: while no broker answers, whether an account is
// restricted is one rule read from the session-policy file one way, on both
// sides: the same table of policy files and accounts runs through npurun
// --login (the Go reader, run as the account, its $USER naming another) and
// through pam_npurun.so on the real PAM stack, and each says restricted
// (on_broker_down deny: refused) or not (the session as it is). The
// accounts: alice, in a supplementary group the session itself is not
// given (the user database says so), bob, and root.
func TestBrokerDownRule(t *testing.T) {
	alice, bob := harness.NewUser(t), harness.NewUser(t)
	group, gid := harness.NewGroup(t)
	if out, err := exec.Command("usermod", "-aG", group, alice.Name).CombinedOutput(); err != nil {
		t.Fatalf("usermod: %v: %s", err, out)
	}
	primary, err := user.LookupGroupId(fmt.Sprint(alice.GID))
	if err != nil {
		t.Fatal(err)
	}
	root := harness.TestUser{Name: "root"}
	type want struct{ alice, bob, root bool }
	for _, tc := range []struct {
		name  string
		lines string
		want  want
	}{
		{"user by name and uid", fmt.Sprintf("user %s %d\n", alice.Name, alice.UID), want{alice: true}},
		{"user by name, unknown at start", fmt.Sprintf("user %s -\n", alice.Name), want{alice: true}},
		{"user whose uid is another's name", fmt.Sprintf("user %s %d\n", bob.Name, alice.UID), want{alice: true, bob: true}},
		{"primary group", fmt.Sprintf("group %s %d\n", primary.Name, alice.GID), want{alice: true}},
		{"supplementary group", fmt.Sprintf("group %s %d\n", group, gid), want{alice: true}},
		{"supplementary group, unknown at start", fmt.Sprintf("group %s -\n", group), want{alice: true}},
		{"root never", "user root 0\ngroup root 0\n", want{}},
		{"a user unknown now", "user npurun-nosuchuser -\ngroup npurun-nosuchgroup -\n", want{}},
		{"CRLF and blanks", fmt.Sprintf("\t# comment\r\nuser\t%s  %d \r\n", alice.Name, alice.UID), want{alice: true}},
		{"a fourth field: no file to go by", fmt.Sprintf("user %s %d x\n", alice.Name, alice.UID), want{}},
		{"a signed id: no file to go by", fmt.Sprintf("user %s +%d\n", alice.Name, alice.UID), want{}},
		{"an id past 32 bits: no file to go by", fmt.Sprintf("user %s -\ngroup %s 4294967296\n", alice.Name, group), want{}},
		{"an unknown line: no file to go by", fmt.Sprintf("user %s -\nuserx %s -\n", alice.Name, bob.Name), want{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := harness.SharedDir(t)
			if err := os.WriteFile(filepath.Join(dir, "session-policy"), []byte("on_broker_down deny\n"+tc.lines), 0o644); err != nil {
				t.Fatal(err)
			}
			socket := filepath.Join(dir, "broker.sock") // nothing listens
			conf := harness.PAMService(t, "npurun-rule", "required", "socket="+socket+" timeout=1")
			for _, a := range []struct {
				u     harness.TestUser
				spoof string
				want  bool
				asIs  bool
			}{
				{alice, bob.Name, tc.want.alice, false},
				{bob, alice.Name, tc.want.bob, false},
				{root, alice.Name, tc.want.root, true},
			} {
				cmd := exec.Command(harness.Bins(t).Npurun, "--login")
				if !a.asIs {
					cmd = a.u.As(cmd, dir)
				}
				cmd.Env = append(os.Environ(), "NPURUN_SOCKET="+socket, "SHELL=/bin/sh", "HOME=/", "USER="+a.spoof, "LOGNAME="+a.spoof)
				cmd.Stdin = strings.NewReader("echo shell ran\n")
				code, out := harness.ExitCode(t, cmd)
				goSays := code == 69 && !strings.Contains(out, "shell ran")
				if !goSays && (code != 0 || !strings.Contains(out, "shell ran")) {
					t.Errorf("npurun --login as %s: exit %d, neither refused nor let be:\n%s", a.u.Name, code, out)
				}
				pamOut, _ := harness.RunPAM(t, conf, "npurun-rule", a.u.Name)
				pamSays := !strings.Contains(pamOut, "open ok") && strings.Contains(pamOut, "error npurun: the device broker does not answer")
				if !pamSays && !strings.Contains(pamOut, "open ok") {
					t.Errorf("pam_npurun.so for %s: neither refused nor let be:\n%s", a.u.Name, pamOut)
				}
				if goSays != a.want || pamSays != a.want {
					t.Errorf("%s ($USER=%s): restricted by npurun --login %v, by pam_npurun.so %v, want %v\n--- npurun --login:\n%s--- pam:\n%s",
						a.u.Name, a.spoof, goSays, pamSays, a.want, out, pamOut)
				}
			}
		})
	}
}
