package tests

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

// eventTimeout bounds every wait for an event that must happen; it is long
// so that a slow machine does not fail a correct product, and the event
// itself ends the wait at once.
const eventTimeout = 20 * time.Second

// proc is a started command whose output lines are delivered as events.
type proc struct {
	t     testing.TB
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser

	mu      sync.Mutex
	lines   []string      // stdout and stderr lines, in arrival order
	notify  chan struct{} // closed and replaced on every new line
	outDone chan struct{} // closed when every writer of the output is gone
	done    chan struct{} // closed when the process has exited
	err     error         // cmd.Wait's result
}

// startProc starts cmd with its stdin a pipe and its output watched. The
// output is an os.Pipe of our own, so the process's exit is seen even while
// a child it left behind still holds the pipe.
func startProc(t testing.TB, name string, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{t: t, name: name, cmd: cmd, notify: make(chan struct{}), outDone: make(chan struct{}), done: make(chan struct{})}
	var err error
	if p.stdin, err = cmd.StdinPipe(); err != nil {
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
		defer close(p.outDone)
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
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stdin.Close()
		select {
		case <-p.done:
		default:
			cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// Output is everything the process wrote so far, one line each.
func (p *proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// waitLine waits for an output line containing substr and returns it. It
// fails the test if the process exits first or the line does not come.
func (p *proc) waitLine(substr string) string {
	p.t.Helper()
	deadline := time.After(eventTimeout)
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
		case <-p.outDone:
			p.mu.Lock()
			lines = p.lines
			p.mu.Unlock()
			for ; seen < len(lines); seen++ {
				if strings.Contains(lines[seen], substr) {
					return lines[seen]
				}
			}
			p.t.Fatalf("%s exited (%v) before printing %q; output:\n%s", p.name, p.err, substr, p.Output())
		case <-deadline:
			p.t.Fatalf("%s did not print %q within %s; output:\n%s", p.name, substr, eventTimeout, p.Output())
		}
	}
}

// wait waits for the process to exit and returns its exit status (-1 with
// the signal when killed by one).
func (p *proc) wait() (int, syscall.Signal) {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(eventTimeout):
		p.t.Fatalf("%s did not exit within %s; output:\n%s", p.name, eventTimeout, p.Output())
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		ws := ee.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			return -1, ws.Signal()
		}
		return ws.ExitStatus(), 0
	}
	if p.err != nil {
		p.t.Fatalf("%s: %v", p.name, p.err)
	}
	return 0, 0
}

// mustSucceed waits for the process and fails the test unless it exited 0.
func (p *proc) mustSucceed() {
	p.t.Helper()
	if code, sig := p.wait(); code != 0 || sig != 0 {
		p.t.Fatalf("%s: exit %d signal %v; output:\n%s", p.name, code, sig, p.Output())
	}
}

// exited tells whether the process is gone.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// holder is an npurun whose command keeps its lease until released.
type holder struct{ *proc }

// hold runs `npurun ARGS sh -c 'echo held; read x'` and returns once the
// command runs, i.e. holds its lease.
func hold(t testing.TB, b *Broker, name string, args ...string) holder {
	t.Helper()
	args = append(args, "sh", "-c", `echo "held $NPURUN_DEVICES"; read x; exit 0`)
	p := startProc(t, name, b.Npurun(args...))
	p.waitLine("held")
	return holder{p}
}

// release ends the holder's command and waits for it to be gone.
func (h holder) release() {
	h.t.Helper()
	h.stdin.Close()
	h.mustSucceed()
}

// queue starts an npurun -v ARGS and returns once the broker has told it
// that it waits in line.
func queue(t testing.TB, b *Broker, name string, args ...string) *proc {
	t.Helper()
	p := startProc(t, name, b.Npurun(append([]string{"-v"}, args...)...))
	p.waitLine("npurun: waiting for")
	return p
}

// workload is a workload command line for npurun.
type workload struct {
	Markers, Log string
}

// newWorkload makes a markers directory and a log file that any user may
// write.
func newWorkload(t testing.TB) workload {
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
	w := workload{Markers: markers, Log: filepath.Join(dir, "runs")}
	if err := os.WriteFile(w.Log, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(w.Log, 0o666); err != nil {
		t.Fatal(err)
	}
	return w
}

// args is the workload command for tag, holding its devices for hold.
func (w workload) args(b *Broker, tag string, hold time.Duration) []string {
	return []string{b.Bin.Workload, "-markers", w.Markers, "-log", w.Log, "-tag", tag, "-hold", hold.String()}
}

// run is one line of the workload log.
type run struct {
	Tag        string
	Start, End int64
	UID        int
	Devices    string
}

// runs reads the workload log in the order the runs ended.
func (w workload) runs(t testing.TB) []run {
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

// tags lists the runs' tags in log order.
func tags(runs []run) []string {
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = r.Tag
	}
	return out
}

// exitCode runs cmd to completion and returns its status and combined output.
func exitCode(t testing.TB, cmd *exec.Cmd) (int, string) {
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
