// Package container hands a lease to a container: the engine's command line
// npurun runs, the hand-over of the lease's descriptors to the runtime, and
// the container a process belongs to. It is client code: it imports only
// the wire and npu, and must never import the daemon (broker/...).
package container

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// A container's processes are the engine's children, not npurun's: a
// lease must be handed into the container itself, so that its processes
// hold it for exactly its life. npurun reads the engine's command line
// (`docker [global options] run [options] IMAGE [ARG...]`, likewise
// podman), adds the lease's device nodes and variables right after `run`,
// and:
//
//   - docker: names npurun's runtime (`--runtime=npurun`) and the
//     hand-over's address (NPURUN_HANDOVER in the container's
//     environment); the runtime, called by the engine for `create`, takes
//     the lease's descriptors from npurun (handover.go) and passes them to
//     runc with --preserve-fds;
//   - podman: --preserve-fds, with the lease's descriptors placed in
//     podman's process, which passes them to the container.
//
// Either way the descriptors land at 20 and above in the container, as
// they do for every command npurun runs (wire.FirstLeaseFD; 3 to 19 are
// /dev/null), and NPURUN_LEASE names them there.

// Engine names a container engine whose `run` npurun knows.
type Engine string

// The engines npurun knows.
const (
	Docker Engine = "docker"
	Podman Engine = "podman"
)

// Engines are the engines' names, as npurun --container takes them.
var Engines = []string{string(Docker), string(Podman)}

// Detect names the engine that argv runs, by its program's name (docker,
// podman, whatever directory), and "" for any other program.
func Detect(argv []string) Engine {
	if len(argv) == 0 {
		return ""
	}
	switch filepath.Base(argv[0]) {
	case "docker":
		return Docker
	case "podman":
		return Podman
	}
	return ""
}

// Run is an engine's `run` command line, as npurun reads it.
type Run struct {
	Engine Engine
	Argv   []string // as given
	At     int      // the index of "run": npurun's options go right after it
	Image  int      // the index of the image; len(Argv) if none

	Detach      bool     // -d, --detach
	Runtime     string   // docker's --runtime; "" when not given
	PreserveFDs bool     // --preserve-fds given (podman)
	Restart     string   // --restart's value; "" when not given
	Privileged  bool     // --privileged
	Devices     []string // the host side of each --device given
	Name        string   // --name; "" when not given
}

// ErrNotRun means the engine's command line is not a `run`: npurun hands
// a lease to a container it starts, not to the engine's other commands.
var ErrNotRun = errors.New("not a run")

// Parse reads argv as engine's command line. A command other than `run`
// (or `container run`) gives an error wrapping ErrNotRun.
func Parse(engine Engine, argv []string) (*Run, error) {
	if len(argv) == 0 {
		return nil, fmt.Errorf("%s: no command: %w", engine, ErrNotRun)
	}
	r := &Run{Engine: engine, Argv: argv, At: -1, Image: len(argv)}
	globals := dockerGlobals
	if engine == Podman {
		globals = podmanGlobals
	}
	i := 1
	// The engine's global options, up to its command.
	for i < len(argv) && strings.HasPrefix(argv[i], "-") && argv[i] != "-" {
		if argv[i] == "--" {
			return nil, fmt.Errorf("%s: %q before the command: %w", engine, "--", ErrNotRun)
		}
		i += optionWords(argv, i, globals)
	}
	if i >= len(argv) {
		return nil, fmt.Errorf("%s: no command: %w", engine, ErrNotRun)
	}
	switch {
	case argv[i] == "run":
		r.At = i
	case argv[i] == "container" && i+1 < len(argv) && argv[i+1] == "run":
		r.At = i + 1
	default:
		cmd := argv[i]
		if cmd == "container" && i+1 < len(argv) {
			cmd += " " + argv[i+1]
		}
		return nil, fmt.Errorf("%s %s: %w", engine, cmd, ErrNotRun)
	}
	// run's options, up to the image.
	i = r.At + 1
	for i < len(argv) {
		a := argv[i]
		if a == "--" {
			i++
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			break
		}
		n := optionWords(argv, i, runValues)
		r.note(argv[i : i+n])
		i += n
	}
	r.Image = i
	if r.Image >= len(argv) {
		return nil, fmt.Errorf("%s run: no image named", engine)
	}
	return r, nil
}

// optionWords is how many words the option at argv[i] takes: 1, or 2
// where its value is the next word. values names the options, long
// ("--name") and short ("-e"), that take a value.
func optionWords(argv []string, i int, values map[string]bool) int {
	a := argv[i]
	if strings.HasPrefix(a, "--") {
		if strings.Contains(a, "=") || !values[a] || i+1 >= len(argv) {
			return 1
		}
		return 2
	}
	// Grouped short options (-it, -dit, -eX=1): a short option that takes
	// a value takes the rest of the word, or the next word where the rest
	// is empty.
	for j := 1; j < len(a); j++ {
		if values["-"+a[j:j+1]] {
			if j+1 == len(a) && i+1 < len(argv) {
				return 2
			}
			return 1
		}
	}
	return 1
}

// note records what npurun must know of one of run's options, words as
// optionWords measured them.
func (r *Run) note(words []string) {
	a := words[0]
	value := func() string {
		if len(words) == 2 {
			return words[1]
		}
		if _, v, ok := strings.Cut(a, "="); ok {
			return v
		}
		return ""
	}
	if !strings.HasPrefix(a, "--") {
		// Of the short options only -d matters here; one that takes a
		// value ends the group.
		for j := 1; j < len(a); j++ {
			c := a[j : j+1]
			if c == "d" {
				r.Detach = a[j+1:] != "=false"
			}
			if runValues["-"+c] || a[j+1:] == "=false" || a[j+1:] == "=true" {
				return
			}
		}
		return
	}
	name, _, _ := strings.Cut(a, "=")
	switch name {
	case "--detach":
		r.Detach = value() != "false"
	case "--runtime":
		r.Runtime = value()
	case "--preserve-fds":
		r.PreserveFDs = true
	case "--restart":
		r.Restart = value()
	case "--privileged":
		r.Privileged = value() != "false"
	case "--device":
		host, _, _ := strings.Cut(value(), ":")
		r.Devices = append(r.Devices, host)
	case "--name":
		r.Name = value()
	}
}

// Restarts tells whether the run asks the engine to restart its
// container (--restart other than "no").
func (r *Run) Restarts() bool {
	policy, _, _ := strings.Cut(r.Restart, ":")
	return policy != "" && policy != "no"
}

// With returns the run's command line with extra options inserted right
// after "run", where the engine takes them as run's own, before any of
// the user's.
func (r *Run) With(extra []string) []string {
	out := make([]string, 0, len(r.Argv)+len(extra))
	out = append(out, r.Argv[:r.At+1]...)
	out = append(out, extra...)
	return append(out, r.Argv[r.At+1:]...)
}

// The options that take a value, as the engines' --help lists them
// (Docker 20.10 and 28, Podman 4.3), long and short. Boolean options are
// all the others; a boolean's value goes after "=" (--rm=false).
var (
	dockerGlobals = set("--config", "-c", "--context", "-H", "--host", "-l", "--log-level",
		"--tlscacert", "--tlscert", "--tlskey")
	podmanGlobals = set("--cgroup-manager", "--conmon", "-c", "--connection", "--events-backend",
		"--hooks-dir", "--identity", "--log-level", "--module", "--namespace", "--network-cmd-path",
		"--network-config-dir", "--root", "--runroot", "--runtime", "--runtime-flag", "--ssh",
		"--storage-driver", "--storage-opt", "--tmpdir", "--url", "--volumepath")
	runValues = set(
		// both engines
		"--add-host", "--annotation", "-a", "--attach", "--blkio-weight", "--blkio-weight-device",
		"--cap-add", "--cap-drop", "--cgroup-parent", "--cgroupns", "--cidfile", "--cpu-period",
		"--cpu-quota", "--cpu-rt-period", "--cpu-rt-runtime", "-c", "--cpu-shares", "--cpus",
		"--cpuset-cpus", "--cpuset-mems", "--detach-keys", "--device", "--device-cgroup-rule",
		"--device-read-bps", "--device-read-iops", "--device-write-bps", "--device-write-iops",
		"--dns", "--dns-option", "--dns-search", "--entrypoint", "-e", "--env", "--env-file",
		"--expose", "--group-add", "--health-cmd", "--health-interval", "--health-retries",
		"--health-start-period", "--health-timeout", "-h", "--hostname", "--ip", "--ip6", "--ipc",
		"-l", "--label", "--label-file", "--log-driver", "--log-opt", "--mac-address", "-m",
		"--memory", "--memory-reservation", "--memory-swap", "--memory-swappiness", "--mount",
		"--name", "--network", "--net", "--network-alias", "--net-alias", "--oom-score-adj", "--pid",
		"--pids-limit", "--platform", "-p", "--publish", "--pull", "--restart", "--security-opt",
		"--shm-size", "--stop-signal", "--stop-timeout", "--sysctl", "--tmpfs", "--ulimit", "-u",
		"--user", "--userns", "--uts", "-v", "--volume", "--volumes-from", "-w", "--workdir",
		// docker's
		"--cpu-count", "--cpu-percent", "--domainname", "--gpus", "--health-start-interval",
		"--io-maxbandwidth", "--io-maxiops", "--isolation", "--kernel-memory", "--link",
		"--link-local-ip", "--runtime", "--storage-opt", "--volume-driver",
		// podman's
		"--arch", "--authfile", "--cgroup-conf", "--cgroups", "--chrootdirs", "--conmon-pidfile",
		"--decryption-key", "--env-merge", "--gidmap", "--health-on-failure", "--hostuser",
		"--image-volume", "--init-path", "--os", "--passwd-entry", "--personality", "--pidfile",
		"--pod", "--pod-id-file", "--preserve-fds", "--requires", "--sdnotify", "--seccomp-policy",
		"--secret", "--subgidname", "--subuidname", "--systemd", "--timeout", "--tz", "--uidmap",
		"--umask", "--unsetenv", "--variant", "--rdt-class", "--chrootdirs")
)

func set(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// isEngine tells whether name is an engine npurun knows.
func isEngine(name string) bool { return slices.Contains(Engines, name) }
