// Package ociruntime is npurun-runtime: an OCI runtime in front of runc
// that gives a container the lease of the devices it may open, or refuses
// to create it. It asks the broker only over the wire and must never import
// the daemon (broker/...); every step but create is runc's.
package ociruntime

// An engine (dockerd through containerd's shim; podman through conmon)
// calls its runtime as it would call runc: `RUNTIME [global options]
// COMMAND [options] ID`. npurun-runtime, a small C program
// (container/front), passes every command but create (and run) to runc as
// it is, by execve, and runs this package's program, npurun-runtime-create,
// for those (which passes any other command to runc likewise, when called
// for one). For create it reads the bundle's
// config.json and finds which of the broker's devices the container may
// open (its device cgroup's rules, devices as numbered on the host), and
// what lease covers them:
//
//  1. the one npurun hands over (NPURUN_HANDOVER in the container's
//     environment: container.Take), whose owner it records;
//  2. where that npurun is gone (the container starts again: --restart,
//     docker start), a new lease of the same devices, asked of the broker
//     on behalf of the recorded owner, waiting in line as any request
//     (restart_wait bounds it);
//  3. the lease podman passed (--preserve-fds), checked;
//  4. for devices none of these cover (a container started without
//     npurun), [containers] unleased says: refuse the create, ask for a
//     lease as root, or let it run (the broker reports the use).
//
// Each descriptor is checked to be its device's current lock file with
// the flock held (wire.HoldsLock) before it goes on. runc then gets
// them at 20 and above, /dev/null at 3 to 19, and --preserve-fds, so
// that the container's processes hold the lease and nothing else does: it
// ends when they are gone, whatever ends them. A refusal fails the create
// with the reason in the engine's error (the runtime's log, which the
// engine reads).

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/container"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/wire"
)

// Defaults of npurun-runtime's own options.
const (
	DefaultConfig = "/etc/npurun/npurun.conf"
)

// Options are npurun-runtime's own options, given before runc's in
// daemon.json's runtimeArgs (or podman's runtime table).
type Options struct {
	Config string // --npurun-config: the broker's configuration ([devices], [containers])
	Socket string // --npurun-socket: the broker's socket
	Runc   string // --npurun-runc: the runc to run; "" finds runc in PATH, /usr/sbin, /usr/bin
}

// ownFlags are npurun-runtime's options; runc never sees them.
var ownFlags = []string{"--npurun-config", "--npurun-socket", "--npurun-runc"}

// runcGlobals are runc's global options that take a value.
var runcGlobals = []string{"--log", "--log-format", "--root", "--criu", "--rootless"}

// invocation is a parsed command line.
type invocation struct {
	o       Options
	globals []string // runc's global options, as given
	cmd     string   // runc's command
	args    []string // the command's options and arguments
	log     string   // --log
	logJSON bool     // --log-format json
}

// parse splits args (without the program's name) into npurun-runtime's
// options, runc's global options, and the command with its arguments.
func parse(args []string) (*invocation, error) {
	inv := &invocation{}
	i := 0
	for i < len(args) && strings.HasPrefix(args[i], "-") {
		a := args[i]
		name, value, hasValue := strings.Cut(a, "=")
		own := slices.Contains(ownFlags, name)
		takes := own || slices.Contains(runcGlobals, name)
		if takes && !hasValue {
			if i+1 >= len(args) {
				return nil, fmt.Errorf("option %s needs a value", name)
			}
			value = args[i+1]
		}
		width := 1
		if takes && !hasValue {
			width = 2
		}
		switch name {
		case "--npurun-config":
			inv.o.Config = value
		case "--npurun-socket":
			inv.o.Socket = value
		case "--npurun-runc":
			inv.o.Runc = value
		case "--log":
			inv.log = value
		case "--log-format":
			inv.logJSON = value == "json"
		}
		if !own {
			inv.globals = append(inv.globals, args[i:i+width]...)
		}
		i += width
	}
	if i < len(args) {
		inv.cmd = args[i]
		inv.args = args[i+1:]
	}
	if inv.o.Config == "" {
		inv.o.Config = DefaultConfig
	}
	inv.o.Socket = wire.SocketPath(inv.o.Socket)
	return inv, nil
}

// createArgs is what the runtime reads of create's (and run's) options.
type createArgs struct {
	bundle      string
	id          string
	pidFile     string // --pid-file: where runc writes the container's first process's pid
	preserveFDs int
	rest        []string // the options and arguments without --preserve-fds
}

func parseCreate(args []string) (*createArgs, error) {
	c := &createArgs{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, value, hasValue := strings.Cut(a, "=")
		name = "--" + strings.TrimLeft(name, "-")
		switch name {
		case "--bundle", "--b", "--console-socket", "--pid-file", "--preserve-fds":
			if !hasValue {
				if i+1 >= len(args) {
					return nil, fmt.Errorf("option %s needs a value", a)
				}
				i++
				value = args[i]
			}
			switch name {
			case "--bundle", "--b":
				c.bundle = value
			case "--pid-file":
				c.pidFile = value
			case "--preserve-fds":
				n, err := strconv.Atoi(value)
				if err != nil || n < 0 {
					return nil, fmt.Errorf("bad --preserve-fds %q", value)
				}
				c.preserveFDs = n
				continue
			}
			if hasValue {
				c.rest = append(c.rest, a)
			} else {
				c.rest = append(c.rest, a, value)
			}
			continue
		}
		if !strings.HasPrefix(a, "-") {
			c.id = a
		}
		c.rest = append(c.rest, a)
	}
	if c.id == "" {
		return nil, errors.New("no container id")
	}
	if !validID(c.id) {
		return nil, fmt.Errorf("bad container id %q", c.id)
	}
	if c.bundle == "" {
		c.bundle = "."
	}
	return c, nil
}

// Main is npurun-runtime: args is its command line without the program's
// name. It returns only where it did not become runc, with the exit
// status to use.
func Main(args []string) int {
	inv, err := parse(args)
	if err != nil {
		return fail(&invocation{}, "%v", err)
	}
	runc, err := findRunc(inv.o.Runc)
	if err != nil {
		return fail(inv, "%v", err)
	}
	if inv.cmd != "create" && inv.cmd != "run" {
		return execRunc(inv, runc, passArgs(args))
	}
	c, err := parseCreate(inv.args)
	if err != nil {
		return fail(inv, "%s: %v", inv.cmd, err)
	}
	l, err := leaseFor(inv, c)
	if err != nil {
		return fail(inv, "container %.12s: %v", c.id, err)
	}
	if l == nil {
		return execRunc(inv, runc, passArgs(args))
	}
	defer l.close()
	code := startRunc(inv, runc, c, l)
	if code == 0 {
		l.made(inv, c)
	}
	return code
}

// passArgs is args without npurun-runtime's own options.
func passArgs(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		name, _, hasValue := strings.Cut(args[i], "=")
		if slices.Contains(ownFlags, name) {
			if !hasValue {
				i++
			}
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// findRunc finds the runc to run.
func findRunc(p string) (string, error) {
	if p != "" {
		return p, nil
	}
	dirs := append(filepath.SplitList(os.Getenv("PATH")), "/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin")
	for _, d := range dirs {
		c := filepath.Join(d, "runc")
		if unix.Access(c, unix.X_OK) == nil {
			return c, nil
		}
	}
	return "", errors.New("no runc found (in PATH, /usr/sbin, /usr/bin): name it with --npurun-runc")
}

// execRunc becomes runc with args.
func execRunc(inv *invocation, runc string, args []string) int {
	err := unix.Exec(runc, append([]string{runc}, args...), os.Environ())
	return fail(inv, "run %s: %v", runc, err)
}

// lease is what the container gets: descriptors, one a device.
type lease struct {
	devices []int
	fds     []int
	ref     *wire.ContainerRef // the container, as the broker is told of it once made
}

func (l *lease) close() {
	for _, fd := range l.fds {
		unix.Close(fd)
	}
	l.fds = nil
}

func (l *lease) add(devices, fds []int) {
	l.devices = append(l.devices, devices...)
	l.fds = append(l.fds, fds...)
}

// leaseFor finds the lease that covers what the container may open, as
// the package's comment says. nil, nil means runc runs as it was asked
// to: nothing to lease, or nothing more to pass than what came.
func leaseFor(inv *invocation, c *createArgs) (*lease, error) {
	s, err := readSpec(c.bundle)
	if err != nil {
		return nil, err
	}
	cfg, cfgErr := policy.Load(inv.o.Config)
	var vendor npu.Vendor
	var nodes []node
	if cfgErr == nil {
		vendor, nodes = managed(cfg)
	}
	wanted := s.wanted(nodes)
	lockDir := wire.LockDir(inv.o.Socket)
	ref := &wire.ContainerRef{Engine: s.engine(), ID: c.id}

	l := &lease{ref: ref}
	fail := func(err error) (*lease, error) {
		l.close()
		return nil, err
	}
	handover := s.env(container.HandoverVar)
	switch {
	case handover != "":
		// A container made before has a recorded owner: a hand-over is
		// taken from that uid only (the address is anyone's to bind once
		// its npurun is gone).
		var rec *record
		owner := -1
		if cfgErr == nil {
			if rec, err = readRecord(cfg.Containers.StateDir, c.id); err != nil {
				return fail(err)
			}
			if rec != nil {
				owner = int(rec.UID)
			}
		}
		r, err := container.Take(handover, c.id, owner)
		if err == nil {
			// The broker's word: the lease is the account's that handed
			// it over (its refusal, denied, is no hand-over; a broker
			// that cannot be asked, or that does not name the lease (a
			// share's, which op container does not know), leaves
			// HoldsLock's word, below, and the owner's).
			ref.Name = s.name()
			var be *wire.Error
			if berr := tellBrokerFor(inv.o.Socket, ref, userName(r.UID), r.Devices, r.FDs); errors.As(berr, &be) && be.Code == wire.CodeDenied {
				closeAll(r.FDs)
				r, err = nil, fmt.Errorf("%w: the broker refuses the lease handed over by uid %d: %v", container.ErrGone, r.UID, be.Message)
			} else if berr != nil {
				logLine(inv, "warning", "%v", berr)
			}
		}
		if errors.Is(err, container.ErrGone) && err != container.ErrGone {
			logLine(inv, "warning", "container %.12s: %v: taken as no hand-over", c.id, err)
		}
		switch {
		case errors.Is(err, container.ErrGone):
			// Not its first start: its npurun is gone. A new lease,
			// for its owner, of the devices its first had.
			if cfgErr != nil {
				return fail(fmt.Errorf("read %s: %w", inv.o.Config, cfgErr))
			}
			if rec == nil {
				return fail(errors.New("the npurun that started it is gone, and it holds no lease: run it with npurun again"))
			}
			devices := wanted
			if len(devices) == 0 {
				devices = rec.Devices // devices without nodes (vendor "fake")
			}
			ref.Name = s.name()
			user := rec.User
			if uint32(os.Getuid()) == rec.UID {
				user = "" // a rootless engine's runtime asks as its own user
			}
			fds, err := acquire(inv.o.Socket, user, devices, ref, cfg.Containers.RestartWait)
			if err != nil {
				return fail(fmt.Errorf("a new lease of %s for %s, as it starts again: %w", vendor.Format(devices), rec.User, err))
			}
			l.add(devices, fds)
		case err != nil:
			return fail(err)
		default:
			l.add(r.Devices, r.FDs)
			for i, id := range r.Devices {
				if !wire.HoldsLock(r.FDs[i], id, lockDir) {
					return fail(fmt.Errorf("the lease handed over is not npu %d's current lease at %s", id, lockDir))
				}
			}
			if cfgErr == nil {
				rec := &record{ID: c.id, Engine: ref.Engine, Name: ref.Name, UID: r.UID, User: userName(r.UID),
					Devices: r.Devices, Home: s.home(), Created: time.Now().UnixMilli()}
				if err := writeRecord(cfg.Containers.StateDir, rec); err != nil {
					// Its restarts will find no owner and be refused;
					// this start goes on.
					logLine(inv, "warning", "%v: if it starts again it will be refused", err)
				}
			}
		}
	case c.preserveFDs > wire.FirstLeaseFD-3:
		// podman run --preserve-fds, as npurun runs it: the lease is at
		// 20 and above, and goes on as podman placed it.
		for fd := wire.FirstLeaseFD; fd < 3+c.preserveFDs; fd++ {
			for _, id := range wanted {
				if wire.HoldsLock(fd, id, lockDir) {
					l.devices = append(l.devices, id)
				}
			}
		}
		if cfgErr != nil && len(l.devices) == 0 {
			return fail(fmt.Errorf("read %s: %w", inv.o.Config, cfgErr))
		}
		if len(missing(wanted, l.devices)) == 0 {
			return nil, nil
		}
		l.devices = nil
	}
	if cfgErr != nil {
		if len(l.devices) > 0 || !s.mayOpenChar() {
			return l.orNil(), nil
		}
		return fail(fmt.Errorf("read %s: %w: a container that may open devices is refused until it can be read", inv.o.Config, cfgErr))
	}
	need := missing(wanted, l.devices)
	if len(need) == 0 {
		return l.orNil(), nil
	}
	what := vendor.Format(need)
	switch cfg.Containers.Unleased {
	case policy.ContainersReport:
		logLine(inv, "warning", "container %.12s may open %s without a lease ([containers] unleased = \"report\")", c.id, what)
		ref.Name = s.name()
		if err := tellBroker(inv.o.Socket, ref, nil, nil); err != nil {
			logLine(inv, "warning", "%v", err)
		}
		return l.orNil(), nil
	case policy.ContainersLease:
		ref.Name = s.name()
		fds, err := acquire(inv.o.Socket, "", need, ref, cfg.Containers.RestartWait)
		if err != nil {
			return fail(fmt.Errorf("a lease of %s ([containers] unleased = \"lease\"): %w", what, err))
		}
		l.add(need, fds)
		return l, nil
	}
	if len(l.devices) > 0 {
		return fail(fmt.Errorf("it may open %s, which its lease of %s does not hold", what, vendor.Format(l.devices)))
	}
	engine := s.engine()
	if engine == "" {
		engine = "docker"
	}
	return fail(fmt.Errorf("it may open %s (%s) without a lease: start it with npurun %s run", what, nodePaths(nodes, need), engine))
}

// orNil is l, or nil where it holds nothing.
func (l *lease) orNil() *lease {
	if len(l.fds) == 0 {
		return nil
	}
	return l
}

// mayOpenChar tells whether the container may open some character device
// beyond the few every container has, as far as the rules say without
// knowing the broker's devices: a rule allowing a major of its own or
// every device.
func (s *spec) mayOpenChar() bool {
	n := node{id: -1, major: 4095, minor: 1048575}
	return len(s.wanted([]node{n})) > 0
}

// missing is what of want have lacks.
func missing(want, have []int) []int {
	var out []int
	for _, id := range want {
		if !slices.Contains(have, id) {
			out = append(out, id)
		}
	}
	return out
}

func nodePaths(nodes []node, ids []int) string {
	var paths []string
	for _, n := range nodes {
		if slices.Contains(ids, n.id) {
			paths = append(paths, n.path)
		}
	}
	return strings.Join(paths, ", ")
}

// userName is uid's name, its number where the user database has none.
func userName(uid uint32) string {
	id := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(id); err == nil {
		return u.Username
	}
	return id
}

// startRunc runs runc's create with the lease at 20 and above (3 to 19
// /dev/null), and --preserve-fds passing them on; it waits for runc and
// returns its exit status. runc create returns once the container's init
// is made; the init, not this process, holds the lease from then on.
func startRunc(inv *invocation, runc string, c *createArgs, l *lease) int {
	null, err := os.Open(os.DevNull)
	if err != nil {
		return fail(inv, "open %s: %v", os.DevNull, err)
	}
	defer null.Close()
	files := []uintptr{0, 1, 2}
	for len(files) < wire.FirstLeaseFD {
		files = append(files, null.Fd())
	}
	for _, fd := range l.fds {
		files = append(files, uintptr(fd))
	}
	argv := append([]string{runc}, inv.globals...)
	argv = append(argv, inv.cmd, "--preserve-fds", strconv.Itoa(len(files)-3))
	argv = append(argv, c.rest...)
	pid, err := syscall.ForkExec(runc, argv, &syscall.ProcAttr{Env: os.Environ(), Files: files})
	if err != nil {
		return fail(inv, "run %s: %v", runc, err)
	}
	if inv.cmd != "create" {
		// runc run returns when the container ends: nothing to tell then.
		l.close()
	}
	// Else this process keeps its copies until runc has made the
	// container: they prove the lease when the broker is told of it
	// (made).
	var ws unix.WaitStatus
	for {
		_, err = unix.Wait4(pid, &ws, 0, nil)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return fail(inv, "wait for %s: %v", runc, err)
	}
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// made tells the broker, once runc has made the container, which
// container holds the lease, with its descriptors as proof: the control
// group it was made in (a process elsewhere that names it is not its) and
// its first process (where status finds the lease's holders at once, the
// process granted the lease being gone or about to be). The container
// runs whatever the broker says; a failure is logged.
func (l *lease) made(inv *invocation, c *createArgs) {
	if l.ref == nil || len(l.fds) == 0 || c.pidFile == "" {
		return
	}
	ref := *l.ref
	if b, err := os.ReadFile(c.pidFile); err == nil {
		ref.PID, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if ref.PID <= 0 {
		return
	}
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(ref.PID) + "/cgroup"); err == nil {
		if in := container.FromCgroup(b); in != nil && in.ID == ref.ID {
			ref.Cgroup = in.Cgroup
		}
	}
	if err := tellBroker(inv.o.Socket, &ref, l.devices, l.fds); err != nil {
		logLine(inv, "warning", "%v", err)
	}
}

// fail says why the runtime refuses, where the engine reads it (the log
// it named, in its format), and returns 1.
func fail(inv *invocation, format string, args ...any) int {
	logLine(inv, "error", format, args...)
	return 1
}

// logLine writes one line to the engine's log for the runtime (--log),
// as runc does: JSON where --log-format json, else text; to standard
// error where there is no log (standard output and error are the
// container's own during a create).
func logLine(inv *invocation, level, format string, args ...any) {
	msg := "npurun-runtime: " + fmt.Sprintf(format, args...)
	if inv.log == "" {
		fmt.Fprintln(os.Stderr, msg)
		return
	}
	f, err := os.OpenFile(inv.log, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, msg)
		return
	}
	defer f.Close()
	now := time.Now().UTC().Format(time.RFC3339Nano)
	if inv.logJSON {
		b, _ := json.Marshal(struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
			Time  string `json:"time"`
		}{level, msg, now})
		f.Write(append(b, '\n'))
		return
	}
	fmt.Fprintf(f, "time=%q level=%s msg=%q\n", now, level, msg)
}
