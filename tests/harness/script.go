package harness

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/npurun/npurun/wire"
)

// ScriptParams runs the testscript scripts of dir (scripts of commands as a
// user types them, *.txtar) against the programs built for the test, with
// a broker of the script's own where it starts one. Besides the standard
// commands:
//
//	broker start CONF   start `npubroker serve --cgroup off` on CONF in $WORK, stopped at the end
//	broker kill         kill it with SIGKILL (broker start starts it again)
//	hold NAME ARGS...   run `npurun ARGS... sh -c 'echo held; read x'` until it holds
//	release NAME        end NAME's command, wait for it (it must exit 0), and for the broker to show its lease gone
//	awaitfree           wait for the broker to show no device leased: a lease ends at the
//	                    broker when its lock is let go, a moment after its command exits
//
// The binaries are on PATH, and NPURUN_SOCKET names the broker's socket
// ($WORK/run/broker.sock). A test adds commands of its own to Cmds.
func ScriptParams(t testing.TB, dir string) testscript.Params {
	b := Bins(t)
	return testscript.Params{
		Dir: dir,
		Setup: func(env *testscript.Env) error {
			env.Setenv("PATH", b.Dir+string(os.PathListSeparator)+os.Getenv("PATH"))
			env.Setenv("NPURUN_SOCKET", filepath.Join(env.WorkDir, "run", "broker.sock"))
			env.Values[scriptKey{}] = &scriptState{bin: b.Dir, holders: map[string]*scriptProc{}}
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"broker":    scriptBroker,
			"hold":      scriptHold,
			"release":   scriptRelease,
			"awaitfree": scriptAwaitFree,
		},
	}
}

// scriptKey finds a script's scriptState among its values.
type scriptKey struct{}

// scriptState is one script's processes.
type scriptState struct {
	bin     string
	broker  *scriptProc
	holders map[string]*scriptProc
}

func state(ts *testscript.TestScript) *scriptState { return ts.Value(scriptKey{}).(*scriptState) }

type scriptProc struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	done    chan error
	stopped bool
	err     error // how it exited, once stopped
}

// startScriptProc starts cmd and returns once a line of its output (on the
// stream out gives) contains ready.
func startScriptProc(ts *testscript.TestScript, cmd *exec.Cmd, out func(*exec.Cmd) (io.ReadCloser, error), ready string) *scriptProc {
	p := &scriptProc{cmd: cmd, done: make(chan error, 1)}
	var err error
	p.stdin, err = cmd.StdinPipe()
	ts.Check(err)
	r, err := out(cmd)
	ts.Check(err)
	ts.Check(cmd.Start())
	seen := make(chan struct{})
	var lines strings.Builder
	go func() {
		sc := bufio.NewScanner(r)
		said := false
		for sc.Scan() {
			lines.WriteString(sc.Text() + "\n")
			if !said && strings.Contains(sc.Text(), ready) {
				close(seen)
				said = true
			}
		}
		io.Copy(io.Discard, r)
		p.done <- cmd.Wait()
	}()
	select {
	case <-seen:
	case err := <-p.done:
		ts.Fatalf("%s exited (%v) before saying %q", cmd.Args[0], err, ready)
	case <-time.After(EventTimeout):
		ts.Fatalf("%s did not say %q within %s", cmd.Args[0], ready, EventTimeout)
	}
	return p
}

// stop ends the process (with how, else by closing its standard input) and
// waits for it; a second stop does nothing.
func (p *scriptProc) stop(ts *testscript.TestScript, how os.Signal) {
	if p.stopped {
		return
	}
	p.stopped = true
	if how != nil {
		p.cmd.Process.Signal(how)
	}
	p.stdin.Close()
	select {
	case p.err = <-p.done:
	case <-time.After(EventTimeout):
		p.cmd.Process.Kill()
		ts.Fatalf("%s did not exit within %s", p.cmd.Args[0], EventTimeout)
	}
}

func scriptBroker(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) == 0 {
		ts.Fatalf("usage: broker start CONF | broker kill")
	}
	switch args[0] {
	case "start":
		if len(args) != 2 {
			ts.Fatalf("usage: broker start CONF")
		}
		// --cgroup off: in auto, the default, a broker run as root moves
		// itself into a group below the test's own (or makes /npurun
		// below the root group), the machine's groups, and the scripts'
		// brokers, run side by side, contend for that one parent.
		work := ts.Getenv("WORK")
		cmd := exec.Command(filepath.Join(state(ts).bin, "npubroker"), "serve", "--config", ts.MkAbs(args[1]),
			"--run-dir", filepath.Join(work, "run"), "--state-dir", filepath.Join(work, "spool"), "--cgroup", "off")
		p := startScriptProc(ts, cmd, (*exec.Cmd).StderrPipe, "serving")
		state(ts).broker = p
		ts.Defer(func() { p.stop(ts, os.Interrupt) })
	case "kill":
		p := state(ts).broker
		if p == nil {
			ts.Fatalf("no broker started")
		}
		p.stop(ts, os.Kill)
		state(ts).broker = nil
	default:
		ts.Fatalf("usage: broker start CONF | broker kill")
	}
}

func scriptHold(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 1 {
		ts.Fatalf("usage: hold NAME [NPURUN-ARGS...]")
	}
	cmd := exec.Command(filepath.Join(state(ts).bin, "npurun"), append(args[1:], "sh", "-c", "echo held; read x; exit 0")...)
	cmd.Env = append(os.Environ(), "NPURUN_SOCKET="+ts.Getenv("NPURUN_SOCKET"))
	p := startScriptProc(ts, cmd, (*exec.Cmd).StdoutPipe, "held")
	state(ts).holders[args[0]] = p
	ts.Defer(func() { p.stop(ts, os.Kill) })
}

func scriptRelease(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 || state(ts).holders[args[0]] == nil {
		ts.Fatalf("usage: release NAME (of a hold)")
	}
	p := state(ts).holders[args[0]]
	p.stop(ts, nil)
	delete(state(ts).holders, args[0])
	if p.err != nil {
		ts.Fatalf("%s: %v", args[0], p.err)
	}
	pid := p.cmd.Process.Pid
	awaitBoard(ts, fmt.Sprintf("a lease of pid %d", pid), func(d wire.DeviceState) bool { return d.Lease != nil && d.Lease.PID == pid })
}

func scriptAwaitFree(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 0 {
		ts.Fatalf("usage: awaitfree")
	}
	awaitBoard(ts, "a lease", func(d wire.DeviceState) bool { return d.Lease != nil })
}

// awaitBoard waits, through a status watch, for the broker to show no
// device of which leased is true (what names such a lease): a holder's
// exit reaches the broker through its lock's release, after the holder's
// parent has seen it.
func awaitBoard(ts *testscript.TestScript, what string, leased func(wire.DeviceState) bool) {
	cmd := exec.Command(filepath.Join(state(ts).bin, "npubroker"), "status", "--watch", "--json")
	cmd.Env = append(os.Environ(), "NPURUN_SOCKET="+ts.Getenv("NPURUN_SOCKET"))
	out, err := cmd.StdoutPipe()
	ts.Check(err)
	ts.Check(cmd.Start())
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	gone := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<22)
		for sc.Scan() {
			var b wire.Board
			if err := json.Unmarshal(sc.Bytes(), &b); err != nil {
				gone <- fmt.Errorf("status --watch --json printed a line that does not parse: %v", err)
				return
			}
			if !slices.ContainsFunc(b.Devices, leased) {
				gone <- nil
				return
			}
		}
		gone <- fmt.Errorf("status --watch ended: %v", sc.Err())
	}()
	select {
	case err := <-gone:
		ts.Check(err)
	case <-time.After(EventTimeout):
		ts.Fatalf("the broker still shows %s %s after it ended", what, EventTimeout)
	}
}
