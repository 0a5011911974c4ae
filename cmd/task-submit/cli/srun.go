package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/cluster"
	"github.com/npurun/npurun/internal/clusterconf"
	"github.com/npurun/npurun/internal/exitcode"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/wire"
)

// npurun on a login node is `task-submit __npurun OPTIONS -- COMMAND`
// (shim/cluster.go): the command runs through srun, which blocks as
// npurun does. srun relays the command's output and its signals, and
// exits with its status (128+N for signal N); this side adds npurun's
// progress line (the place in Slurm's line while the job waits) and
// cancels the job on Ctrl-C (srun --quit-on-interrupt; the job is
// scancelled too where srun named it).

// srunOptions are what npurun passes.
type srunOptions struct {
	req     cluster.Request
	noWait  bool
	timeout time.Duration
	verbose bool
	quiet   bool
	argv    []string
}

// parseSrun reads __npurun's arguments, as shim.runCluster writes them.
func parseSrun(args []string) (*srunOptions, error) {
	o := &srunOptions{req: cluster.Request{N: 1}}
	for i := 0; i < len(args); i++ {
		a := args[i]
		value := func() (string, error) {
			if i+1 == len(args) {
				return "", fmt.Errorf("%s needs a value", a)
			}
			i++
			return args[i], nil
		}
		var err error
		var v string
		switch a {
		case "--":
			o.argv = args[i+1:]
			if len(o.argv) == 0 {
				return nil, errors.New("no command given")
			}
			return o, nil
		case "-n":
			if v, err = value(); err == nil {
				o.req.N, err = strconv.Atoi(v)
			}
		case "-p":
			o.req.Pool, err = value()
		case "-m":
			if v, err = value(); err == nil {
				o.req.Mem, err = quantity.ParseSize(v)
			}
		case "--time":
			var d time.Duration
			if v, err = value(); err == nil {
				d, err = quantity.ParseDuration(v)
				o.req.TimeSec = int64((d + time.Second - 1) / time.Second)
			}
		case "--no-device":
			o.req.N = 0
		case "--no-wait":
			o.noWait = true
		case "--timeout":
			if v, err = value(); err == nil {
				o.timeout, err = quantity.ParseDuration(v)
			}
		case "-v":
			o.verbose = true
		case "-q":
			o.quiet = true
		default:
			err = fmt.Errorf("unknown argument %q", a)
		}
		if err != nil {
			return nil, err
		}
	}
	return nil, errors.New("no command given")
}

// npurunWarn and npurunHint speak as npurun: the user ran npurun.
func npurunWarn(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "npurun: "+format+"\n", args...)
}

// runSrun is __npurun: the exit status of the command run through srun.
func runSrun(args []string) int {
	o, err := parseSrun(args)
	if err != nil {
		npurunWarn("%v", err)
		return exitcode.Usage
	}
	s, code := loginCluster()
	if s == nil {
		if code == 0 {
			npurunWarn("no [cluster] in %s", clusterconf.Path())
			code = exitcode.Usage
		}
		return code
	}
	r := o.req
	r.Command = cluster.ShellJoin(o.argv)
	sargs, err := s.Args(&r)
	if err != nil {
		npurunWarn("%v", err)
		return exitcode.Usage
	}
	sargs = append(sargs, "--quit-on-interrupt")
	switch {
	case o.noWait:
		sargs = append(sargs, "--immediate=1")
	case o.timeout > 0:
		sargs = append(sargs, "--immediate="+strconv.FormatInt(int64((o.timeout+time.Second-1)/time.Second), 10))
	}
	sargs = append(sargs, "--")
	sargs = append(sargs, s.Command(&r, o.argv)...)

	// srun's standard error comes through npurun: its lines about the
	// job are the progress line. srun is started with a bare fork and
	// exec (cluster.Start), as Slurm's other commands are.
	var ep [2]int
	if err := unix.Pipe2(ep[:], unix.O_CLOEXEC); err != nil {
		npurunWarn("%v", err)
		return exitcode.Failure
	}
	errPipe := os.NewFile(uintptr(ep[0]), "srun's standard error")
	defer errPipe.Close()
	// Signals: npurun stays to report srun's end; srun gets them (a
	// terminal's go to the whole foreground group, srun among it) and
	// relays them to the command.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, unix.SIGINT, unix.SIGTERM, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2, unix.SIGCONT)
	proc, err := s.Start("", "srun", [3]uintptr{0, 1, uintptr(ep[1])}, sargs...)
	unix.Close(ep[1])
	if err != nil {
		npurunWarn("%v", err)
		return exitcode.TempFail
	}
	progress := &srunProgress{s: s, show: !o.quiet && (o.verbose || isTerminal(2)), stop: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case sig := <-sigs:
				if sig == unix.SIGINT {
					progress.interrupted()
				}
				if fromTerminal(sig) {
					continue // srun has it already, from the terminal
				}
				proc.Signal(sig.(syscall.Signal))
			case <-done:
				return
			}
		}
	}()
	progress.relay(errPipe) // until srun's standard error closes: it is ending
	ws, err := proc.Wait()
	close(done)
	close(progress.stop)
	signal.Stop(sigs)
	switch {
	case err != nil:
	case ws.Exited() && ws.ExitStatus() == 0 && progress.wasInterrupted():
		// Ctrl-C ended the job, and srun tells of its end as a success
		// where the step's tasks were killed after KillWait: the status
		// is the interrupted command's, as on a box.
		return 128 + int(unix.SIGINT)
	case ws.Exited() && ws.ExitStatus() == 0:
		return 0
	case ws.Signaled():
		return 128 + int(ws.Signal())
	default:
		code := ws.ExitStatus()
		if code == 1 && progress.refused() {
			npurunWarn("hint: Slurm did not start the command; try again later (scontrol ping)")
			return exitcode.TempFail
		}
		return code
	}
	npurunWarn("srun: %v", err)
	return exitcode.TempFail
}

// fromTerminal tells whether sig is one a terminal sends its foreground
// group (srun is in it); npurun, sent one by kill, relays it instead.
// Without a terminal every signal is relayed.
func fromTerminal(sig os.Signal) bool {
	if !isTerminal(0) {
		return false
	}
	return sig == unix.SIGINT || sig == unix.SIGQUIT
}

func isTerminal(fd int) bool {
	_, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	return err == nil
}

// srunProgress reads srun's standard error: its own lines about the job
// are npurun's progress line, the rest is the command's and goes on.
type srunProgress struct {
	s    *cluster.Slurm
	show bool
	stop chan struct{}

	mu      sync.Mutex
	job     uint64
	watched bool // a watch of the job's place runs
	granted bool
	refusal bool // srun said it could not get the job an allocation
	cancel  bool
}

// srunStderr is where the command's standard error goes on (a variable:
// tests read it).
var srunStderr io.Writer = os.Stderr

// srunLineMax bounds the start of a line relay holds back while it may
// be srun's own.
const srunLineMax = 64 << 10

// relay reads srun's standard error until it closes. A whole line goes to
// line; the start of a line that cannot be srun's ("srun: …") goes on at
// once, and the rest of that line as it comes: a command's progress
// bar, redrawn with \r and no newline, is seen as it is drawn.
func (p *srunProgress) relay(r io.Reader) {
	buf := make([]byte, 32<<10)
	var pend []byte // a line begun that may be srun's
	mid := false    // a line of the command's goes on as it comes, to its newline
	for {
		n, err := r.Read(buf)
		data := buf[:max(n, 0)]
		for len(data) > 0 {
			i := bytes.IndexByte(data, '\n')
			switch {
			case mid:
				end := len(data)
				if i >= 0 {
					end = i + 1
				}
				srunStderr.Write(data[:end])
				data, mid = data[end:], i < 0
			case i >= 0:
				line := string(pend) + string(data[:i+1])
				pend, data = pend[:0], data[i+1:]
				p.line(line)
			default:
				pend, data = append(pend, data...), nil
				if !mayBeSrun(pend) || len(pend) >= srunLineMax {
					srunStderr.Write(pend)
					pend, mid = pend[:0], true
				}
			}
		}
		if err != nil {
			if len(pend) > 0 {
				p.line(string(pend))
			}
			return
		}
	}
}

// mayBeSrun tells whether b may begin a line of srun's own.
func mayBeSrun(b []byte) bool {
	const prefix = "srun: "
	if len(b) < len(prefix) {
		return prefix[:len(b)] == string(b)
	}
	return string(b[:len(prefix)]) == prefix
}

func (p *srunProgress) line(line string) {
	if m := srunQueued(line); m != "" {
		id, _ := strconv.ParseUint(m, 10, 64)
		p.mu.Lock()
		p.job = id
		cancel := p.cancel
		watch := p.show && !p.watched // the place in line is asked of Slurm only to be shown, once
		p.watched = p.watched || watch
		p.mu.Unlock()
		if cancel {
			p.s.Cancel(id)
		}
		if watch {
			go p.watch(id)
		}
		return
	}
	if m := srunGranted(line); m != "" {
		p.mu.Lock()
		p.granted = true
		p.mu.Unlock()
		if p.show {
			npurunWarn("job %s started", m)
		}
		return
	}
	if srunExited(line) {
		return // the status is npurun's own, as a box's npurun says nothing of it
	}
	if srunRefused(line) {
		p.mu.Lock()
		p.refusal = true
		p.mu.Unlock()
	}
	io.WriteString(srunStderr, line)
}

// watch says the job's place in Slurm's line while it waits, when it
// changes.
func (p *srunProgress) watch(id uint64) {
	said := ""
	for {
		p.mu.Lock()
		granted := p.granted
		p.mu.Unlock()
		if granted {
			return
		}
		if jobs, err := p.s.Jobs(); err == nil {
			line := ""
			for i := range jobs {
				if j := &jobs[i]; j.ID == id && j.State == cluster.StatePending {
					line = fmt.Sprintf("waiting in Slurm's line: job %d, %s in line in partition %s", id, wire.Ordinal(cluster.Place(jobs, id)), j.Partition)
					if j.Reason != "" {
						line += " (" + j.Reason + ")"
					}
				}
			}
			if line != "" && line != said && p.show {
				npurunWarn("%s", line)
				said = line
			}
		}
		select {
		case <-p.stop:
			return
		case <-time.After(clusterPollInterval):
		}
	}
}

// interrupted is Ctrl-C: the job, once srun named it, is cancelled.
func (p *srunProgress) interrupted() {
	p.mu.Lock()
	id := p.job
	p.cancel = true
	p.mu.Unlock()
	if id != 0 {
		go p.s.Cancel(id)
	}
}

func (p *srunProgress) wasInterrupted() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cancel
}

func (p *srunProgress) refused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refusal
}
