package access

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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// loginUser is a test account one can log in as: a home, and shell as
// its login shell.
func loginUser(t *testing.T, shell string) harness.TestUser {
	t.Helper()
	harness.NeedRoot(t)
	buf := make([]byte, 4)
	rand.Read(buf)
	name := "npurun-t" + hex.EncodeToString(buf)
	if out, err := exec.Command("useradd", "--create-home", "--shell", shell, name).CombinedOutput(); err != nil {
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
	// An account that has logged in before: without a start-up file of
	// its own an interactive zsh stops at its new-user menu, and a first
	// interactive fish starts generating completions from the man pages
	// in the background, a process of the login that holds its lease
	// until it is done.
	var made []string
	switch filepath.Base(shell) {
	case "zsh":
		rc := filepath.Join(u.HomeDir, ".zshrc")
		if err := os.WriteFile(rc, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		made = append(made, rc)
	case "fish":
		for _, d := range []string{".local", ".local/share", ".local/share/fish", ".local/share/fish/generated_completions"} {
			d = filepath.Join(u.HomeDir, d)
			if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				t.Fatal(err)
			}
			made = append(made, d)
		}
	}
	for _, p := range made {
		if err := os.Chown(p, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	return harness.TestUser{Name: name, UID: uint32(uid), GID: uint32(gid)}
}

// sshServer is a copy of the system's sshd under a name of its own (sshd
// takes its PAM service name from its program name), with its own
// configuration, host key, port on 127.0.0.1 and /etc/pam.d file. The
// machine's own sshd and its files are never touched.
type sshServer struct {
	Dir, Port, Key string
	keysDir        string
	pub            []byte
	proc           *harness.Proc
}

// startSSHD starts the server: pam_npurun.so in its session stack (mark
// mode, as for sshd), and `ForceCommand npurun --login` for the users
// forced (the restricted ones, as pam_npurun(8) has it, and any other a
// test adds).
func startSSHD(t *testing.T, b *harness.Broker, forced ...harness.TestUser) *sshServer {
	t.Helper()
	harness.NeedRoot(t)
	sshd, err := exec.LookPath("sshd")
	if err != nil {
		sshd = "/usr/sbin/sshd"
	}
	harness.NeedTool(t, "openssh-server", sshd)
	harness.NeedTool(t, "openssh-client", "ssh", "ssh-keygen")
	dir := harness.SharedDir(t)
	buf := make([]byte, 4)
	rand.Read(buf)
	name := "npurun-tsshd-" + hex.EncodeToString(buf)
	bin := filepath.Join(dir, name)
	harness.CopyFile(t, sshd, bin, 0o755)

	pamFile := filepath.Join("/etc/pam.d", name)
	pamLines := fmt.Sprintf(`# npurun test, removed when the test ends
auth     required pam_permit.so
account  required pam_permit.so
password required pam_deny.so
session  required %s socket=%s debug
session  required pam_permit.so
`, harness.PAMBins(t).Module, b.Socket)
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
	for _, u := range forced {
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
	cmd.Env = harness.PAMHostEnv(t)
	s.proc = harness.StartProc(t, name, cmd)
	s.proc.WaitLine("Server listening on 127.0.0.1 port " + s.Port)
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
func (s *sshServer) allow(t *testing.T, u harness.TestUser) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(s.keysDir, u.Name), s.pub, 0o644); err != nil {
		t.Fatal(err)
	}
}

// ssh prepares an ssh client command to u@127.0.0.1 with options, and
// a remote command if there is one.
func (s *sshServer) ssh(u harness.TestUser, options []string, command ...string) *exec.Cmd {
	args := []string{"-F", "/dev/null", "-i", s.Key, "-p", s.Port,
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
		"-o", "LogLevel=ERROR", "-o", "ConnectTimeout=20"}
	args = append(append(args, options...), u.Name+"@127.0.0.1")
	return exec.Command("ssh", append(args, command...)...)
}

var tty = []string{"-tt"}

// interactive starts `ssh -tt` (a login shell on a terminal) and returns it;
// lines written to its stdin are typed into the shell.
func (s *sshServer) interactive(t *testing.T, u harness.TestUser, name string) *harness.Proc {
	t.Helper()
	return harness.StartProc(t, name, s.ssh(u, tty))
}

func typeLine(t *testing.T, p *harness.Proc, line string) {
	t.Helper()
	if _, err := io.WriteString(p.Stdin, line+"\n"); err != nil {
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
// ForceCommand, bash accounts: an interactive login (ssh -tt) gets the
// login lease and opens its node; `ssh host CMD` gets none and cannot,
// and an unrestricted account's command sent through npurun --login runs
// as it is; sftp works; a second restricted login is refused (on_busy =
// "deny"); logout frees the device; 20 logins in a row leak no lease and
// no descriptor in sshd.
func TestSSHD(t *testing.T) {
	dev := harness.NewDevTree(t, 2)
	student, other, staff := loginUser(t, "/bin/bash"), loginUser(t, "/bin/bash"), loginUser(t, "/bin/bash")
	b := harness.StartBroker(t, restrictConf(dev, []harness.TestUser{student, other}, "on_busy = \"deny\"\n"))
	s := startSSHD(t, b, student, other, staff)
	s.allow(t, student)
	s.allow(t, other)
	s.allow(t, staff)
	node := dev.Node("davinci0")

	// A command: no lease, devices hidden, the node closed, the device
	// left free. (Access is the account's: while the same account holds a
	// lease in another session, its commands reach that lease's device too.)
	code, out := harness.ExitCode(t, s.ssh(student, nil, `echo "CMD=[$NPURUN_DEVICES] LEASE=[$NPURUN_LEASE]"; (exec 3<>`+node+`) 2>/dev/null && echo OPENED || echo CLOSED`))
	if code != 0 || !strings.Contains(out, "CMD=[] LEASE=[]") || !strings.Contains(out, "CLOSED") {
		t.Errorf("ssh host CMD: exit %d: %s", code, out)
	}
	// An account the policy does not restrict, sent through npurun
	// --login all the same: its command runs as it is, nothing hidden
	// (npurun(1): an account that is not restricted gets its shell as it
	// is), here with no device variable at all.
	code, out = harness.ExitCode(t, s.ssh(staff, nil, `echo "CMD=[${NPURUN_DEVICES-unset}] ASCEND=[${ASCEND_RT_VISIBLE_DEVICES-unset}] CUDA=[${CUDA_VISIBLE_DEVICES-unset}]"`))
	if code != 0 || !strings.Contains(out, "CMD=[unset] ASCEND=[unset] CUDA=[unset]") {
		t.Errorf("ssh host CMD as an unrestricted account: exit %d, want its command as it is: %s", code, out)
	}

	// sftp (and so scp) goes through the wrapper as a command.
	sftp := exec.Command("sftp", "-F", "/dev/null", "-i", s.Key, "-P", s.Port, "-b", "-",
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
		student.Name+"@127.0.0.1")
	sftp.Stdin = strings.NewReader("pwd\n")
	if code, out := harness.ExitCode(t, sftp); code != 0 || !strings.Contains(out, "Remote working directory: /home/"+student.Name) {
		t.Errorf("sftp: exit %d: %s", code, out)
	}

	// An interactive login: the lease, its variables, its node.
	p := s.interactive(t, student, "ssh -tt")
	p.WaitLine("is yours until you log out")
	typeLine(t, p, `echo "DEV=[$NPURUN_DEVICES]"; exec 3<>`+node+` && echo "OPENED"`)
	p.WaitLine("DEV=[0]")
	p.WaitLine("OPENED")

	// A second restricted login while the login pool is taken.
	code, out = harness.ExitCode(t, s.ssh(other, tty))
	if code == 0 || !strings.Contains(out, `login refused (on_busy = "deny")`) {
		t.Errorf("second login: exit %d: %s", code, out)
	}

	// Logout frees the device.
	typeLine(t, p, "exit")
	p.Wait()
	harness.WaitFree(t, b, 0)
	if harness.CanOpen(t, student, node) {
		t.Error("after logout the node still opens")
	}

	// 20 logins in a row: each gets the device, none keeps it, and sshd
	// keeps no descriptor from them.
	listener := s.proc.Cmd.Process.Pid
	before := fdCount(t, listener)
	for i := range 20 {
		cmd := s.ssh(student, tty)
		cmd.Stdin = strings.NewReader(`echo "ROUND=[$NPURUN_DEVICES]"; exit` + "\n")
		if code, out := harness.ExitCode(t, cmd); code != 0 || !strings.Contains(out, "ROUND=[0]") {
			t.Fatalf("login %d: exit %d: %s", i+1, code, out)
		}
		harness.WaitFree(t, b, 0)
	}
	if after := fdCount(t, listener); after != before {
		t.Errorf("sshd had %d descriptors before 20 logins and %d after", before, after)
	}
}

// loginShell is a shell users have as their login shell, and how it
// writes the last command's exit status.
type loginShell struct{ name, status string }

// loginShells are the shells the lease must survive: bash marks
// descriptors 3 to 19 close-on-exec as an interactive login shell; zsh
// and fish leave inherited ones as they are.
var loginShells = []loginShell{{"bash", "$?"}, {"zsh", "$?"}, {"fish", "$status"}}

// shellPath finds a shell, or says why not: in CI, where .ci/run installs
// every shell of loginShells, a missing one fails the test.
func shellPath(t *testing.T, name string) (string, bool) {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p, true
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("no %s (.ci/run installs it): %v", name, err)
	}
	return "", false
}

// TestSSHDShells: a restricted account whose login shell is bash, zsh or
// fish logs in through sshd and npurun --login; with max_devices = 1, an
// npurun in the login runs at once in the login lease (the same device,
// no second lease), and a process left running at logout (setsid -f)
// keeps the device, the broker showing it held by that process, until it
// ends.
func TestSSHDShells(t *testing.T) {
	dev := harness.NewDevTree(t, 2)
	var shells []loginShell
	var users []harness.TestUser
	for _, sh := range loginShells {
		path, ok := shellPath(t, sh.name)
		if !ok {
			t.Logf("no %s here: not tested", sh.name)
			continue
		}
		shells = append(shells, sh)
		users = append(users, loginUser(t, path))
	}
	// A process left at logout is outside the login's tree: the broker
	// finds it holding the lease in its next full look at /proc.
	b := harness.StartBroker(t, restrictConf(dev, users, "")+"\n[limits]\nmax_devices = 1\n\n[status]\nscan_interval = \"1s\"\n")
	s := startSSHD(t, b, users...)
	for i, sh := range shells {
		t.Run(sh.name, func(t *testing.T) {
			u := users[i]
			s.allow(t, u)
			p := s.interactive(t, u, "ssh -tt "+sh.name)
			p.WaitLine("is yours until you log out")

			// The marker words are split in what is typed, which the
			// terminal echoes, so that only the commands' output matches.
			typeLine(t, p, b.Bin.Npurun+` -v --timeout 5s sh -c 'echo "NEST""ED=[$NPURUN_DEVICES]"'; echo "R""C=[`+sh.status+`]"`)
			rc := p.WaitLine("RC=[")
			if out := p.Output(); !strings.Contains(rc, "RC=[0]") || !strings.Contains(out, "NESTED=[0]") || !strings.Contains(out, "inside a lease") {
				t.Errorf("npurun in the login: %q, want RC=[0] and its command run in the login lease; output:\n%s", rc, out)
			}

			typeLine(t, p, `setsid -f sh -c 'echo "SLEEP""ER=[$$]"; exec sleep 1000 </dev/null >/dev/null 2>&1'`)
			line := p.WaitLine("SLEEPER=[")
			pid, err := strconv.Atoi(line[strings.Index(line, "SLEEPER=[")+len("SLEEPER=[") : strings.LastIndex(line, "]")])
			if err != nil {
				t.Fatalf("sleeper pid in %q: %v", line, err)
			}
			t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
			typeLine(t, p, "exit")
			p.Wait()

			// The shell is gone; the process it left holds the lease.
			if code, out := harness.ExitCode(t, b.Npurun("--no-wait", "-d", "0", "true")); code != 75 {
				t.Fatalf("npu 0 after logout with a process left running: exit %d, want 75 (held); output:\n%s", code, out)
			}
			w := harness.WatchBoards(t, b, nil)
			w.Next(fmt.Sprintf("npu 0 held by the sleeper %d", pid), func(bd *wire.Board) bool {
				return slices.Contains(harness.HolderPIDs(bd, 0), pid)
			})
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			harness.WaitFree(t, b, 0)
		})
	}
}
