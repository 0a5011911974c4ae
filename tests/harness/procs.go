package harness

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// EventTimeout bounds every wait for an event that must happen; it is long
// so that a slow machine does not fail a correct product, and the event
// itself ends the wait at once.
const EventTimeout = 20 * time.Second

// Proc is a started command whose output lines are delivered as events.
type Proc struct {
	t     testing.TB
	Name  string
	Cmd   *exec.Cmd
	Stdin io.WriteCloser

	mu      sync.Mutex
	lines   []string      // stdout and stderr lines, in arrival order
	notify  chan struct{} // closed and replaced on every new line
	OutDone chan struct{} // closed when every writer of the output is gone
	Done    chan struct{} // closed when the process has exited
	Err     error         // cmd.Wait's result
}

// StartProc starts cmd with its stdin a pipe and its output watched. The
// output is an os.Pipe of our own, so the process's exit is seen even while
// a child it left behind still holds the pipe.
func StartProc(t testing.TB, name string, cmd *exec.Cmd) *Proc {
	t.Helper()
	p := &Proc{t: t, Name: name, Cmd: cmd, notify: make(chan struct{}), OutDone: make(chan struct{}), Done: make(chan struct{})}
	var err error
	if p.Stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		t.Fatalf("%s: %v", name, err)
	}
	go func() {
		defer close(p.OutDone)
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			close(p.notify)
			p.notify = make(chan struct{})
			p.mu.Unlock()
		}
	}()
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.Err = err
		p.mu.Unlock()
		close(p.Done)
	}()
	t.Cleanup(func() {
		p.Stdin.Close()
		select {
		case <-p.Done:
		default:
			cmd.Process.Kill()
			<-p.Done
		}
	})
	return p
}

// Output is everything the process wrote so far, one line each.
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// WaitLine waits for an output line containing substr and returns it. It
// fails the test if the process exits first or the line does not come.
func (p *Proc) WaitLine(substr string) string {
	p.t.Helper()
	deadline := time.After(EventTimeout)
	for seen := 0; ; {
		p.mu.Lock()
		lines, ch := p.lines, p.notify
		p.mu.Unlock()
		for ; seen < len(lines); seen++ {
			if strings.Contains(lines[seen], substr) {
				return lines[seen]
			}
		}
		select {
		case <-ch:
		case <-p.OutDone:
			p.mu.Lock()
			lines = p.lines
			p.mu.Unlock()
			for ; seen < len(lines); seen++ {
				if strings.Contains(lines[seen], substr) {
					return lines[seen]
				}
			}
			p.t.Fatalf("%s exited (%v) before printing %q; output:\n%s", p.Name, p.Err, substr, p.Output())
		case <-deadline:
			p.t.Fatalf("%s did not print %q within %s; output:\n%s", p.Name, substr, EventTimeout, p.Output())
		}
	}
}

// Wait waits for the process to exit and returns its exit status (-1 with
// the signal when killed by one).
func (p *Proc) Wait() (int, syscall.Signal) {
	p.t.Helper()
	select {
	case <-p.Done:
	case <-time.After(EventTimeout):
		p.t.Fatalf("%s did not exit within %s; output:\n%s", p.Name, EventTimeout, p.Output())
	}
	// Its exit comes before the reader has taken its last lines from the
	// pipe: wait for the pipe's end, so that Output after Wait has all it
	// printed (TestLeaseInFlightTask once missed the last line so). A
	// process that leaves a child holding the pipe gets a second.
	select {
	case <-p.OutDone:
	case <-time.After(time.Second):
	}
	var ee *exec.ExitError
	if errors.As(p.Err, &ee) {
		ws := ee.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			return -1, ws.Signal()
		}
		return ws.ExitStatus(), 0
	}
	if p.Err != nil {
		p.t.Fatalf("%s: %v", p.Name, p.Err)
	}
	return 0, 0
}

// MustSucceed waits for the process and fails the test unless it exited 0.
func (p *Proc) MustSucceed() {
	p.t.Helper()
	if code, sig := p.Wait(); code != 0 || sig != 0 {
		p.t.Fatalf("%s: exit %d signal %v; output:\n%s", p.Name, code, sig, p.Output())
	}
}

// Exited tells whether the process is gone.
func (p *Proc) Exited() bool {
	select {
	case <-p.Done:
		return true
	default:
		return false
	}
}

// Holder is an npurun whose command keeps its lease until released.
type Holder struct{ *Proc }

// Hold runs `npurun ARGS sh -c 'echo held; read x'` and returns once the
// command runs, i.e. holds its lease.
func Hold(t testing.TB, b *Broker, name string, args ...string) Holder {
	t.Helper()
	args = append(args, "sh", "-c", `echo "held $NPURUN_DEVICES"; read x; exit 0`)
	p := StartProc(t, name, b.Npurun(args...))
	p.WaitLine("held")
	return Holder{p}
}

// Release ends the holder's command and waits for it to be gone.
func (h Holder) Release() {
	h.t.Helper()
	h.Stdin.Close()
	h.MustSucceed()
}

// Queue starts an npurun -v ARGS and returns once the broker has told it
// that it waits in line.
func Queue(t testing.TB, b *Broker, name string, args ...string) *Proc {
	t.Helper()
	p := StartProc(t, name, b.Npurun(append([]string{"-v"}, args...)...))
	p.WaitLine("npurun: waiting for")
	return p
}

// Workload is a workload command line for npurun.
type Workload struct {
	Markers, Log string
}

// NewWorkload makes a markers directory and a log file that any user may
// write.
func NewWorkload(t testing.TB) Workload {
	t.Helper()
	dir := filepath.Join(SharedDir(t), "w")
	markers := filepath.Join(dir, "markers")
	if err := os.MkdirAll(markers, 0o777); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, markers} {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	w := Workload{Markers: markers, Log: filepath.Join(dir, "runs")}
	if err := os.WriteFile(w.Log, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(w.Log, 0o666); err != nil {
		t.Fatal(err)
	}
	return w
}

// Args is the workload command for tag, holding its devices for hold.
func (w Workload) Args(b *Broker, tag string, hold time.Duration) []string {
	return []string{b.Bin.Workload, "-markers", w.Markers, "-log", w.Log, "-tag", tag, "-hold", hold.String()}
}

// run is one line of the workload log.
type run struct {
	Tag        string
	Start, End int64
	UID        int
	Devices    string
}

// Runs reads the workload log in the order the runs ended.
func (w Workload) Runs(t testing.TB) []run {
	t.Helper()
	data, err := os.ReadFile(w.Log)
	if err != nil {
		t.Fatal(err)
	}
	var out []run
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 {
			t.Fatalf("bad log line %q", line)
		}
		var r run
		r.Tag = f[0]
		r.Start, _ = strconv.ParseInt(f[1], 10, 64)
		r.End, _ = strconv.ParseInt(f[2], 10, 64)
		r.UID, _ = strconv.Atoi(f[3])
		if len(f) > 4 {
			r.Devices = f[4]
		}
		out = append(out, r)
	}
	return out
}

// Tags lists the runs' tags in log order.
func Tags(runs []run) []string {
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = r.Tag
	}
	return out
}

// ExitCode runs cmd to completion and returns its status and combined output.
func ExitCode(t testing.TB, cmd *exec.Cmd) (int, string) {
	t.Helper()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	default:
		t.Fatalf("%v: %v", cmd.Args, err)
		return 0, ""
	}
}

// ScanTimeout bounds a wait for what the background scan finds: two scans
// (seen, then past its grace), which the scan's pacing by its own CPU time
// spaces out on a loaded machine with many processes.
const ScanTimeout = 3 * EventTimeout

// InMountNS runs script with sh in a mount namespace of its own (unshare
// -m: what it mounts there the machine does not see), as root.
func InMountNS(t *testing.T, env []string, script string, args ...string) *exec.Cmd {
	t.Helper()
	NeedRoot(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Fatal("unshare (util-linux) is needed")
	}
	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "sh", "-ec", script, "sh"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

// Opener writes a script that closes the lease's lock descriptor if it
// has one (NPURUN_LEASE=DEV:FD), opens the device node $1 at descriptor 8,
// says "open NODE PID" and becomes `sleep 600`, keeping the node open.
// It is a bash script: the lease lies at 20 or above, and a POSIX sh such
// as dash names only descriptors 0 to 9 in a redirection.
func Opener(t testing.TB) string {
	t.Helper()
	p := filepath.Join(SharedDir(t), "opener.sh")
	script := `#!/bin/bash
if [ -n "$NPURUN_LEASE" ]; then
	fd=${NPURUN_LEASE#*:}
	eval "exec ${fd%%,*}<&-"
	[ -e /proc/$$/fd/${fd%%,*} ] && { echo "lock descriptor ${fd%%,*} still open"; exit 1; }
fi
exec 8<"$1"
echo "open $1 $$"
exec sleep 600
`
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// OpenedPID returns the pid that the opener of node said.
func OpenedPID(t testing.TB, p *Proc, node string) int {
	t.Helper()
	return PIDOf(t, p.WaitLine("open "+node+" "))
}
