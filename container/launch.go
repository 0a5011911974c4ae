package container

import (
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
)

// DefaultRuntime is the name npurun-runtime has among Docker's runtimes
// (daemon.json "runtimes"), unless NPURUN_DOCKER_RUNTIME names another.
const DefaultRuntime = "npurun"

// Lease is a lease to hand into a container.
type Lease struct {
	Vendor  npu.Vendor
	Devices []int    // physical ids, one descriptor each, in the grant's order
	FDs     []int    // the lease's descriptors
	Env     []string // the grant's variables, as on the host (their order is NPURUN_DEVICES')
}

// Options say where things are.
type Options struct {
	DevDir  string // the device nodes' directory; "" for /dev
	Runtime string // npurun-runtime's name among Docker's runtimes; "" for DefaultRuntime
	Task    bool   // the run is a task's: attached, since the task's life is the container's
}

// Launch is a container run prepared for a lease: the engine's command
// line, and what passes the lease on.
type Launch struct {
	Run      *Run
	Argv     []string  // the engine's command line, npurun's options added
	Handover *Handover // docker: serves the lease to the runtime; nil for podman
	Devices  []int     // the lease's devices, in NPURUN_DEVICES' order
	runtime  string    // docker: npurun-runtime's name among its runtimes
	vendor   npu.Vendor
	lease    []int // podman: the lease's descriptors, for the engine's process
	null     int   // podman: /dev/null, for descriptors 3 to 19 of the engine's process
}

// Prepare checks run against the lease and prepares it: the lease's
// device nodes (host path to the same name under /dev) and variables
// (npu.ContainerEnv, NPURUN_LEASE naming descriptors 20 and above) added
// after "run", and the way the descriptors go (the hand-over for docker,
// --preserve-fds for podman). The lease's descriptors stay the caller's:
// Prepare copies what it keeps.
func Prepare(r *Run, l Lease, o Options) (*Launch, error) {
	if err := check(r, l, o); err != nil {
		return nil, err
	}
	order := npu.DevicesOf(l.Env)
	if len(order) != len(l.Devices) {
		order = l.Devices
	}
	la := &Launch{Run: r, Devices: order, null: -1, runtime: runtimeName(o), vendor: l.Vendor}
	var extra []string
	switch r.Engine {
	case Docker:
		h, err := NewHandover(string(l.Vendor), l.Devices, l.FDs)
		if err != nil {
			return nil, err
		}
		la.Handover = h
		extra = append(extra, "--runtime="+runtimeName(o))
	case Podman:
		extra = append(extra, "--preserve-fds="+strconv.Itoa(wire.FirstLeaseFD-3+len(l.FDs)))
		for _, fd := range l.FDs {
			c, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
			if err != nil {
				la.Close()
				return nil, fmt.Errorf("copy the lease's descriptor: %w", err)
			}
			la.lease = append(la.lease, c)
		}
		null, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			la.Close()
			return nil, fmt.Errorf("open %s: %w", os.DevNull, err)
		}
		la.null = null
	default:
		return nil, fmt.Errorf("unknown engine %q", r.Engine)
	}
	named := map[string]bool{}
	for _, d := range r.Devices {
		named[d] = true
	}
	for _, node := range npu.ContainerNodes(l.Vendor, o.DevDir, l.Devices) {
		if !named[node] {
			extra = append(extra, "--device="+node+":/dev/"+baseName(node))
		}
	}
	env := npu.ContainerEnv(l.Vendor, order)
	inside := make([]int, len(l.Devices))
	for i := range inside {
		inside[i] = wire.FirstLeaseFD + i
	}
	env = append(env, wire.LeaseEntry(l.Devices, inside))
	if la.Handover != nil {
		env = append(env, la.Handover.Env())
	}
	for _, kv := range env {
		extra = append(extra, "--env="+kv)
	}
	la.Argv = r.With(extra)
	return la, nil
}

// check refuses what would leave the container on a device without its
// lease, or without the lease it needs.
func check(r *Run, l Lease, o Options) error {
	what := string(r.Engine) + " run"
	switch {
	case len(l.Devices) == 0 || len(l.Devices) != len(l.FDs):
		return fmt.Errorf("%s: no lease to hand to the container", what)
	case r.Privileged:
		return fmt.Errorf("%s --privileged opens every device to the container, and the lease holds %s only", what, l.Vendor.Format(l.Devices))
	case r.Engine == Docker && r.Runtime != "" && r.Runtime != runtimeName(o):
		return fmt.Errorf("%s --runtime %s: the lease reaches the container through npurun's runtime (%q), which runs runc itself", what, r.Runtime, runtimeName(o))
	case r.Engine == Podman && r.PreserveFDs:
		return fmt.Errorf("%s --preserve-fds: npurun passes the lease's descriptors itself", what)
	case r.Engine == Podman && r.Restarts():
		return fmt.Errorf("%s --restart %s: podman would start the container again without its lease", what, r.Restart)
	case o.Task && r.Detach:
		return fmt.Errorf("%s --detach: a task's container runs attached, the task's life being the container's (the task is detached already)", what)
	}
	for _, d := range r.Devices {
		if id, ok := npu.NodeID(l.Vendor, d); ok && !slices.Contains(l.Devices, id) {
			return fmt.Errorf("%s --device %s: %s is not in the lease, which holds %s", what, d, l.Vendor.Format([]int{id}), l.Vendor.Format(l.Devices))
		}
	}
	return nil
}

// Hint is the next step for an error of Prepare, "" where there is none.
func Hint(r *Run) string {
	switch {
	case r.Privileged:
		return "drop --privileged; npurun adds the lease's device nodes itself"
	case r.Engine == Docker && r.Runtime != "":
		return "drop --runtime; npurun-runtime runs runc (see npurun(1), CONTAINERS)"
	case r.Engine == Podman && r.Restarts():
		return "run it again with npurun when it ends (a task-submit task, or a loop), or use docker, whose restarts npurun-runtime leases again"
	case r.Detach:
		return "drop -d"
	}
	return ""
}

func runtimeName(o Options) string {
	if o.Runtime != "" {
		return o.Runtime
	}
	return DefaultRuntime
}

func baseName(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[i+1:]
		}
	}
	return p
}

// Files returns the descriptors of the engine's process, stdio first:
// for podman, /dev/null from 3 to 19 and the lease at 20 and above, as
// its --preserve-fds passes them on; for docker, the standard three only.
func (la *Launch) Files(stdio [3]uintptr) []uintptr {
	files := stdio[:]
	if la.Run.Engine != Podman {
		return files
	}
	files = slices.Clone(files)
	for len(files) < wire.FirstLeaseFD {
		files = append(files, uintptr(la.null))
	}
	for _, fd := range la.lease {
		files = append(files, uintptr(fd))
	}
	return files
}

// Started is called once the engine's process has started: the copies
// that only it needed go (podman's lease is the engine's now).
func (la *Launch) Started() {
	closeFDs(la.lease)
	la.lease = nil
	if la.null >= 0 {
		unix.Close(la.null)
		la.null = -1
	}
}

// Close lets go of everything the launch holds, the lease's copies
// included.
func (la *Launch) Close() {
	la.Started()
	if la.Handover != nil {
		la.Handover.Close()
	}
}

// Say is how Exec speaks to the user: npurun's warn and hint.
type Say struct {
	Warn, Hint func(format string, args ...any)
	Verbose    bool
}

// Exec runs the launch: it starts the engine's command line (path,
// env) as a child, hands the lease over while it runs (docker), and
// returns the child's exit status, or re-raises the signal that ended
// it. SIGINT and SIGQUIT, which a terminal sends to the child as well,
// are ignored here; SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 are passed on
// to the child (docker and podman pass them on to the container).
func Exec(path string, la *Launch, env []string, say Say) int {
	defer la.Close()
	// Caught rather than ignored: an ignored signal stays ignored in the
	// child, a caught one is the default there again.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, unix.SIGINT, unix.SIGQUIT, unix.SIGTERM, unix.SIGHUP, unix.SIGUSR1, unix.SIGUSR2)
	attr := &syscall.ProcAttr{Env: env, Files: la.Files([3]uintptr{0, 1, 2})}
	pid, err := syscall.ForkExec(path, la.Argv, attr)
	if err != nil {
		signal.Reset()
		say.Warn("%s: %v", la.Argv[0], err)
		if err == syscall.ENOENT {
			return 127
		}
		return 126
	}
	la.Started()
	type exit struct {
		ws  unix.WaitStatus
		err error
	}
	ended := make(chan exit, 1)
	go func() {
		var ws unix.WaitStatus
		var err error
		for {
			_, err = unix.Wait4(pid, &ws, 0, nil)
			if err != unix.EINTR {
				break
			}
		}
		ended <- exit{ws, err}
		if la.Handover != nil {
			la.Handover.Stop()
		}
	}()
	go func() {
		for s := range sigs {
			if s != unix.SIGINT && s != unix.SIGQUIT {
				unix.Kill(pid, s.(unix.Signal))
			}
		}
	}()
	if la.Handover != nil {
		if err := la.Handover.Serve(-1); err != nil {
			say.Warn("%v", err)
		}
		la.Handover.Close() // a lease not taken by now is nobody's
	}
	e := <-ended
	signal.Stop(sigs)
	if e.err != nil {
		say.Warn("wait for %s: %v", la.Argv[0], e.err)
		return 1
	}
	if la.Handover != nil && la.Handover.Taken() == "" {
		// Docker said why it failed, on its standard error: the runtime's
		// registration is named only where it is what failed (Docker
		// does not know the runtime), or where Docker succeeded without
		// it.
		switch registered, known := la.runtimeRegistered(path, env); {
		case known && !registered:
			say.Warn("Docker has no runtime %q: the container did not start, and the lease goes back", la.runtime)
			say.Hint("register npurun-runtime as Docker's runtime %q (daemon.json \"runtimes\", then SIGHUP to dockerd); see npurun(1), CONTAINERS", la.runtime)
		case e.err == nil && !e.ws.Signaled() && e.ws.ExitStatus() == 0:
			say.Warn("%s run ended, and no runtime took the lease: no container had it", la.Run.Engine)
			say.Hint("is npurun-runtime Docker's runtime %q (daemon.json \"runtimes\", then SIGHUP to dockerd)? see npurun(1), CONTAINERS", la.runtime)
		}
	} else if la.Handover != nil && say.Verbose {
		say.Warn("%s handed to container %.12s", la.vendor.Format(la.Devices), la.Handover.Taken())
	}
	if e.ws.Signaled() {
		sig := e.ws.Signal()
		signal.Reset(sig)
		unix.Kill(unix.Getpid(), sig)
		return 128 + int(sig)
	}
	return e.ws.ExitStatus()
}

// runtimeRegistered asks Docker (the engine's command line at path, with
// its global options and env) whether it has the runtime npurun hands the
// lease through: registered, and known false where Docker could not be
// asked (no answer within runtimeAskTimeout, an error).
func (la *Launch) runtimeRegistered(path string, env []string) (registered, known bool) {
	globals := la.Run.Argv[1:la.Run.At]
	if n := len(globals); n > 0 && globals[n-1] == "container" {
		globals = globals[:n-1]
	}
	argv := append([]string{la.Run.Argv[0]}, globals...)
	argv = append(argv, "info", "--format", `{{range $name, $_ := .Runtimes}}{{println $name}}{{end}}`)
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return false, false
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return false, false
	}
	defer null.Close()
	pid, err := syscall.ForkExec(path, argv, &syscall.ProcAttr{Env: env, Files: []uintptr{null.Fd(), uintptr(p[1]), null.Fd()}})
	unix.Close(p[1])
	if err != nil {
		unix.Close(p[0])
		return false, false
	}
	timer := time.AfterFunc(runtimeAskTimeout, func() { unix.Kill(pid, unix.SIGKILL) })
	out := make([]byte, 0, 1024)
	buf := make([]byte, 1024)
	for len(out) < maxRuntimesAnswer {
		n, err := unix.Read(p[0], buf)
		if n > 0 {
			out = append(out, buf[:n]...)
		}
		if err == unix.EINTR {
			continue
		}
		if n <= 0 {
			break
		}
	}
	unix.Close(p[0])
	var ws unix.WaitStatus
	for {
		if _, err = unix.Wait4(pid, &ws, 0, nil); err != unix.EINTR {
			break
		}
	}
	timer.Stop()
	if err != nil || !ws.Exited() || ws.ExitStatus() != 0 || len(out) >= maxRuntimesAnswer {
		return false, false
	}
	for _, name := range strings.Fields(string(out)) {
		if name == la.runtime {
			return true, true
		}
	}
	return false, true
}

// runtimeAskTimeout bounds the question runtimeRegistered asks Docker, and
// maxRuntimesAnswer what is read of its answer.
const (
	runtimeAskTimeout = 10 * time.Second
	maxRuntimesAnswer = 64 << 10
)
