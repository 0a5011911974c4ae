//go:build pamhelper

// Command pamhelper drives the real Linux-PAM stack for the PAM tests: it opens a session of a user with a service file from a directory of the test's own, and says what came of it.
//
// It is the only cgo of the tests (github.com/msteinert/pam/v2), in a
// process of its own, so that a module that crashes or hangs its host
// shows as this process's end, not the test's. It needs the PAM headers
// (libpam0g-dev), which make demo and make test do not: the build tag
// pamhelper keeps it out of go vet ./... and go test ./...; the PAM tests
// build it with -tags pamhelper, and make test vets it where the headers
// are.
//
// Output, one item a line:
//
//	info MESSAGE / error MESSAGE   the module's conversation
//	open ok | open ERROR           pam_open_session's result
//	env NAME=VALUE                 the PAM environment after it
//	held                           (-hold) the session is open; close stdin to end it
//	ran exit N                     (-run) the command's status, after its own output
//	close ok | close ERROR         pam_close_session (unless -no-close)
//	time OPEN_NS                   (-repeat) one line per open_session, in ns
//	leases N                       (-repeat) sessions that got a lease
//	fds N                          (-fds) descriptors open at the end
//
// With -serve SOCKET it is instead a fake broker (run as another user by
// the tests): it listens on SOCKET, prints "listening", and answers every
// request with the packet -reply, until killed.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/msteinert/pam/v2"
)

func main() {
	confDir := flag.String("confdir", "", "directory of PAM service files")
	service := flag.String("service", "", "PAM service")
	user := flag.String("user", "", "user whose session is opened")
	tty := flag.String("tty", "", "PAM_TTY")
	rhost := flag.String("rhost", "", "PAM_RHOST")
	hold := flag.Bool("hold", false, "keep the session open until standard input closes")
	noClose := flag.Bool("no-close", false, "end the handle without pam_close_session")
	repeat := flag.Int("repeat", 1, "open and close the session this many times, timing each open")
	quiet := flag.Bool("quiet", false, "print only time lines and failures")
	countFDs := flag.Bool("fds", false, "at the end, print the number of open descriptors: fds N")
	run := flag.String("run", "", "once the session is open, run this sh command as the user with the PAM environment, as login(1) runs the shell")
	serve := flag.String("serve", "", "be a fake broker listening on this socket instead")
	reply := flag.String("reply", "", "(-serve) the packet answering every request")
	flag.Parse()
	if *serve != "" {
		serveFake(*serve, *reply)
		return
	}

	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	conv := pam.ConversationFunc(func(s pam.Style, msg string) (string, error) {
		switch s {
		case pam.TextInfo:
			if !*quiet {
				fmt.Fprintf(out, "info %s\n", msg)
			}
		case pam.ErrorMsg:
			fmt.Fprintf(out, "error %s\n", msg)
		default:
			return "", fmt.Errorf("no prompts in a session")
		}
		return "", nil
	})
	var times []time.Duration
	leases := 0
	for range *repeat {
		tx, err := pam.StartConfDir(*service, *user, conv, *confDir)
		if err != nil {
			fmt.Fprintf(out, "start %v\n", err)
			out.Flush()
			os.Exit(1)
		}
		if *tty != "" {
			tx.SetItem(pam.Tty, *tty)
		}
		if *rhost != "" {
			tx.SetItem(pam.Rhost, *rhost)
		}
		start := time.Now()
		err = tx.OpenSession(0)
		took := time.Since(start)
		if *repeat > 1 {
			times = append(times, took)
		}
		if err != nil {
			fmt.Fprintf(out, "open %v\n", err)
		} else if !*quiet {
			fmt.Fprintln(out, "open ok")
		}
		if !*quiet {
			env, _ := tx.GetEnvList()
			var names []string
			for k := range env {
				names = append(names, k)
			}
			sort.Strings(names)
			for _, k := range names {
				fmt.Fprintf(out, "env %s=%s\n", k, env[k])
			}
		}
		if v := tx.GetEnv("NPURUN_LEASE"); v != "" {
			leases++
		}
		if *run != "" && err == nil {
			env, _ := tx.GetEnvList()
			out.Flush()
			runAs(out, *user, *run, env)
		}
		if *hold {
			fmt.Fprintln(out, "held")
			out.Flush()
			io.Copy(io.Discard, os.Stdin)
		}
		if err == nil && !*noClose {
			if err := tx.CloseSession(0); err != nil {
				fmt.Fprintf(out, "close %v\n", err)
			} else if !*quiet {
				fmt.Fprintln(out, "close ok")
			}
		}
		tx.End()
		out.Flush()
	}
	for _, d := range times {
		fmt.Fprintf(out, "time %d\n", d.Nanoseconds())
	}
	if *repeat > 1 {
		fmt.Fprintf(out, "leases %d\n", leases)
	}
	if *countFDs {
		entries, _ := os.ReadDir("/proc/self/fd")
		fmt.Fprintf(out, "fds %d\n", len(entries))
	}
}

// runAs runs command with sh as user, its environment this process's
// with env over it, and its output on standard output; it inherits what
// the session's modules left open, as login(1)'s shell does.
func runAs(out *bufio.Writer, name, command string, env map[string]string) {
	u, err := user.Lookup(name)
	if err != nil {
		fmt.Fprintf(out, "ran %v\n", err)
		return
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	cmd := exec.Command("/bin/sh", "-c", command)
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		fmt.Fprintln(out, "ran exit 0")
	case errors.As(err, &ee):
		fmt.Fprintf(out, "ran exit %d\n", ee.ExitCode())
	default:
		fmt.Fprintf(out, "ran %v\n", err)
	}
}

// serveFake listens on socket and answers every request with reply.
func serveFake(socket, reply string) {
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		fmt.Println("listen", err)
		os.Exit(1)
	}
	fmt.Println("listening")
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			os.Exit(1)
		}
		buf := make([]byte, 65536)
		if _, err := c.Read(buf); err == nil {
			c.Write([]byte(reply))
		}
		c.Close()
	}
}
