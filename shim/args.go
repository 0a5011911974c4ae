package shim

import (
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
)

// npurun's command line. The parser is written out here rather than taken
// from a flag library: npurun starts in front of every job, and pflag
// brings net, flag and encoding/csv with it (their initialisation is paid
// at every start). The grammar is getopt's: short options may be grouped
// (-vq) and take their value attached or as the next word (-n2, -n 2);
// long ones take it after "=" or as the next word; the first word that is
// not an option, or "--", ends the options.

const usage = `Usage:
  npurun [-n N | -d LIST] [-p POOL] [--no-wait] [--timeout DURATION] [-v | -q] [--socket PATH] [--] COMMAND [ARG...]
  npurun --no-device [--] COMMAND [ARG...]
  npurun --login [-q] [--socket PATH]

Wait for free accelerator devices, lease them from npubroker, set
NPURUN_DEVICES and the vendor's visible-device variable, and become COMMAND.
The lease lasts until COMMAND and every process it started have exited.

Options:
  -n, --devices N          number of devices (default 1)
  -d, --device LIST        exactly these devices: a LIST of physical ids and ranges,
                           such as 3 or 0-3,8; waits for them alone (may be repeated)
  -p, --pool POOL          pool to take devices from (default: the policy's default pool)
      --no-wait            fail at once with status 75 if nothing is free
      --timeout DURATION   give up after this long (e.g. 10m), with status 75
      --no-device          run without a lease, with every device hidden
      --login              become the login shell under the login lease (sshd's
                           ForceCommand for restricted accounts; see pam_npurun(8))
  -v, --verbose            report queue progress even when standard error is not a terminal
  -q, --quiet              report nothing while waiting
      --socket PATH        broker socket (default $NPURUN_SOCKET or /run/npurun/broker.sock)
      --version            print the version and exit
  -h, --help               print this help and exit
`

// errHelp means --help was asked for.
var errHelp = errors.New("help asked for")

// usageError is a command line npurun refuses, with a hint for people.
type usageError struct{ msg, hint string }

func (e *usageError) Error() string { return e.msg }

func badUsage(msg, hint string) error { return &usageError{msg, hint} }

// command is a parsed command line.
type command struct {
	o       Options
	nSet    bool // -n was given (even as 0)
	version bool
	argv    []string
}

// option is one of npurun's options: its names, and whether it takes a
// value.
type option struct {
	short byte
	long  string
	value bool
}

var options = []option{
	{'n', "devices", true}, {'d', "device", true}, {'p', "pool", true},
	{0, "no-wait", false}, {0, "timeout", true}, {0, "no-device", false}, {0, "login", false},
	{'v', "verbose", false}, {'q', "quiet", false}, {0, "socket", true}, {0, "version", false},
	{'h', "help", false},
}

func findLong(name string) *option {
	for i := range options {
		if options[i].long == name {
			return &options[i]
		}
	}
	return nil
}

func findShort(c byte) *option {
	for i := range options {
		if options[i].short == c && c != 0 {
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
			if !opt.value && hasValue {
				return nil, badUsage("option --"+name+" takes no value", "")
			}
			if opt.value && !hasValue {
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
			if opt.value {
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
			if err := cmd.set(opt, "-"+string(opt.short), value); err != nil {
				return nil, err
			}
		}
	}
	cmd.argv = args[i:]
	cmd.o.Devices = slices.Compact(slices.Sorted(slices.Values(cmd.o.Devices)))
	return cmd, nil
}

// set applies one option with its value; name is how it was written.
func (c *command) set(opt *option, name, value string) error {
	o := &c.o
	switch opt.long {
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
	case "no-wait":
		o.NoWait = true
	case "timeout":
		d, err := quantity.ParseDuration(value)
		if de := (*quantity.DurationError)(nil); errors.As(err, &de) {
			return badUsage(de.For(name), "--timeout takes "+quantity.DurationHelp)
		}
		o.Timeout = d
	case "no-device":
		o.NoDevice = true
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
	}
	return nil
}

// check refuses combinations of options that make no sense.
func (c *command) check() error {
	o := &c.o
	if o.Login {
		if len(c.argv) > 0 || o.NoDevice || c.nSet || len(o.Devices) > 0 || o.Pool != "" || o.NoWait || o.Timeout != 0 || o.Verbose {
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
	}
	return nil
}

// Main is npurun: args is its command line without the program's name. It
// returns only when it could not become the command, with the exit status
// to use.
func Main(args []string, version string) int {
	cmd, err := parseArgs(args)
	if err == nil && cmd.version {
		os.Stdout.WriteString("npurun " + version + "\n")
		return 0
	}
	if err == nil {
		err = cmd.check()
	}
	var ue *usageError
	switch {
	case errors.Is(err, errHelp):
		os.Stderr.WriteString(usage)
		return 0
	case errors.As(err, &ue):
		warn("%s", ue.msg)
		if ue.hint != "" {
			hint("%s", ue.hint)
		}
		return ExitUsage
	}
	if cmd.o.Login {
		return Login(cmd.o)
	}
	return Run(cmd.o, cmd.argv)
}
