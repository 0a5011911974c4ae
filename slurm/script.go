package slurm

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/wire"
)

// What npurun-slurm is, as slurmd's Prolog and Epilog: it tells the
// broker that a job holds devices, or that it ended, and never fails:
// a Prolog that fails drains the node, and npurun's trouble (no broker,
// a broker that does not answer, a job the broker refuses) must not
// take a node out of Slurm's service. It says what went wrong on
// standard error, which slurmd logs (at debug2 level, unless the
// script fails), and in the system log, where it is seen.

// Default time limits: the Prolog's answer may wait for what a previous
// job left holding the devices to be ended (the broker's kill_grace, 10 s
// by default); the Epilog's may not.
const (
	DefaultPrologTimeout = 30 * time.Second
	DefaultEpilogTimeout = 10 * time.Second
)

// ScriptUsage is npurun-slurm's usage.
const ScriptUsage = `Usage:
  npurun-slurm [prolog|epilog] [--socket PATH] [--timeout DURATION]
  npurun-slurm --version

Slurm's Prolog and Epilog (slurm.conf Prolog= and Epilog=, PrologFlags=Alloc):
tells npubroker that the job of SLURM_JOB_ID holds the devices of
SLURM_JOB_GPUS (gres.conf positions), or that it ended. Without prolog or
epilog it does what SLURM_SCRIPT_CONTEXT (prolog_slurmd, epilog_slurmd)
says. It exits 0 whatever npurun's trouble, which it logs: a failing Prolog
drains the node.

Options:
  --socket PATH        the broker's socket (default $NPURUN_SOCKET, else /run/npurun/broker.sock)
  --timeout DURATION   give up waiting for the broker after this long (default 30s, epilog 10s)
`

// Script runs npurun-slurm with args in the environment getenv reads, and
// returns its exit status: 0 for everything but a usage error outside a
// Prolog or Epilog (2) and --help and --version (0). Its messages go to
// stderr and, where they are trouble, to the system log.
func Script(args []string, getenv func(string) string, stderr io.Writer, version string) int {
	mode := ""
	o := scriptOptions{socket: getenv("NPURUN_SOCKET")}
	context := getenv("SLURM_SCRIPT_CONTEXT")
	inSlurm := context == "prolog_slurmd" || context == "epilog_slurmd"
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "npurun-slurm: "+format+"\n", a...)
		if inSlurm {
			// Run by slurmd all the same: a wrong line in slurm.conf must
			// not drain the node either.
			logTrouble(fmt.Sprintf(format, a...) + ": nothing told to the broker")
			return 0
		}
		fmt.Fprint(stderr, ScriptUsage)
		return 2
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, value, hasValue := strings.Cut(a, "=")
		switch {
		case a == "-h" || a == "--help":
			fmt.Fprint(stderr, ScriptUsage)
			return 0
		case a == "--version":
			fmt.Fprintln(stderr, "npurun-slurm", version)
			return 0
		case (a == "prolog" || a == "epilog") && mode == "":
			mode = a
		case name == "--socket" || name == "--timeout":
			if !hasValue {
				if i+1 == len(args) {
					return usage("%s needs a value", name)
				}
				i++
				value = args[i]
			}
			if name == "--socket" {
				o.socket = value
				break
			}
			d, err := quantity.ParseDuration(value)
			if err != nil || d <= 0 {
				return usage("--timeout %q: want a duration such as 30s", value)
			}
			o.timeout = d
		default:
			return usage("unknown argument %q", a)
		}
	}
	if mode == "" {
		switch context {
		case "prolog_slurmd":
			mode = "prolog"
		case "epilog_slurmd":
			mode = "epilog"
		default:
			return usage("prolog or epilog? (SLURM_SCRIPT_CONTEXT is %q)", context)
		}
	}
	o.socket = wire.SocketPath(o.socket)
	var msg string
	var err error
	if mode == "prolog" {
		if o.timeout == 0 {
			o.timeout = DefaultPrologTimeout
		}
		msg, err = prolog(o, getenv)
	} else {
		if o.timeout == 0 {
			o.timeout = DefaultEpilogTimeout
		}
		msg, err = epilog(o, getenv)
	}
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "npurun-slurm: %v\n", err)
		logTrouble(err.Error())
	case msg != "":
		fmt.Fprintf(stderr, "npurun-slurm: %s\n", msg)
	}
	return 0
}

type scriptOptions struct {
	socket  string
	timeout time.Duration
}

// jobFromEnv reads the job as slurmd describes it to its Prolog and
// Epilog.
func jobFromEnv(getenv func(string) string) (*wire.SlurmJob, error) {
	id, err := strconv.ParseUint(getenv("SLURM_JOB_ID"), 10, 32)
	if err != nil {
		return nil, fmt.Errorf("SLURM_JOB_ID=%q is not a job id: not run by slurmd as its Prolog or Epilog?", getenv("SLURM_JOB_ID"))
	}
	uid, err := strconv.ParseUint(getenv("SLURM_JOB_UID"), 10, 32)
	if err != nil {
		return nil, fmt.Errorf("job %d: SLURM_JOB_UID=%q is not a user id", id, getenv("SLURM_JOB_UID"))
	}
	return &wire.SlurmJob{ID: uint32(id), UID: uint32(uid), User: getenv("SLURM_JOB_USER"), GRES: getenv("SLURM_JOB_GPUS")}, nil
}

// prolog tells the broker that the job holds its GRES devices.
func prolog(o scriptOptions, getenv func(string) string) (string, error) {
	job, err := jobFromEnv(getenv)
	if err != nil {
		return "", err
	}
	if job.GRES == "" {
		return "", nil // no devices: nothing of npurun's
	}
	r, err := ask(o, &wire.Request{Op: wire.OpSlurmProlog, Job: job})
	if err != nil {
		return "", fmt.Errorf("job %d of %s on gres %s: %w: the job runs without npurun's lease", job.ID, job.User, job.GRES, err)
	}
	return r.Message, nil
}

// epilog tells the broker that the job ended.
func epilog(o scriptOptions, getenv func(string) string) (string, error) {
	job, err := jobFromEnv(getenv)
	if err != nil {
		return "", err
	}
	job.User = ""
	if job.GRES == "" {
		return "", nil
	}
	r, err := ask(o, &wire.Request{Op: wire.OpSlurmEpilog, Job: job})
	if err != nil {
		return "", fmt.Errorf("end of job %d: %w", job.ID, err)
	}
	return r.Message, nil
}

// ask sends req and waits, until o.timeout has passed, for the answer
// that is not progress.
func ask(o scriptOptions, req *wire.Request) (*wire.Reply, error) {
	deadline := time.Now().Add(o.timeout)
	c, err := wire.DialWithin(o.socket, o.timeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := c.Send(req); err != nil {
		return nil, fmt.Errorf("send to the broker at %s: %w", o.socket, err)
	}
	for {
		r, _, err := c.Recv(max(time.Until(deadline), 0))
		var be *wire.Error
		switch {
		case errors.As(err, &be):
			return nil, fmt.Errorf("the broker refused: %s", be.Message)
		case errors.Is(err, wire.ErrTimeout):
			return nil, fmt.Errorf("no answer from the broker at %s within %s", o.socket, quantity.Duration(o.timeout))
		case err != nil:
			return nil, fmt.Errorf("the broker at %s: %w", o.socket, err)
		case r.Type == wire.TypeQueued:
			continue // waits for what holds the devices still to end
		case r.Type != wire.TypeOK:
			return nil, fmt.Errorf("unexpected answer %q from the broker", r.Type)
		}
		return r, nil
	}
}

// syslogPath is the system log's socket; a variable for tests.
var syslogPath = "/dev/log"

// logTrouble writes msg to the system log (facility daemon, level
// warning) where one listens; slurmd logs a Prolog's output only at
// debug2 level when it succeeds, and npurun-slurm always does.
func logTrouble(msg string) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if unix.Connect(fd, &unix.SockaddrUnix{Name: syslogPath}) != nil {
		return
	}
	line := "<28>npurun-slurm[" + strconv.Itoa(os.Getpid()) + "]: " + strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, msg)
	unix.Send(fd, []byte(line), unix.MSG_DONTWAIT)
}
