// Package cli is task-submit: it queues a command to run detached on
// accelerator devices leased from npubroker, and lists, shows, follows,
// waits for and cancels such tasks. Run is the whole program; the command's
// main only calls it. It talks to the broker over the wire as the user who
// runs it and must never need privileges of its own.
package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/npurun/npurun/internal/completion"
	"github.com/npurun/npurun/internal/exitcode"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
	_ "github.com/npurun/npurun/wire/jsoncodec" // messages beyond the lease exchange
)

const usage = `Usage:
  task-submit [-n N | -d LIST | --no-device] [-p POOL] [--mem SIZE [--oom-retries N]] [--time DURATION] [--name NAME] [--after ID[,ID...]] [--log FILE] [--notify CMD | --no-notify] [--token TOKEN] [--json] (--run STRING | -- COMMAND [ARG...])
  task-submit list [--all] [--ended [--since DURATION]] [--json]
  task-submit show [--json] ID
  task-submit logs [-f] ID
  task-submit wait ID
  task-submit cancel ID
  task-submit hold ID
  task-submit release ID
  task-submit requeue [--json] ID

Queue a command with npubroker, which runs it as you, in this directory, with
this environment and umask, once the devices it needs are free, writing its
output to a log file. Every form also takes --socket PATH.

Options:
`

// subcommand is a command other than submitting.
type subcommand struct {
	name    string
	id      completion.Kind     // what completes its task id; None: it takes none
	help    string              // what it does, for the completion scripts
	options []completion.Option // its table of options, in the order of --help
}

// socketOption is --socket, of every form.
var socketOption = completion.Option{Long: "socket", Value: "PATH", Complete: completion.Files, Help: socketHelp}

// commands are the commands other than submitting.
var commands = []subcommand{
	{"list", completion.None, "list your tasks (--all: everyone's)", []completion.Option{
		{Long: "all", Help: "everyone's tasks (others' commands as npubroker status shows them)"},
		{Long: "ended", Help: "the tasks that have ended: those the broker keeps, then those its accounting log remembers"},
		{Long: "since", Value: "DURATION", Help: "with --ended: those that ended within DURATION, e.g. 7d or 12h (default 7d)"},
		{Long: "json", Help: "print the tasks as a JSON array"},
		socketOption}},
	{"show", completion.Tasks, "show a task", []completion.Option{
		{Long: "json", Help: "print the task as JSON"},
		socketOption}},
	{"logs", completion.Tasks, "print a task's log (-f: follow it)", []completion.Option{
		{Short: 'f', Long: "follow", Help: "follow the log until the task ends"},
		socketOption}},
	{"wait", completion.Tasks, "wait for a task to end and exit with its status", []completion.Option{socketOption}},
	{"cancel", completion.LiveTasks, "cancel a task", []completion.Option{socketOption}},
	{"hold", completion.LiveTasks, "keep a waiting task from starting; it keeps its place in line", []completion.Option{socketOption}},
	{"release", completion.LiveTasks, "let a held task start again", []completion.Option{socketOption}},
	{"requeue", completion.Tasks, "submit an ended task again, as a new task", []completion.Option{
		{Long: "json", Help: "print the new task's id, position and pool as JSON"},
		socketOption}},
}

// takes tells whether c has the option long.
func (c *subcommand) takes(long string) bool {
	for _, o := range c.options {
		if o.Long == long {
			return true
		}
	}
	return false
}

// lookupCommand is the command named name, or nil.
func lookupCommand(name string) *subcommand {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

// options is one invocation, parsed.
type options struct {
	cmd     string // "submit" or one of commands
	socket  string
	json    bool
	all     bool          // list
	ended   bool          // list
	since   time.Duration // list --ended
	follow  bool          // logs
	id      uint64        // show, logs, wait, cancel, hold, release, requeue
	sub     wire.Submission
	cpus    int // --cpus: through Slurm only
	version bool
	// completion is the shell whose completion script was asked for
	// (--completion SHELL).
	completion string
}

// usageError is a bad command line: exit status 2.
type usageError struct{ msg, hint string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errHelp means --help was asked for and the usage printed.
var errHelp = errors.New("help requested")

// Run is task-submit run with args (os.Args[1:]); version is what
// --version prints. It returns the exit status.
func Run(args []string, version string) int {
	if len(args) > 0 && args[0] == "__complete" {
		return completeValues(args[1:], os.Stdout)
	}
	if len(args) > 0 && args[0] == "__npurun" {
		return runSrun(args[1:])
	}
	if len(args) > 0 && args[0] == "__script" {
		return printScript(args[1:], os.Stdout)
	}
	o, err := parse(args, os.Stderr)
	var ue *usageError
	switch {
	case errors.Is(err, errHelp):
		return 0
	case errors.As(err, &ue):
		warn("%s", ue.msg)
		if ue.hint != "" {
			hint("%s", ue.hint)
		}
		return exitcode.Usage
	case err != nil:
		warn("%v", err)
		return exitcode.Usage
	case o.version:
		fmt.Println("task-submit", version)
		return 0
	case o.completion != "":
		return printCompletion(os.Stdout, o.completion)
	}
	return run(o)
}

// maxTime is the longest --time, the broker's: rounded up to seconds
// below, it stays inside a time.Duration (the largest ones wrapped
// negative).
const maxTime = wire.MaxTimeSec * time.Second

// defaultSince is how far back list --ended looks without --since, and
// maxSince the furthest it may (beyond it the accounting log is gone).
const (
	defaultSince = 7 * 24 * time.Hour
	maxSince     = 100 * 365 * 24 * time.Hour
)

const socketHelp = "broker socket (default $NPURUN_SOCKET or /run/npurun/broker.sock)"

// submitArgs are the options of submitting that parse checks once all
// are read, rather than as each is set.
type submitArgs struct {
	limit   time.Duration
	after   []string
	run     string
	devices []string
	mem     string
}

// submitOptions are the options of submitting, in the order of --help.
var submitOptions = []completion.Option{
	{Short: 'n', Long: "devices", Value: "N", Help: "number of devices (default 1)"},
	{Short: 'd', Long: "device", Value: "LIST", Many: true, Complete: completion.Devices,
		Help: "exactly these devices: a LIST of physical ids and ranges, such as 3 or 0-3,8 (may be repeated)"},
	{Long: "no-device", Help: "take no device; run when a CPU slot is free"},
	{Long: "cpus", Value: "N", Help: "through a cluster's Slurm ([cluster]): CPUs for the task (--cpus-per-task)"},
	{Short: 'p', Long: "pool", Value: "POOL", Complete: completion.Pools, Help: "pool to take devices from (default: the policy's default pool)"},
	{Short: 'm', Long: "mem", Value: "SIZE", Help: "a share of each device, of SIZE of its memory (12G, 512M; a bare number is GiB)"},
	{Long: "oom-retries", Value: "N", Help: "with --mem: submit the task again, up to N times, if it fails out of device memory, declaring 1.25x its peak"},
	{Long: "time", Value: "DURATION", Help: "time limit, e.g. 6h, 90m or 1d, after which the task is killed (default: the policy's)"},
	{Long: "name", Value: "NAME", Help: "name to list the task by instead of its command"},
	{Long: "after", Value: "ID[,ID...]", Many: true, Complete: completion.Tasks, Help: "start only once these tasks have succeeded"},
	{Long: "log", Value: "FILE", Complete: completion.Files, Help: "log file (default ~/.local/state/npurun/tasks/ID-TAG.log, TAG naming the broker's journal)"},
	{Long: "run", Value: "STRING", Help: "command line run by your shell, instead of -- COMMAND [ARG...]"},
	{Long: "notify", Value: "CMD", Help: "command line run by /bin/sh as you once the task has ended, with NPURUN_TASK_ID, NPURUN_TASK_STATE and NPURUN_TASK_EXIT set (default: the policy's [tasks] notify)"},
	{Long: "no-notify", Help: "run no notify command, not even the policy's"},
	{Long: "token", Value: "TOKEN", Help: "name this submission (default: a random one): submitted again with the same TOKEN, it makes no second task"},
	{Long: "json", Help: "print the task's id, position and pool as JSON"},
	socketOption,
	{Long: "version", Help: "print the version and exit"},
	completion.CompletionOption,
}

// submitFlags are the options of submitting, bound to o and a.
func submitFlags(o *options, a *submitArgs) *flagSet {
	fs := newFlags("task-submit", false, submitOptions)
	fs.countVar(&o.sub.N, "devices", "device count", "-n takes a number of devices, such as -n 2")
	fs.listVar(&a.devices, "device", false)
	fs.switchVar(&o.sub.NoDevice, "no-device")
	fs.countVar(&o.cpus, "cpus", "CPU count", "--cpus takes a number of CPUs, such as --cpus 4")
	fs.stringVar(&o.sub.Pool, "pool")
	fs.stringVar(&a.mem, "mem")
	fs.countVar(&o.sub.OOMRetries, "oom-retries", "retry count", "--oom-retries takes a number of retries, such as --oom-retries 2")
	fs.durationVar(&a.limit, "time", maxTime)
	fs.stringVar(&o.sub.Name, "name")
	fs.listVar(&a.after, "after", true)
	fs.stringVar(&o.sub.Log, "log")
	fs.stringVar(&a.run, "run")
	fs.stringVar(&o.sub.Notify, "notify")
	fs.switchVar(&o.sub.NoNotify, "no-notify")
	fs.stringVar(&o.sub.Token, "token")
	fs.switchVar(&o.json, "json")
	fs.stringVar(&o.socket, "socket")
	fs.switchVar(&o.version, "version")
	completionFlag(fs, &o.completion)
	return fs
}

// commandFlags are the options of cmd, a command other than submitting,
// bound to o: those of every command are bound, each flag set taking
// those of its table.
func commandFlags(o *options, cmd string) *flagSet {
	fs := newFlags("task-submit "+cmd, true, lookupCommand(cmd).options)
	fs.switchVar(&o.all, "all")
	fs.switchVar(&o.ended, "ended")
	fs.durationVar(&o.since, "since", maxSince)
	fs.switchVar(&o.json, "json")
	fs.switchVar(&o.follow, "follow")
	fs.stringVar(&o.socket, "socket")
	return fs
}

// parse reads the command line; usage goes to stderr when asked for.
func parse(args []string, stderr io.Writer) (*options, error) {
	o := &options{cmd: "submit"}
	var a submitArgs
	fs := submitFlags(o, &a)
	if err := fs.parse(args); err != nil {
		return nil, helpOr(fs, stderr, err)
	}
	if o.version || o.completion != "" {
		return o, nil
	}
	rest := fs.args
	if len(rest) > 0 && fs.dashAt < 0 {
		ok := lookupCommand(rest[0]) != nil
		if !ok && fs.changed["run"] {
			return nil, &usageError{
				msg:  fmt.Sprintf("--run takes one string, and %q follows it", rest[0]),
				hint: fmt.Sprintf("quote the whole command line: --run %q", strings.Join(append([]string{a.run}, rest...), " ")),
			}
		}
		if !ok {
			return nil, &usageError{
				msg:  fmt.Sprintf("unknown command %q", rest[0]),
				hint: fmt.Sprintf("to submit it: task-submit -- %s, or task-submit --run %q", strings.Join(rest, " "), strings.Join(rest, " ")),
			}
		}
		for _, name := range fs.given() {
			if name != "socket" && name != "json" {
				return nil, usagef("--%s is for submitting, not for %s", name, rest[0])
			}
		}
		return parseCommand(o, rest[0], rest[1:], stderr)
	}

	s := &o.sub
	for _, d := range a.devices {
		ids, err := npu.ParseIDs(d)
		if err != nil {
			return nil, &usageError{msg: fmt.Sprintf("bad device list %q: %v", d, err), hint: "-d takes physical ids and ranges, such as -d 3 or -d 0-3,8"}
		}
		s.Devices = append(s.Devices, ids...)
	}
	s.Devices = slices.Compact(slices.Sorted(slices.Values(s.Devices)))
	if fs.changed["mem"] {
		mib, err := quantity.ParseSize(a.mem)
		if se := (*quantity.SizeError)(nil); errors.As(err, &se) {
			return nil, &usageError{msg: se.For("--mem"), hint: "--mem takes a size of device memory, such as 12G or 512M"}
		}
		s.Mem = mib
	}
	switch {
	case fs.changed["run"] && len(rest) > 0:
		return nil, usagef("--run and a command after -- exclude each other")
	case !fs.changed["run"] && len(rest) == 0:
		return nil, &usageError{msg: "no command given", hint: `task-submit --run "python train.py", or task-submit -- python train.py`}
	case fs.changed["run"] && strings.TrimSpace(a.run) == "":
		return nil, usagef("--run takes a command line")
	case s.NoDevice && (fs.changed["devices"] || len(s.Devices) > 0 || s.Pool != ""):
		return nil, usagef("--no-device takes no device, count or pool")
	case s.NoDevice && fs.changed["mem"]:
		return nil, usagef("--no-device and --mem exclude each other")
	case fs.changed["cpus"] && (o.cpus < 1 || o.cpus > 4096):
		return nil, usagef("--cpus takes 1 to 4096 CPUs")
	case fs.changed["oom-retries"] && (s.OOMRetries < 0 || s.OOMRetries > 100):
		return nil, usagef("--oom-retries takes 0 to 100 retries")
	case s.OOMRetries > 0 && !fs.changed["mem"]:
		return nil, &usageError{msg: "--oom-retries needs --mem: a retry raises the declaration of a share", hint: "task-submit --mem 20G --oom-retries 2 -- COMMAND"}
	case s.N < 0:
		return nil, usagef("bad device count %d: -n takes 1 or more", s.N)
	case s.N == 0 && fs.changed["devices"]:
		return nil, &usageError{msg: "bad device count 0: -n takes 1 or more", hint: "for a task that needs no device, use --no-device"}
	case len(s.Devices) > 0 && s.Pool != "":
		return nil, usagef("--device and --pool exclude each other")
	case len(s.Devices) > 0 && s.N != 0 && s.N != len(s.Devices):
		return nil, usagef("-n %d does not match the %s named", s.N, quantity.Count(len(s.Devices), "device", "devices"))
	case fs.changed["pool"] && s.Pool == "":
		return nil, usagef("--pool takes a pool name")
	case fs.changed["time"] && a.limit <= 0:
		return nil, usagef("--time takes a positive duration, such as 6h, 90m or 1d")
	case fs.changed["log"] && s.Log == "":
		return nil, usagef("--log takes a file name")
	case fs.changed["notify"] && strings.TrimSpace(s.Notify) == "":
		return nil, &usageError{msg: "--notify takes a command line", hint: "for no notify command at all, use --no-notify"}
	case s.Notify != "" && s.NoNotify:
		return nil, usagef("--notify and --no-notify exclude each other")
	case strings.ContainsFunc(s.Notify, func(r rune) bool { return unicode.IsControl(r) && r != '\t' }):
		return nil, usagef("--notify takes one line of shell")
	case wire.CheckName("task", s.Name, wire.MaxTaskName) != nil:
		return nil, usagef("--name takes one line of printable text: %v", wire.CheckName("task", s.Name, wire.MaxTaskName))
	case fs.changed["token"] && (s.Token == "" || len(s.Token) > wire.MaxToken || strings.IndexFunc(s.Token, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0):
		return nil, usagef("--token takes 1 to %d characters of printable ASCII, no space", wire.MaxToken)
	}
	for _, v := range a.after {
		id, err := parseID(v)
		if err != nil {
			return nil, usagef("--after: %v", err)
		}
		s.After = append(s.After, id)
	}
	s.TimeSec = int64((a.limit + time.Second - 1) / time.Second)
	if fs.changed["run"] {
		s.Shell = a.run
	} else {
		s.Argv = rest
	}
	return o, nil
}

// parseCommand reads the flags and the id of a command other than submit.
func parseCommand(o *options, cmd string, args []string, stderr io.Writer) (*options, error) {
	o.cmd = cmd
	fs := commandFlags(o, cmd)
	if o.json && !lookupCommand(cmd).takes("json") {
		return nil, usagef("%s takes no --json", cmd)
	}
	if err := fs.parse(args); err != nil {
		return nil, helpOr(fs, stderr, err)
	}
	if cmd == "list" {
		switch {
		case len(fs.args) > 0:
			return nil, usagef("list takes no arguments")
		case fs.changed["since"] && !o.ended:
			return nil, &usageError{msg: "--since is for --ended", hint: "task-submit list --ended --since 7d"}
		case fs.changed["since"] && o.since <= 0:
			return nil, usagef("--since takes a positive duration, such as 7d or 12h")
		case o.ended && !fs.changed["since"]:
			o.since = defaultSince
		}
		return o, nil
	}
	if len(fs.args) != 1 {
		return nil, &usageError{msg: cmd + " takes one task id", hint: "task-submit " + cmd + " 118"}
	}
	id, err := parseID(fs.args[0])
	if err != nil {
		return nil, &usageError{msg: err.Error()}
	}
	o.id = id
	return o, nil
}

// helpOr prints the usage and fs's options for --help, which it returns;
// any other error it returns as it is.
func helpOr(fs *flagSet, stderr io.Writer, err error) error {
	if errors.Is(err, errHelp) {
		fs.printUsage(stderr)
	}
	return err
}

// parseID reads a task id: a positive decimal number.
func parseID(s string) (uint64, error) {
	id, err := strconv.ParseUint(s, 10, 64)
	if err != nil || id == 0 {
		return 0, fmt.Errorf("bad task id %q", s)
	}
	return id, nil
}

func warn(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "task-submit: "+format+"\n", args...)
}

func hint(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "task-submit: hint: "+format+"\n", args...)
}
