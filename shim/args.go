package shim

import (
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/npurun/npurun/internal/completion"
	"github.com/npurun/npurun/internal/exitcode"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
)

// npurun's command line. The parser is written out here rather than taken
// from a flag library: npurun starts in front of every job, and pflag
// brings net, flag and encoding/csv with it (their initialisation is paid
// at every start). The grammar is getopt's: short options may be grouped
// (-vq) and take their value attached or as the next word (-n2, -n 2);
// long ones take it after "=" or as the next word; the first word that is
// not an option, or "--", ends the options.

// usageHead is what --help prints before the options.
const usageHead = `Usage:
  npurun [-n N | -d LIST] [-p POOL] [-m SIZE] [--no-wait] [--timeout DURATION] [--time DURATION] [-v | -q] [--socket PATH] [--] COMMAND [ARG...]
  npurun [-n N | -d LIST] [-p POOL] [-m SIZE] [--no-wait] [--timeout DURATION] [--time DURATION] [-v | -q] [--socket PATH] [--container ENGINE] [--] docker|podman run [RUN-OPTION...] IMAGE [ARG...]
  npurun --no-device [--] COMMAND [ARG...]
  npurun --login [-q] [--socket PATH]
  npurun status [--json] [--watch] [--cluster] [--socket PATH]
  npurun usage [--since DUR] [--user USER] [--json] [--socket PATH]

Wait for free accelerator devices, lease them from npubroker, set
NPURUN_DEVICES and the vendor's visible-device variable, and become COMMAND.
The lease lasts until COMMAND and every process it started have exited.
A docker or podman run gets the lease in its container, with the devices'
nodes, and holds it for the container's life.

npurun status and npurun usage are npubroker's status and usage, for every
user: who holds which device, the line, unleased use; device-hours per user
(npurun status --help). To run a program named status: npurun -- status.

Options:
`

// options are npurun's options: the parser below, the --help text and the
// completion scripts (npurun --completion SHELL) all read this table.
// The parser is by hand, but TestParserIsTable holds it to the table:
// every option that set handles is in it, every one in it is handled,
// and its value is read where the table says it has one. It is laid out
// by the compiler: nothing of it is computed at start-up (-h, --help and
// --completion are written out, as completion.HelpOption and
// CompletionOption are, TestSharedOptions says).
var options = []completion.Option{
	{Short: 'n', Long: "devices", Value: "N", Help: "number of devices (default 1)"},
	{Short: 'd', Long: "device", Value: "LIST", Many: true, Complete: completion.Devices,
		Help: "exactly these devices: a LIST of physical ids and ranges,\nsuch as 3 or 0-3,8; waits for them alone (may be repeated)"},
	{Short: 'p', Long: "pool", Value: "POOL", Complete: completion.Pools, Help: "pool to take devices from (default: the policy's default pool)"},
	{Short: 'm', Long: "mem", Value: "SIZE", Help: "a share of each device, of SIZE of its memory (12G, 512M;\na bare number is GiB), on a device the policy shares"},
	{Long: "no-wait", Help: "fail at once with status 75 if nothing is free"},
	{Long: "timeout", Value: "DURATION", Help: "give up after this long (e.g. 10m), with status 75"},
	{Long: "time", Value: "DURATION", Help: "time limit of the lease (e.g. 30m): the command is sent SIGTERM\nafter it, SIGKILL after [tasks] kill_grace; lets it backfill"},
	{Long: "no-device", Help: "run without a lease, with every device hidden"},
	{Long: "container", Value: "ENGINE", Words: []string{"docker", "podman"},
		Help: "COMMAND is this engine's (docker or podman), whatever its name:\nits run's container gets the lease (automatic for docker, podman)"},
	{Long: "login", Help: "become the login shell under the login lease (sshd's\nForceCommand for restricted accounts; see pam_npurun(8))"},
	{Short: 'v', Long: "verbose", Help: "report queue progress even when standard error is not a terminal"},
	{Short: 'q', Long: "quiet", Help: "report nothing while waiting"},
	{Long: "socket", Value: "PATH", Complete: completion.Files, Help: "broker socket (default $NPURUN_SOCKET or /run/npurun/broker.sock)"},
	{Long: "version", Help: "print the version and exit"},
	{Short: 'h', Long: "help", Help: "print this help and exit"},
	{Long: "completion", Value: "SHELL", Hidden: true, Words: []string{"bash", "zsh", "fish"},
		Help: "print the completion script for bash, zsh or fish and exit"},
}

// helpGap is the blanks between the longest option and its help.
const helpGap = 3

// usage is what --help prints.
func usage() string { return usageHead + completion.Help(options, helpGap) }

// errHelp means --help was asked for.
var errHelp = errors.New("help asked for")

// usageError is a command line npurun refuses, with a hint for people.
type usageError struct{ msg, hint string }

func (e *usageError) Error() string { return e.msg }

func badUsage(msg, hint string) error { return &usageError{msg, hint} }

// command is a parsed command line.
type command struct {
	o          Options
	nSet       bool // -n was given (even as 0)
	version    bool
	completion string // --completion SHELL
	argv       []string
}

func findLong(name string) *completion.Option {
	for i := range options {
		if options[i].Long == name {
			return &options[i]
		}
	}
	return nil
}

func findShort(c byte) *completion.Option {
	for i := range options {
		if options[i].Short == c && c != 0 {
			return &options[i]
		}
	}
	return nil
}

// parseArgs reads npurun's command line (without the program name).
func parseArgs(args []string) (*command, error) {
	cmd := &command{}
	i := 0
	for i < len(args) {
		a := args[i]
		if a == "--" {
			i++
			break
		}
		if len(a) < 2 || a[0] != '-' {
			break
		}
		i++
		if strings.HasPrefix(a, "--") {
			name, value, hasValue := strings.Cut(a[2:], "=")
			opt := findLong(name)
			if opt == nil {
				return nil, badUsage("unknown option --"+name, "npurun --help lists the options")
			}
			if opt.Value == "" && hasValue {
				return nil, badUsage("option --"+name+" takes no value", "")
			}
			if opt.Value != "" && !hasValue {
				if i == len(args) {
					return nil, badUsage("option --"+name+" needs a value", "")
				}
				value = args[i]
				i++
			}
			if err := cmd.set(opt, "--"+name, value); err != nil {
				return nil, err
			}
			continue
		}
		// Grouped short options: -vq, -n2, -d 0-3.
		for j := 1; j < len(a); j++ {
			opt := findShort(a[j])
			if opt == nil {
				return nil, badUsage("unknown option -"+a[j:j+1], "npurun --help lists the options")
			}
			value := ""
			if opt.Value != "" {
				if j+1 < len(a) {
					value = a[j+1:]
				} else if i < len(args) {
					value = args[i]
					i++
				} else {
					return nil, badUsage("option -"+a[j:j+1]+" needs a value", "")
				}
				j = len(a)
			}
			if err := cmd.set(opt, "-"+string(opt.Short), value); err != nil {
				return nil, err
			}
		}
	}
	cmd.argv = args[i:]
	cmd.o.Devices = slices.Compact(slices.Sorted(slices.Values(cmd.o.Devices)))
	return cmd, nil
}

// set applies one option with its value; name is how it was written.
func (c *command) set(opt *completion.Option, name, value string) error {
	o := &c.o
	switch opt.Long {
	case "devices":
		n, err := strconv.Atoi(value)
		if err != nil {
			return badUsage("bad device count "+strconv.Quote(value)+" for "+name, "-n takes a number of devices, such as -n 2")
		}
		o.N, c.nSet = n, true
	case "device":
		ids, err := npu.ParseIDs(value)
		if err != nil {
			return badUsage("bad device list "+strconv.Quote(value)+": "+err.Error(), "-d takes physical ids and ranges, such as -d 3 or -d 0-3,8")
		}
		o.Devices = append(o.Devices, ids...)
	case "pool":
		o.Pool = value
	case "mem":
		mib, err := quantity.ParseSize(value)
		if se := (*quantity.SizeError)(nil); errors.As(err, &se) {
			return badUsage(se.For(name), "--mem takes a size of device memory, such as 12G or 512M")
		}
		o.Mem = mib
	case "no-wait":
		o.NoWait = true
	case "timeout":
		d, err := quantity.ParseDuration(value)
		if de := (*quantity.DurationError)(nil); errors.As(err, &de) {
			return badUsage(de.For(name), "--timeout takes "+quantity.DurationHelp)
		}
		o.Timeout = d
	case "time":
		d, err := quantity.ParseDuration(value)
		if de := (*quantity.DurationError)(nil); errors.As(err, &de) {
			return badUsage(de.For(name), "--time takes "+quantity.DurationHelp)
		}
		if d > wire.MaxTimeSec*time.Second {
			return badUsage("bad duration "+strconv.Quote(value)+" for "+name+": longer than "+quantity.Duration(wire.MaxTimeSec*time.Second)+", the most", "")
		}
		o.Time = d
	case "no-device":
		o.NoDevice = true
	case "container":
		if !slices.Contains([]string{"docker", "podman"}, value) {
			return badUsage("--container takes docker or podman, not "+strconv.Quote(value), "")
		}
		o.Container = value
	case "login":
		o.Login = true
	case "verbose":
		o.Verbose = true
	case "quiet":
		o.Quiet = true
	case "socket":
		o.Socket = value
	case "version":
		c.version = true
	case "help":
		return errHelp
	case "completion":
		if !slices.Contains(completion.Shells, value) {
			return badUsage("--completion takes bash, zsh or fish, not "+strconv.Quote(value), "")
		}
		c.completion = value
	}
	return nil
}

// check refuses combinations of options that make no sense.
func (c *command) check() error {
	o := &c.o
	if o.Login {
		if len(c.argv) > 0 || o.NoDevice || o.Container != "" || c.nSet || len(o.Devices) > 0 || o.Pool != "" || o.NoWait || o.Timeout != 0 || o.Verbose || o.Mem != 0 || o.Time != 0 {
			return badUsage("--login takes no command and no other option but -q and --socket",
				"the policy's [restrict] says what a login gets; sshd passes a command in SSH_ORIGINAL_COMMAND")
		}
		return nil
	}
	switch {
	case len(c.argv) == 0:
		return badUsage("no command given", "npurun python train.py")
	case o.NoDevice && (c.nSet || len(o.Devices) > 0 || o.Pool != ""):
		return badUsage("--no-device takes no device, count or pool", "")
	case o.NoDevice && o.Mem != 0:
		return badUsage("--no-device and --mem exclude each other", "")
	case o.NoDevice && o.Container != "":
		return badUsage("--no-device and --container exclude each other", "")
	case o.N < 0 || (o.N == 0 && c.nSet):
		hint := ""
		if o.N == 0 {
			hint = "to run without a device, use --no-device"
		}
		return badUsage("bad device count "+strconv.Itoa(o.N)+": -n takes 1 or more", hint)
	case len(o.Devices) > 0 && o.Pool != "":
		return badUsage("--device and --pool exclude each other", "")
	case len(o.Devices) > 0 && o.N != 0 && o.N != len(o.Devices):
		return badUsage("-n "+strconv.Itoa(o.N)+" does not match the "+quantity.Count(len(o.Devices), "device", "devices")+" named", "")
	case o.Timeout < 0 || (o.Timeout > 0 && o.NoWait):
		return badUsage("--timeout takes a positive duration and excludes --no-wait", "")
	case o.Time < 0:
		return badUsage("--time takes a positive duration, such as 30m or 6h", "")
	case o.Time > 0 && o.NoDevice:
		return badUsage("--no-device and --time exclude each other", "--time limits a lease; a command without one is not the broker's to end")
	}
	return nil
}

// Main is npurun: args is its command line without the program's name. It
// returns only when it could not become the command, with the exit status
// to use.
func Main(args []string, version string) int {
	if isReport(args) {
		return runReport(args)
	}
	cmd, err := parseArgs(args)
	if err == nil && cmd.version {
		os.Stdout.WriteString("npurun " + version + "\n")
		return 0
	}
	if err == nil && cmd.completion != "" {
		return printCompletion(cmd.completion)
	}
	if err == nil {
		err = cmd.check()
	}
	var ue *usageError
	switch {
	case errors.Is(err, errHelp):
		os.Stderr.WriteString(usage())
		return 0
	case errors.As(err, &ue):
		warn("%s", ue.msg)
		if ue.hint != "" {
			hint("%s", ue.hint)
		}
		return exitcode.Usage
	}
	if cmd.o.Login {
		return Login(cmd.o)
	}
	if loginNode() {
		return runCluster(cmd.o, cmd.argv)
	}
	return Run(cmd.o, cmd.argv)
}
