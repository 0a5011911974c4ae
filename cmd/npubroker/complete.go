package main

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/npurun/npurun/broker"
	"github.com/npurun/npurun/cmd/npubroker/cli"
	"github.com/npurun/npurun/internal/completion"
)

// Shell completion: npubroker --completion SHELL prints npubroker's
// script, made of the flag sets that parse each command's options.

// valueCompletion is what completes the value of one of npubroker's
// options, and the name the scripts show for it.
type valueCompletion struct {
	value string
	kind  completion.Kind
	words []string
}

// valueCompletions are by option name, in every command that has it.
var valueCompletions = map[string]valueCompletion{
	"config":    {"FILE", completion.Files, nil},
	"socket":    {"PATH", completion.Files, nil},
	"run-dir":   {"DIR", completion.Dirs, nil},
	"state-dir": {"DIR", completion.Dirs, nil},
	"cgroup":    {"DIR", completion.Dirs, []string{"auto", "off"}},
	"log":       {"WHERE", completion.None, []string{broker.LogAuto, broker.LogStderr, broker.LogSyslog}},
	"user":      {"USER", completion.Users, nil},
	"since":     {"DUR", completion.None, nil},
	"reason":    {"TEXT", completion.None, nil},
}

// completionCommand is npubroker's command line as the completion
// scripts see it.
func completionCommand() *completion.Command {
	serveFS, _ := serveFlags()
	help := completion.Option{Short: 'h', Long: "help", Help: "print this help and exit"}
	return &completion.Command{
		Name: "npubroker",
		Options: []completion.Option{
			{Long: "version", Help: "print the version and exit"},
			help,
			{Long: "completion", Value: "SHELL", Hidden: true, Words: completion.Shells, Help: "print the completion script for bash, zsh or fish and exit"},
		},
		Subcommands: []completion.Subcommand{
			{Name: "serve", Help: "run the broker", Options: append(pflagOptions(serveFS), help)},
			{Name: "check-config", Help: "validate a configuration file", Options: []completion.Option{{Long: "socket", Value: "PATH", Complete: completion.Files, Help: "the socket of the broker whose reload to check the file against"}, help}, Args: completion.Files, MaxArgs: 1},
			{Name: "status", Help: "who holds which device, the line, unleased use", Options: append(helpOptions(cli.Status), help)},
			{Name: "usage", Help: "device-hours per user and kind of lease", Options: append(helpOptions(cli.Usage), help)},
			{Name: "drain", Help: "take a device out of service (root)", Options: append(helpOptions(cli.Drain), help), MaxArgs: 1},
			{Name: "undrain", Help: "put a drained device back in service (root)", Options: append(helpOptions(cli.Undrain), help), MaxArgs: 1},
			{Name: "reload", Help: "read the configuration file again (root)", Options: append(helpOptions(cli.Reload), help)},
		},
	}
}

// pflagOptions are the options of fs.
func pflagOptions(fs *pflag.FlagSet) []completion.Option {
	var opts []completion.Option
	fs.VisitAll(func(f *pflag.Flag) {
		o := completion.Option{Long: f.Name, Help: f.Usage}
		if f.Shorthand != "" {
			o.Short = f.Shorthand[0]
		}
		if f.Value.Type() != "bool" {
			o.Value = "VALUE"
		}
		opts = append(opts, completes(o))
	})
	return opts
}

// helpOptions are the options of a command that keeps its flag set to
// itself (status and usage, in cmd/npubroker/cli), as its --help lists them
// (pflag's PrintDefaults): "  -w, --watch[=true|false]   HELP",
// "      --socket string   HELP". A value's type follows its option's
// name after one blank; the help, after two or more.
func helpOptions(run func([]string, cli.Env) int) []completion.Option {
	var out bytes.Buffer
	run([]string{"--help"}, cli.Env{Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }})
	var opts []completion.Option
	for _, line := range strings.Split(out.String(), "\n") {
		line = strings.TrimLeft(line, " ")
		if !strings.HasPrefix(line, "-") {
			continue
		}
		names, help, ok := strings.Cut(line, "  ")
		if !ok {
			continue
		}
		var o completion.Option
		for _, w := range strings.Fields(names) {
			switch {
			case strings.HasPrefix(w, "--"):
				o.Long, _, _ = strings.Cut(w[2:], "[") // a switch: --json[=true|false]
			case len(w) >= 2 && w[0] == '-':
				o.Short = w[1]
			default:
				o.Value = "VALUE"
			}
		}
		if o.Long == "" || o.Long == "help" {
			continue
		}
		o.Help = strings.TrimSpace(help)
		opts = append(opts, completes(o))
	}
	return opts
}

// completes is o with what completes its value, and its value's name.
func completes(o completion.Option) completion.Option {
	if v, ok := valueCompletions[o.Long]; ok && o.Value != "" {
		o.Value, o.Complete, o.Words = v.value, v.kind, v.words
	}
	return o
}

// printCompletion is npubroker --completion SHELL.
func printCompletion(args []string) int {
	if len(args) != 1 || !slices.Contains(completion.Shells, args[0]) {
		fmt.Fprintln(os.Stderr, "npubroker: --completion takes bash, zsh or fish")
		return 2
	}
	script, _ := completion.Script(args[0], completionCommand())
	if _, err := os.Stdout.WriteString(script); err != nil {
		fmt.Fprintf(os.Stderr, "npubroker: %v\n", err)
		return 1
	}
	return 0
}
