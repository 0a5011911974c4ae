package shim

import (
	"errors"
	"os"
	"strings"

	"github.com/npurun/npurun/container"
	"github.com/npurun/npurun/internal/exitcode"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
)

// runContainer is npurun ENGINE run …: the lease, asked for as any (or
// inherited from an npurun above), goes to the container rather than to
// the engine's command line, which npurun runs as its child; it returns
// that child's exit status.
func runContainer(o Options, engine container.Engine, argv []string) int {
	r, err := container.Parse(engine, argv)
	if errors.Is(err, container.ErrNotRun) {
		warn("%v: npurun hands a lease to a container that %s run starts", err, engine)
		hint("a running container's processes hold its lease already: run %s's other commands without npurun", engine)
		return exitcode.Usage
	}
	if err != nil {
		warn("%v", err)
		return exitcode.Usage
	}
	devDir := os.Getenv("NPURUN_DEV_DIR")
	var l container.Lease
	var all []int // every lease descriptor this process holds
	if lease, ok := inheritedLease(wire.SocketPath(o.Socket)); ok {
		if err := lease.covers(o); err != nil {
			warn("%v", err)
			hint("a nested npurun runs inside its parent's lease; ask for the devices in the outer npurun")
			return exitcode.Failure
		}
		env, placed, devices, err := lease.env(o)
		if err != nil {
			warn("%v", err)
			return exitcode.Failure
		}
		closeFDs(placed) // the container gets its own copies
		fds := make([]int, len(devices))
		for i, id := range devices {
			for j, have := range lease.devices {
				if have == id {
					fds[i] = lease.fds[j]
				}
			}
		}
		hostEnv := mergeEnv(os.Environ(), env)
		l = container.Lease{Vendor: npu.VendorOf(hostEnv, devDir, devices), Devices: devices, FDs: fds, Env: hostEnv}
		all = lease.fds
	} else {
		sayEnded(wire.SocketPath(o.Socket))
		w := waiter{o: o, tty: isTerminal(2)}
		g, fds, code := w.acquire()
		if g == nil {
			return code
		}
		if w.held != nil {
			w.held.Close() // the container's lease ends with the container, told or not
		}
		l = container.Lease{Vendor: npu.Vendor(g.Vendor), Devices: g.Devices, FDs: fds, Env: g.Env}
		all = fds
	}
	la, err := container.Prepare(r, l, container.Options{DevDir: devDir, Runtime: os.Getenv("NPURUN_DOCKER_RUNTIME")})
	// From here the lease is the launch's (Prepare copied what it hands
	// on): the engine's command line gets none of it, and once the
	// container has it, nothing else here does.
	closeFDs(all)
	if err != nil {
		warn("%v", err)
		if h := container.Hint(r); h != "" {
			hint("%s", h)
		}
		return exitcode.Usage
	}
	path, code := lookPath(argv[0])
	if code != 0 {
		la.Close()
		return code
	}
	return container.Exec(path, la, engineEnv(os.Environ()), container.Say{Warn: warn, Hint: hint, Verbose: o.Verbose})
}

// engineEnv is the environment of the engine's command line: npurun's
// own, without an NPURUN_LEASE, whose descriptors it does not get.
func engineEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, wire.LeaseVar+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// containerEngine is the engine npurun hands the lease to for argv:
// the one --container names, or the one argv's program is; "" for none.
func containerEngine(o Options, argv []string) container.Engine {
	if o.Container != "" {
		return container.Engine(o.Container)
	}
	return container.Detect(argv)
}
