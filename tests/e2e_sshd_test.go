package tests

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// loginUser is a test account one can log in as: a home and a shell.
func loginUser(t *testing.T) testUser {
	t.Helper()
	needRoot(t)
	buf := make([]byte, 4)
	rand.Read(buf)
	name := "npurun-t" + hex.EncodeToString(buf)
	if out, err := exec.Command("useradd", "--create-home", "--shell", "/bin/sh", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", "--remove", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v: %s", name, err, out)
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return testUser{Name: name, UID: uint32(uid), GID: uint32(gid)}
}

// sshServer is a copy of the system's sshd under a name of its own (sshd
// takes its PAM service name from its program name), with its own
// configuration, host key, port on 127.0.0.1 and /etc/pam.d file. The
// machine's own sshd and its files are never touched.
type sshServer struct {
	Dir, Port, Key string
	keysDir        string
	pub            []byte
	proc           *proc
}

// startSSHD starts the server: pam_npurun.so in its session stack (mark
// mode, as for sshd), and `ForceCommand npurun --login` for the restricted
// users.
func startSSHD(t *testing.T, b *Broker, restricted ...testUser) *sshServer {
	t.Helper()
	needRoot(t)
	sshd, err := exec.LookPath("sshd")
	if err != nil {
		sshd = "/usr/sbin/sshd"
	}
	needTool(t, "openssh-server", sshd)
	needTool(t, "openssh-client", "ssh", "ssh-keygen")
	dir := SharedDir(t)
	buf := make([]byte, 4)
	rand.Read(buf)
	name := "npurun-tsshd-" + hex.EncodeToString(buf)
	bin := filepath.Join(dir, name)
	copyFile(t, sshd, bin, 0o755)

	pamFile := filepath.Join("/etc/pam.d", name)
	pamLines := fmt.Sprintf(`# npurun test, removed when the test ends
auth     required pam_permit.so
account  required pam_permit.so
password required pam_deny.so
session  required %s socket=%s debug
session  required pam_permit.so
`, pamBins(t).Module, b.Socket)
	if err := os.WriteFile(pamFile, []byte(pamLines), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(pamFile) })
	if _, err := os.Stat("/run/sshd"); errors.Is(err, os.ErrNotExist) {
		if err := os.Mkdir("/run/sshd", 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove("/run/sshd") })
	}

	s := &sshServer{Dir: dir, Key: filepath.Join(dir, "client_key")}
	hostKey := filepath.Join(dir, "host_key")
	for _, k := range []string{hostKey, s.Key} {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", k).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen: %v: %s", err, out)
		}
	}
	pub, err := os.ReadFile(s.Key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(dir, "keys")
	if err := os.Mkdir(keys, 0o755); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, u := range restricted {
		names = append(names, u.Name)
	}
	s.Port = freePort(t)
	config := fmt.Sprintf(`Port %s
ListenAddress 127.0.0.1
HostKey %s
PidFile %s
AuthorizedKeysFile %s/%%u
StrictModes no
UsePAM yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin no
SetEnv NPURUN_SOCKET=%s
Subsystem sftp /usr/lib/openssh/sftp-server
Match User %s
	ForceCommand %s --login
`, s.Port, hostKey, filepath.Join(dir, "sshd.pid"), keys, b.Socket, strings.Join(names, ","), b.Bin.Npurun)
	conf := filepath.Join(dir, "sshd_config")
	if err := os.WriteFile(conf, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	s.keysDir = keys
	s.pub = pub
	cmd := exec.Command(bin, "-D", "-e", "-f", conf)
	cmd.Env = pamHostEnv(t)
	s.proc = startProc(t, name, cmd)
	s.proc.waitLine("Server listening on 127.0.0.1 port " + s.Port)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sshd log:\n%s", s.proc.Output())
		}
	})
	return s
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// allow lets u log in with the client key.
func (s *sshServer) allow(t *testing.T, u testUser) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(s.keysDir, u.Name), s.pub, 0o644); err != nil {
		t.Fatal(err)
	}
}

// ssh prepares an ssh client command to u@127.0.0.1 with options, and
// a remote command if there is one.
func (s *sshServer) ssh(u testUser, options []string, command ...string) *exec.Cmd {
	args := []string{"-F", "/dev/null", "-i", s.Key, "-p", s.Port,
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
		"-o", "LogLevel=ERROR", "-o", "ConnectTimeout=20"}
	args = append(append(args, options...), u.Name+"@127.0.0.1")
	return exec.Command("ssh", append(args, command...)...)
}

var tty = []string{"-tt"}

// interactive starts `ssh -tt` (a login shell on a terminal) and returns it;
// lines written to its stdin are typed into the shell.
func (s *sshServer) interactive(t *testing.T, u testUser, name string) *proc {
	t.Helper()
	return startProc(t, name, s.ssh(u, tty))
}

func typeLine(t *testing.T, p *proc, line string) {
	t.Helper()
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		t.Fatal(err)
	}
}

// fdCount is how many descriptors process pid has open.
func fdCount(t *testing.T, pid int) int {
	t.Helper()
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// TestSSHD: a real sshd with pam_npurun.so and npurun --login as
// ForceCommand: an interactive login (ssh -tt) gets the login lease and
// opens its node; `ssh host CMD` gets none and cannot; sftp works; a second restricted
// login is refused (on_busy = "deny"); logout frees the device; 20 logins
// in a row leak no lease and no descriptor in sshd.
func TestSSHD(t *testing.T) {
	dev := newDevTree(t, 2)
	student, other := loginUser(t), loginUser(t)
	b := StartBroker(t, restrictConf(dev, []testUser{student, other}, "on_busy = \"deny\"\n"))
	s := startSSHD(t, b, student, other)
	s.allow(t, student)
	s.allow(t, other)
	node := dev.node("davinci0")

	// A command: no lease, devices hidden, the node closed, the device
	// left free. (Access is the account's: while the same account holds a
	// lease in another session, its commands reach that lease's device too.)
	code, out := exitCode(t, s.ssh(student, nil, `echo "CMD=[$NPURUN_DEVICES] LEASE=[$NPURUN_LEASE]"; (exec 3<>`+node+`) 2>/dev/null && echo OPENED || echo CLOSED`))
	if code != 0 || !strings.Contains(out, "CMD=[] LEASE=[]") || !strings.Contains(out, "CLOSED") {
		t.Errorf("ssh host CMD: exit %d: %s", code, out)
	}

	// sftp (and so scp) goes through the wrapper as a command.
	sftp := exec.Command("sftp", "-F", "/dev/null", "-i", s.Key, "-P", s.Port, "-b", "-",
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
		student.Name+"@127.0.0.1")
	sftp.Stdin = strings.NewReader("pwd\n")
	if code, out := exitCode(t, sftp); code != 0 || !strings.Contains(out, "Remote working directory: /home/"+student.Name) {
		t.Errorf("sftp: exit %d: %s", code, out)
	}

	// An interactive login: the lease, its variables, its node.
	p := s.interactive(t, student, "ssh -tt")
	p.waitLine("is yours until you log out")
	typeLine(t, p, `echo "DEV=[$NPURUN_DEVICES]"; exec 3<>`+node+` && echo "OPENED"`)
	p.waitLine("DEV=[0]")
	p.waitLine("OPENED")

	// A second restricted login while the login pool is taken.
	code, out = exitCode(t, s.ssh(other, tty))
	if code == 0 || !strings.Contains(out, `login refused (on_busy = "deny")`) {
		t.Errorf("second login: exit %d: %s", code, out)
	}

	// Logout frees the device.
	typeLine(t, p, "exit")
	p.wait()
	waitFree(t, b, 0)
	if canOpen(t, student, node) {
		t.Error("after logout the node still opens")
	}

	// 20 logins in a row: each gets the device, none keeps it, and sshd
	// keeps no descriptor from them.
	listener := s.proc.cmd.Process.Pid
	before := fdCount(t, listener)
	for i := range 20 {
		cmd := s.ssh(student, tty)
		cmd.Stdin = strings.NewReader(`echo "ROUND=[$NPURUN_DEVICES]"; exit` + "\n")
		if code, out := exitCode(t, cmd); code != 0 || !strings.Contains(out, "ROUND=[0]") {
			t.Fatalf("login %d: exit %d: %s", i+1, code, out)
		}
		waitFree(t, b, 0)
	}
	if after := fdCount(t, listener); after != before {
		t.Errorf("sshd had %d descriptors before 20 logins and %d after", before, after)
	}
}
