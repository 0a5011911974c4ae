// Package completion owns the one type of a table of options (Option),
// which each program's parser is made from (task-submit's flag sets,
// npubroker's pflag sets) or held to by test (npurun's hand parser), its
// --help lists, and its completion script is written from; and it writes
// the bash, zsh and fish scripts. It imports only the standard library,
// never parses a command line itself, and must never keep a second list
// of options.
package completion

import "strings"

// It is imported by npurun, whose import graph tests/e2e/cli/lean_test.go keeps
// small, and whose start-up is measured: the standard library's strings
// only, and nothing computed at package initialisation. A script is
// written only when one is asked for (npurun --completion bash).

// Kind is what completes a value or an argument.
type Kind uint8

// Kinds of values. Those marked "from the broker" are asked for at
// completion time (QueryCommand): the script runs
// `task-submit __complete KIND [--socket PATH]`, which prints one value a
// line, a tab and what it is after it, and prints nothing, with status 0,
// where no broker answers within a moment.
const (
	None        Kind = iota // nothing to offer: a number, a duration, a name
	Files                   // file names
	Dirs                    // directory names
	Users                   // user names
	Pools                   // pool names, from the broker
	Devices                 // device ids, from the broker; a comma-separated list
	Tasks                   // the asker's task ids, from the broker; a comma-separated list
	LiveTasks               // the asker's tasks that have not ended, from the broker
	CommandLine             // a command and its arguments: the rest of the line is that command's
)

// queries are the names of the kinds asked of the broker, as the scripts
// pass them to QueryCommand.
var queries = [...]string{Pools: "pools", Devices: "devices", Tasks: "tasks", LiveTasks: "live-tasks"}

// Query is the name by which the scripts ask for k's values, "" for a
// kind that is not asked of the broker.
func (k Kind) Query() string {
	if int(k) < len(queries) {
		return queries[k]
	}
	return ""
}

// ParseQuery is the kind a script asks for by name, as Query writes it.
func ParseQuery(name string) (Kind, bool) {
	for k, q := range queries {
		if q != "" && q == name {
			return Kind(k), true
		}
	}
	return None, false
}

// QueryCommand is the program whose `__complete KIND` prints the values
// from the broker for every command's script: task-submit speaks JSON to
// the broker already, and npurun does not (it stays lean). A script looks
// for it beside the program being completed when that was typed with a
// path (./bin/npurun), else in PATH.
const QueryCommand = "task-submit"

// Option is one entry of a command's table of options: the one table
// from which its parser is made (npurun's by hand, task-submit's own flag
// set, npubroker's pflag sets), its --help lists the options, and its
// completion script is written. A command keeps no second list of its
// options beside its table.
type Option struct {
	Short byte   // one letter, or 0
	Long  string // without the dashes
	Value string // the name of its value (N, POOL, FILE); "" for a switch
	Help  string // one line, or lines separated by "\n"
	// Default is the value of an option not given, for a parser that
	// keeps and prints it (npubroker's pflag sets: their --help says it
	// after Help); "" for none, or where Help says it.
	Default string
	// Summary is what the completion scripts show of the option where it
	// is not Help on one line; "" for Help.
	Summary string
	Many    bool // may be given more than once
	// Hidden options are parsed, and neither listed by Help nor offered
	// by the scripts (npurun --completion: the man page tells of it).
	Hidden bool
	// What completes its value, and words offered besides.
	Complete Kind
	Words    []string
}

// HelpOption is -h, --help, as every command takes it.
var HelpOption = Option{Short: 'h', Long: "help", Help: "print this help and exit"}

// CompletionOption is --completion SHELL, as every command takes it: it
// prints the command's script for SHELL, one of Shells.
var CompletionOption = Option{Long: "completion", Value: "SHELL", Hidden: true, Words: Shells,
	Help: "print the completion script for bash, zsh or fish and exit"}

// Subcommand is a command word with options and arguments of its own
// (task-submit list, npubroker status).
type Subcommand struct {
	Name, Help string
	Options    []Option
	Args       Kind // what completes the words that are not options
	MaxArgs    int  // how many such words it takes; 0 for any number
}

// Command is a program's command line.
type Command struct {
	Name    string   // the program, as typed: npurun
	Options []Option // those before a subcommand, or all of them
	// Subcommands, where the first word that is not an option is one.
	Subcommands []Subcommand
	// Args completes the words that are not options (npurun: CommandLine):
	// with Subcommands, those after "--" only. The first word that is not
	// an option ends the command's own options, as with getopt's "+"
	// (npurun -v python -v); a subcommand's options may come anywhere.
	Args Kind
}

// Shells are the shells Script writes for.
var Shells = []string{"bash", "zsh", "fish"}

// Script is c's completion script for shell; ok is false for a shell
// that is not one of Shells.
func Script(shell string, c *Command) (script string, ok bool) {
	switch shell {
	case "bash":
		return bash(c), true
	case "zsh":
		return zsh(c), true
	case "fish":
		return fish(c), true
	}
	return "", false
}

// header is the first lines of every script.
func header(comment, shell string, c *Command) string {
	return comment + " " + shell + " completion for " + c.Name + ": `" + c.Name + " --completion " + shell + "` writes it\n" +
		comment + " from the options that parse its command line; write it again rather than edit it.\n"
}

// contexts are c's option tables by the name the scripts know them by:
// "" for the command's own, then each subcommand's.
func (c *Command) contexts() []context {
	ctxs := []context{{name: "", opts: c.Options, args: c.Args}}
	for _, s := range c.Subcommands {
		ctxs = append(ctxs, context{name: s.Name, opts: s.Options, args: s.Args, max: s.MaxArgs})
	}
	return ctxs
}

// context is one option table of a command: its own, or a subcommand's.
type context struct {
	name string
	opts []Option
	args Kind
	max  int
}

// funcName is a shell function's name made of the program's name:
// _task_submit.
func funcName(name string) string {
	return "_" + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, name)
}

// quote is s in single quotes for bash and zsh.
func quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// names are the ways an option is written: -n, --devices.
func (o *Option) names() []string {
	var n []string
	if o.Short != 0 {
		n = append(n, "-"+string(o.Short))
	}
	if o.Long != "" {
		n = append(n, "--"+o.Long)
	}
	return n
}

// oneLine is an option's help on one line, as the scripts show it.
func (o *Option) oneLine() string {
	if o.Summary != "" {
		return o.Summary
	}
	return strings.Join(strings.Fields(o.Help), " ")
}

// subcommandNames are c's subcommands, space-separated.
func (c *Command) subcommandNames() string {
	var n []string
	for _, s := range c.Subcommands {
		n = append(n, s.Name)
	}
	return strings.Join(n, " ")
}

// Help writes opts as a command's --help lists them: each option's names
// and value, then its help, whose further lines are indented to the same
// column, at least gap blanks after the longest names. Hidden options are
// left out.
func Help(opts []Option, gap int) string {
	opts = visible(opts)
	heads := make([]string, len(opts))
	col := 0
	for i, o := range opts {
		h := "      --" + o.Long
		if o.Short != 0 {
			h = "  -" + string(o.Short) + ", --" + o.Long
		}
		if o.Value != "" {
			h += " " + o.Value
		}
		heads[i] = h
		col = max(col, len(h))
	}
	col += gap
	var b strings.Builder
	for i, o := range opts {
		for j, line := range strings.Split(o.Help, "\n") {
			h := ""
			if j == 0 {
				h = heads[i]
			}
			b.WriteString(h)
			b.WriteString(strings.Repeat(" ", col-len(h)))
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// visible are the options of opts that are not Hidden.
func visible(opts []Option) []Option {
	var v []Option
	for _, o := range opts {
		if !o.Hidden {
			v = append(v, o)
		}
	}
	return v
}
