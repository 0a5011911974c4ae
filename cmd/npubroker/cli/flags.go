package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"

	"github.com/npurun/npurun/internal/completion"
	"github.com/npurun/npurun/internal/exitcode"
	"github.com/npurun/npurun/wire"
)

// npubroker's commands parse their options with pflag, each flag set made
// from the command's table of options (completion.Option), which its
// completion script is written from too: Flags is the one place a table
// becomes flags. An option with a Value is a string flag (pflag's --help
// shows its value as "string"), one without a switch; Default is the
// string's value when not given, and --help says it. The table's order is
// --help's and the script's. -h, --help is pflag's own, in no table.

// Flags are a flag set made from a table of options, and what its parse
// found.
type Flags struct {
	*pflag.FlagSet
	table []completion.Option
}

// NewFlags makes the flag set named name (npubroker serve) from table.
func NewFlags(name string, table []completion.Option) *Flags {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SortFlags = false
	for _, o := range table {
		short := ""
		if o.Short != 0 {
			short = string(o.Short)
		}
		if o.Value == "" {
			fs.BoolP(o.Long, short, false, o.Help)
		} else {
			fs.StringP(o.Long, short, o.Default, o.Help)
		}
	}
	return &Flags{FlagSet: fs, table: table}
}

// Parse makes the flag set named name (npubroker serve) from table and
// parses args: the one prologue of every npubroker command. -h, --help
// writes help to stderr, then the options unless help already says them
// all (options false), and ends the command with 0; an option it does not
// know or a missing value is said as "npubroker: …" and ends it with 2
// (usage). done says the command ends there, with code.
func Parse(name string, table []completion.Option, help string, options bool, args []string, stderr io.Writer) (f *Flags, code int, done bool) {
	f = NewFlags(name, table)
	f.SetOutput(stderr)
	f.Usage = func() {
		fmt.Fprint(stderr, help)
		if options {
			f.PrintDefaults()
		}
	}
	if err := f.FlagSet.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return f, exitcode.OK, true
		}
		fmt.Fprintf(stderr, "npubroker: %v\n", err)
		return f, exitcode.Usage, true
	}
	return f, 0, false
}

// NoArgs ends a command that takes no arguments where it was given one,
// with 2 (usage) and the first of them named; done says it ends.
func (f *Flags) NoArgs(stderr io.Writer) (code int, done bool) {
	if f.NArg() > 0 {
		fmt.Fprintf(stderr, "npubroker: %s takes no arguments, got %q\n", strings.TrimPrefix(f.Name(), "npubroker "), f.Arg(0))
		return exitcode.Usage, true
	}
	return 0, false
}

// String is the value of the string option long, as parsed.
func (f *Flags) String(long string) string {
	v, err := f.GetString(long)
	if err != nil {
		panic("npubroker: option --" + long + " is not a string of " + f.Name() + "'s table: " + err.Error())
	}
	return v
}

// Bool is the value of the switch long, as parsed.
func (f *Flags) Bool(long string) bool {
	v, err := f.GetBool(long)
	if err != nil {
		panic("npubroker: option --" + long + " is not a switch of " + f.Name() + "'s table: " + err.Error())
	}
	return v
}

// socketOption is --socket of the commands that ask the broker.
var socketOption = completion.Option{Long: "socket", Value: "PATH", Complete: completion.Files,
	Help: "the broker's socket (default $NPURUN_SOCKET, or " + wire.DefaultSocket + ")"}

// jsonOption is --json of the commands that print the broker's answer.
var jsonOption = completion.Option{Long: "json", Help: "print the broker's answer as JSON"}

// The tables of options of the commands of this package, in the order of
// their --help.
var (
	StatusOptions = []completion.Option{
		{Long: "json", Help: "print the broker's answer as JSON (one object per line with --watch)"},
		socketOption,
		{Short: 'w', Long: "watch", Help: "print again whenever something changes, until interrupted"},
		{Long: "cluster", Help: "on a login node ([cluster] in npurun.conf): every node's devices and their jobs, the line and each user's use, from Slurm"},
	}
	UsageOptions = []completion.Option{
		{Long: "by", Value: "WHAT", Default: wire.UsageByUser, Words: []string{wire.UsageByUser, wire.UsageByDevice},
			Help:    "sum per user, kind of lease and pool (user) or per device (device)",
			Summary: `sum per user, kind of lease and pool (user) or per device (device) (default "` + wire.UsageByUser + `")`},
		{Long: "json", Help: "print the sums as JSON"},
		{Long: "since", Value: "DUR", Default: DefaultUsageSince, Help: "how far back to count: a duration such as 7d, 24h or 90m",
			Summary: `how far back to count: a duration such as 7d, 24h or 90m (default "` + DefaultUsageSince + `")`},
		socketOption,
		{Long: "user", Value: "USER", Complete: completion.Users, Help: "only this user's leases"},
	}
	DrainOptions = []completion.Option{
		jsonOption,
		{Long: "reason", Value: "TEXT", Help: "why, shown in status and to the requests that wait for it"},
		socketOption,
	}
	UndrainOptions = []completion.Option{jsonOption, socketOption}
	ReloadOptions  = []completion.Option{jsonOption, socketOption}
)
