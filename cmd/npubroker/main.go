// Command npubroker is the root daemon that owns the accelerator locks of this machine and hands out leases.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker"
	"github.com/npurun/npurun/broker/tasks/local"
	"github.com/npurun/npurun/cmd/npubroker/cli"
	"github.com/npurun/npurun/internal/completion"
	"github.com/npurun/npurun/internal/exitcode"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/wire"
)

var version = "dev"

const usage = `Usage:
  npubroker serve [--config FILE] [--socket PATH] [--run-dir DIR] [--state-dir DIR] [--cgroup DIR] [--log WHERE]
  npubroker check-config [--socket PATH] [FILE]
  ` + cli.StatusUsage + `
  ` + cli.UsageUsage + `
  ` + cli.DrainUsage + `
  ` + cli.UndrainUsage + `
  ` + cli.ReloadUsage + `
  npubroker --version

Commands:
  serve         run the broker (as root in production; unprivileged for tests)
  check-config  validate a configuration file and name every error's line
  status        who holds which device, the line, unleased use (any user)
  usage         device-hours per user and kind of lease (any user)
  drain         take a device out of service: no new lease on it (root)
  undrain       put a drained device back in service (root)
  reload        read the configuration file again, without a restart (root; also SIGHUP)
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(exitcode.Usage)
	}
	if shell, ok := strings.CutPrefix(os.Args[1], "--completion="); ok {
		os.Exit(printCompletion([]string{shell}))
	}
	switch os.Args[1] {
	case "serve":
		os.Exit(serve(os.Args[2:]))
	case "check-config":
		os.Exit(checkConfig(os.Args[2:]))
	case "status":
		os.Exit(cli.Status(os.Args[2:], cli.OSEnv()))
	case "usage":
		os.Exit(cli.Usage(os.Args[2:], cli.OSEnv()))
	case "drain":
		os.Exit(cli.Drain(os.Args[2:], cli.OSEnv()))
	case "undrain":
		os.Exit(cli.Undrain(os.Args[2:], cli.OSEnv()))
	case "reload":
		os.Exit(cli.Reload(os.Args[2:], cli.OSEnv()))
	case "--version", "version":
		fmt.Println("npubroker", version)
	case "--completion":
		os.Exit(printCompletion(os.Args[2:]))
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "npubroker: unknown command %q\n", os.Args[1])
		fmt.Fprint(os.Stderr, usage)
		os.Exit(exitcode.Usage)
	}
}

const checkConfigHelp = `Validate a configuration file (default ` + broker.DefaultConfig + `) as serve and
reload take it up (one validation, broker.LoadConfig) and name every
problem by file, line and key. Errors exit 1: the file's, and the devices
it names missing from this machine (serve would not start: no device node
of the vendor in dev_dir, one of ids missing). Warnings, also on standard
error, leave the status 0: a [user.NAME] or [group.NAME] for an account
this machine does not know (yet), devices that [pools] puts in no pool, a
[restrict]ed account still in a group that may open the device nodes, or
in a container engine's (docker: root in all but name), [slurm]
gres_devices that disagree with Slurm's gres.conf (beside $SLURM_CONF, or
[slurm] gres_conf): counts, and File= nodes that are not the mapped
devices' nodes; and, run as root where a broker answers on the socket
(--socket, else $NPURUN_SOCKET or the default), a file that its reload
refuses (a change that needs a restart, named), by the broker's own
checks.
`

// checkConfigOptions are check-config's options.
var checkConfigOptions = []completion.Option{
	{Long: "socket", Value: "PATH", Complete: completion.Files,
		Help:    "the socket of the broker whose reload to check the file against, where one runs (default $NPURUN_SOCKET, or " + wire.DefaultSocket + ")",
		Summary: "the socket of the broker whose reload to check the file against"},
}

func checkConfig(args []string) int {
	fs, code, done := cli.Parse("npubroker check-config", checkConfigOptions, usage+"\n"+checkConfigHelp, false, args, os.Stderr)
	if done {
		return code
	}
	path := broker.DefaultConfig
	switch fs.NArg() {
	case 0:
	case 1:
		path = fs.Arg(0)
	default:
		fmt.Fprintf(os.Stderr, "npubroker: check-config takes one file, got %d\n", fs.NArg())
		return exitcode.Usage
	}
	// The validation of serve and reload: the file, and its devices on
	// this machine (a device node missing is an error, as serve does not
	// start without it).
	cfg, inv, err := broker.LoadConfig(path)
	if err != nil {
		if perrs := (*policy.Errors)(nil); errors.As(err, &perrs) {
			fmt.Fprintln(os.Stderr, err) // each line names the file and line
		} else {
			fmt.Fprintf(os.Stderr, "npubroker: %v\n", err)
		}
		return exitcode.Failure
	}
	devices := inv.IDs
	warnings := cfg.Warnings(devices, accountExists)
	if cfg.Slurm.Active() {
		warnings = append(warnings, slurmWarnings(path, cfg, inv)...)
	}
	if err := local.CheckSupervisor(); err != nil {
		warnings = append(warnings, policy.Error{File: path, Key: "[tasks]", Msg: fmt.Sprintf("warning: %v: npubroker serve would serve leases but refuse tasks", err)})
	}
	if cfg.Restrict.Active() && devices != nil {
		groups, open := npu.NodeAccess(npu.Vendor(cfg.Vendor), cfg.DevDir, devices)
		warnings = append(warnings, cfg.RestrictWarnings(groups, open, npu.Member, npu.Members)...)
	}
	warnings = append(warnings, cfg.EngineWarnings(npu.EngineGroups(npu.EngineSockets), npu.Member, npu.Members)...)
	if w, ok := reloadWarning(path, fs.String("socket")); ok {
		warnings = append(warnings, w)
	}
	for _, w := range warnings {
		fmt.Fprintln(os.Stderr, w.Error())
	}
	fmt.Printf("%s: ok\n", path)
	return exitcode.OK
}

// reloadWarning asks the broker answering at socket (flag, else
// $NPURUN_SOCKET or the default), where there is one and this is root,
// whether a reload would take the file at path, by the broker's own
// checks (Server.CheckReload): a file fine for serve that the running
// broker's reload refuses (a change that needs a restart) is said as a
// warning. No broker, or not root: nothing to say.
func reloadWarning(path, socket string) (policy.Error, bool) {
	if os.Geteuid() != 0 {
		return policy.Error{}, false
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return policy.Error{}, false
	}
	c, err := wire.Dial(wire.SocketPath(socket))
	if err != nil {
		return policy.Error{}, false
	}
	defer c.Close()
	_, err = c.CheckReload(abs)
	var cerr *wire.Error
	switch {
	case err == nil:
		return policy.Error{}, false
	case errors.As(err, &cerr) && cerr.Code == wire.CodeConfigRefused:
		msg, _ := strings.CutPrefix(cerr.Message, broker.ErrReloadRefused.Error()+": ")
		return policy.Error{File: path, Msg: "warning: npubroker reload of the broker running here refuses it: " + msg}, true
	}
	return policy.Error{File: path, Msg: fmt.Sprintf("warning: not checked against the broker running here: %v", err)}, true
}

// accountExists tells whether this machine knows the user or group name
// (through NSS: files, LDAP, sssd).
func accountExists(kind, name string) bool {
	var err error
	if kind == "group" {
		_, err = user.LookupGroup(name)
	} else {
		_, err = user.Lookup(name)
	}
	return err == nil
}

// serveOptions are serve's options, in the order of its --help.
var serveOptions = []completion.Option{
	{Long: "cgroup", Value: "DIR", Complete: completion.Dirs, Words: []string{"auto", "off"},
		Help: "where tasks' control groups go: a cgroup v2 directory, auto or off (default the config's [tasks] cgroup, auto)"},
	{Long: "config", Value: "FILE", Complete: completion.Files, Default: broker.DefaultConfig, Help: "configuration file"},
	{Long: "log", Value: "WHERE", Words: []string{broker.LogAuto, broker.LogStderr, broker.LogSyslog}, Default: broker.LogAuto,
		Help: "where the log goes: stderr, syslog (/dev/log), or auto: standard error, unless it goes nowhere (closed, /dev/null), then the system log"},
	{Long: "run-dir", Value: "DIR", Complete: completion.Dirs, Default: broker.DefaultRunDir,
		Help: "directory of the lock files (RUN-DIR/locks) and, by default, the socket"},
	{Long: "socket", Value: "PATH", Complete: completion.Files, Help: "socket to listen on (default RUN-DIR/broker.sock)"},
	{Long: "state-dir", Value: "DIR", Complete: completion.Dirs,
		Help: "task spool (default the config's [tasks] state_dir, /var/spool/npurun; RUN-DIR/spool when not root)"},
}

func serve(args []string) int {
	fs, code, done := cli.Parse("npubroker serve", serveOptions, usage+"\nOptions of serve:\n", true, args, os.Stderr)
	if done {
		return code
	}
	if code, done := fs.NoArgs(os.Stderr); done {
		return code
	}
	config, runDir, socket := fs.String("config"), fs.String("run-dir"), fs.String("socket")
	stateDir, cgroup, logTo := fs.String("state-dir"), fs.String("cgroup"), fs.String("log")
	if socket == "" {
		socket = filepath.Join(runDir, "broker.sock")
	}
	// Supervisors run in "/" and are told the socket's path: every path is
	// made absolute here, once, against the directory the broker starts in.
	for _, p := range []*string{&runDir, &socket, &stateDir, &config} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			fmt.Fprintf(os.Stderr, "npubroker: %s: %v\n", *p, err)
			return exitcode.Failure
		}
		*p = abs
	}
	if c := cgroup; c != "" && c != "auto" && c != "off" && !filepath.IsAbs(c) {
		fmt.Fprintf(os.Stderr, "npubroker: --cgroup takes an absolute directory, auto or off, not %q\n", c)
		return exitcode.Usage
	}
	// Whatever descriptors the broker inherited (from a root shell, say)
	// must not reach the supervisors it starts as other users.
	unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	if l := logTo; l != broker.LogAuto && l != broker.LogStderr && l != broker.LogSyslog {
		fmt.Fprintf(os.Stderr, "npubroker: --log takes auto, stderr or syslog, not %q\n", l)
		return exitcode.Usage
	}
	lg, _, err := broker.NewLog(logTo)
	if err != nil {
		fmt.Fprintf(os.Stderr, "npubroker: %v\n", err)
		return exitcode.Failure
	}
	cfg, inv, err := broker.LoadConfig(config) // check-config's and reload's validation
	if err != nil {
		if perrs := (*policy.Errors)(nil); errors.As(err, &perrs) {
			for _, e := range *perrs { // one line each: the log takes no newline inside a line
				lg.Print(e.Error())
			}
		} else {
			lg.Print(err)
		}
		return exitcode.Failure
	}
	if cfg.Slurm.Active() {
		for _, w := range slurmWarnings(config, cfg, inv) { // as check-config says them
			lg.Print(w.Error())
		}
	}
	if stateDir == "" && os.Geteuid() != 0 && cfg.Tasks.StateDir == policy.DefaultStateDir {
		stateDir = filepath.Join(runDir, "spool")
	}
	// One broker per run directory and per state directory, for life.
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		lg.Print(err)
		return exitcode.Failure
	}
	runClaim, err := broker.Claim(runDir)
	if err != nil {
		lg.Print(err)
		return exitcode.Failure
	}
	defer runClaim.Close()
	// And one broker per device, whatever its directories: before any
	// lock file or ACL is touched.
	devClaims, err := broker.ClaimDevices(inv, broker.ClaimDir())
	if err != nil {
		lg.Print(err)
		return exitcode.Failure
	}
	defer devClaims.Close()
	ln, err := broker.Activated()
	if err == nil && ln == nil {
		ln, err = broker.Listen(socket)
	}
	if err != nil {
		lg.Print(err)
		return exitcode.Failure
	}
	if addr := ln.Addr().String(); filepath.Dir(addr) != filepath.Clean(runDir) {
		lg.Printf("warning: socket %s is not in the run directory %s: a nested npurun looks for the lock files beside the socket, so it will not recognise its parent's lease", addr, runDir)
	}
	s, err := broker.New(broker.Options{Config: cfg, ConfigPath: config, Inventory: inv, RunDir: runDir, StateDir: stateDir, Socket: ln.Addr().String(), Cgroup: cgroup, Log: lg})
	if err != nil {
		ln.Close()
		lg.Print(err)
		return exitcode.Failure
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	stopSignals := make(chan os.Signal, 1)
	signal.Notify(stopSignals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		sig := (<-stopSignals).(syscall.Signal)
		lg.Printf("%s: stopping (leases and running tasks go on without the broker)", unix.SignalName(sig))
		stop()
	}()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			s.ReloadLogged("SIGHUP") // its outcome, in the log
		}
	}()
	if cfg.Restrict.Active() {
		groups, open := npu.NodeAccess(inv.Vendor, inv.DevDir, inv.IDs)
		for _, w := range cfg.RestrictWarnings(groups, open, npu.Member, npu.Members) {
			lg.Print(w.Error())
		}
		for _, w := range cfg.EngineWarnings(npu.EngineGroups(npu.EngineSockets), npu.Member, npu.Members) {
			lg.Print(w.Error())
		}
	}
	for _, w := range cfg.StatusWarnings() {
		lg.Print(w.Error())
	}
	lg.Printf("serving %s npu %s on %s", inv.Vendor, npu.FormatIDs(inv.IDs), ln.Addr())
	if err := broker.Notify("READY=1"); err != nil {
		lg.Print(err)
	}
	if err := s.Serve(ctx, ln); err != nil {
		lg.Print(err)
		return exitcode.Failure
	}
	lg.Print("stopped")
	return exitcode.OK
}
