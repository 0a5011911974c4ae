package shim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/exitcode"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
)

// loginAnswer bounds the wait for the broker's answer to a login, beyond
// the on_busy wait it announces.
const loginAnswer = 10 * time.Second

// LoginService is the service a login session names when npurun --login
// asks for it.
const LoginService = "npurun --login"

// Login is npurun --login, what sshd's ForceCommand runs for a restricted
// account (see pam_npurun(8)). It asks the broker what this session gets
// and carries the answer out. A session that asked for a command, scp or
// sftp (SSH_ORIGINAL_COMMAND set) asks for no lease: the command runs in
// the user's shell as it is for an account the policy does not restrict,
// with every device hidden for one it does. An interactive login asks for
// its login lease and becomes the user's login shell under it, or without
// one where the policy says so (hide), or ends (deny); an unrestricted
// account gets its shell as it is.
func Login(o Options) int {
	shell := os.Getenv("SHELL")
	if !strings.HasPrefix(shell, "/") {
		shell = "/bin/sh"
	}
	argv := []string{"-" + filepath.Base(shell)}
	cmd, isCmd := os.LookupEnv("SSH_ORIGINAL_COMMAND")
	if isCmd {
		argv = []string{filepath.Base(shell), "-c", cmd}
	}
	path := wire.SocketPath(o.Socket)
	r, fds, code := askLogin(o, path, !isCmd)
	switch {
	case code != 0:
		return code
	case r == nil: // no broker: the session-policy file decided to hide
		return execShell(shell, argv, npu.HiddenEnv(), nil)
	case r.Type == wire.TypeIgnore:
		return execShell(shell, argv, nil, nil)
	case r.Type == wire.TypeHide:
		if r.Message != "" {
			warn("%s", r.Message)
		}
		return execShell(shell, argv, r.Env, nil)
	}
	env, placed, err := leaseEnv(r, fds)
	if err != nil {
		warn("%v", err)
		return exitcode.Failure
	}
	if r.Message != "" && !o.Quiet {
		warn("%s", r.Message)
	}
	return execShell(shell, argv, env, placed)
}

// askLogin asks the broker what this session gets: the login lease for an
// interactive login (login), no lease for a command. It returns the reply
// (a grant with its descriptors, ignore or hide), or nil for a session
// without a device because no broker answers, or an exit status.
func askLogin(o Options, path string, login bool) (*wire.Reply, []int, int) {
	c, err := wire.Dial(path)
	if err != nil {
		return brokerDown(path, err, login)
	}
	defer c.Close()
	req := &wire.Request{Op: wire.OpSession, Login: login, Service: LoginService, TTY: ttyName(), RHost: remoteHost()}
	if err := c.Send(req); err != nil {
		return brokerDown(path, err, login)
	}
	w := waiter{o: o, tty: isTerminal(2)}
	deadline := time.Now().Add(loginAnswer)
	for {
		r, fds, err := c.Recv(max(time.Until(deadline), 0))
		var be *wire.Error
		switch {
		case err == nil && r.Type == wire.TypeQueued:
			if r.WaitMS > 0 {
				deadline = time.Now().Add(time.Duration(r.WaitMS)*time.Millisecond + loginAnswer)
				w.waitFor = time.Duration(r.WaitMS) * time.Millisecond
			}
			w.cancelOnSignal()
			w.loginProgress(r)
			continue
		case err == nil && (r.Type == wire.TypeIgnore || r.Type == wire.TypeHide || (r.Type == wire.TypeGrant && login)):
			w.clear()
			return r, fds, 0
		case err == nil:
			w.clear()
			closeFDs(fds)
			warn("unexpected reply %q from the broker", r.Type)
			return nil, nil, exitcode.Failure
		case errors.As(err, &be):
			w.clear()
			return nil, nil, refused(be)
		default:
			w.clear()
			return brokerDown(path, err, login)
		}
	}
}

// brokerDown applies the session-policy file's on_broker_down to a
// session (an interactive login, or a command) that no broker answers:
// for a restricted account, the session without a device (nil reply) or
// none at all; anyone else's goes on as usual.
func brokerDown(path string, why error, login bool) (*wire.Reply, []int, int) {
	without := "logged in without a device"
	if !login {
		without = "the command runs without a device"
	}
	p, err := wire.ReadSessionPolicy(path)
	if err != nil {
		// No policy to go by: nothing restricts this login but the ACLs.
		warn("the broker does not answer (%v); %s", why, without)
		return nil, nil, 0
	}
	if !p.Restricts(wire.Self()) {
		return &wire.Reply{Type: wire.TypeIgnore}, nil, 0
	}
	if p.OnBrokerDown == "deny" {
		warn("the broker does not answer (%v): no login for restricted accounts until it does (on_broker_down = \"deny\")", why)
		return nil, nil, exitcode.Unavailable
	}
	warn("the broker does not answer (%v); %s", why, without)
	return nil, nil, 0
}

// leaseEnv places the descriptors of grant r for the command
// (wire.PlaceLease: at 20 and above, kept across exec) and returns the
// command's environment entries, its variables and NPURUN_LEASE, and the
// placed descriptors.
func leaseEnv(r *wire.Reply, fds []int) ([]string, []int, error) {
	placed, leaseVar, err := wire.PlaceLease(r.Devices, fds)
	if err != nil {
		return nil, nil, err
	}
	return append(append([]string(nil), r.Env...), leaseVar), placed, nil
}

// execShell replaces this process with the shell at path, argv as given
// (a login shell's argv[0] starts with "-"), its environment overridden by
// env.
func execShell(path string, argv, env []string, keep []int) int {
	err := unix.Exec(path, argv, mergeEnv(os.Environ(), env))
	warn("%s: %v", path, err)
	closeFDs(keep)
	return exitcode.NoExec
}

// ttyName is the terminal on standard input, "" if none.
func ttyName() string {
	if !isTerminal(0) {
		return ""
	}
	p, err := os.Readlink("/proc/self/fd/0")
	if err != nil {
		return ""
	}
	return strings.TrimPrefix(p, "/dev/")
}

// remoteHost is the ssh client's address, from SSH_CONNECTION.
func remoteHost() string {
	f := strings.Fields(os.Getenv("SSH_CONNECTION"))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// loginProgress shows a waiting login's place in line.
func (w *waiter) loginProgress(r *wire.Reply) {
	msg := fmt.Sprintf("waiting for a device for this login in pool %q", r.Pool)
	if r.Position > 0 {
		msg += ": " + wire.Ordinal(r.Position) + " in line"
	}
	if w.waitFor > 0 {
		msg += " (at most " + quantity.Duration(w.waitFor) + ")"
	}
	if r.Reason != "" {
		msg += "; " + r.Reason
	}
	w.say(msg)
}
