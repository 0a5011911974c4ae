package main

import (
	"fmt"
	"os"
	"slices"

	"github.com/npurun/npurun/cmd/npubroker/cli"
	"github.com/npurun/npurun/internal/completion"
)

// Shell completion: npubroker --completion SHELL prints npubroker's
// script, written from the tables of options that each command's flag set
// is made of (cli.NewFlags).

// topOptions are npubroker's own options, before a command (main reads
// them by hand: npubroker --version).
var topOptions = []completion.Option{
	{Long: "version", Help: "print the version and exit"},
	completion.HelpOption,
	completion.CompletionOption,
}

// completionCommand is npubroker's command line as the completion
// scripts see it.
func completionCommand() *completion.Command {
	withHelp := func(table []completion.Option) []completion.Option {
		return append(slices.Clip(table), completion.HelpOption)
	}
	return &completion.Command{
		Name:    "npubroker",
		Options: topOptions,
		Subcommands: []completion.Subcommand{
			{Name: "serve", Help: "run the broker", Options: withHelp(serveOptions)},
			{Name: "check-config", Help: "validate a configuration file", Options: withHelp(checkConfigOptions), Args: completion.Files, MaxArgs: 1},
			{Name: "status", Help: "who holds which device, the line, unleased use", Options: withHelp(cli.StatusOptions)},
			{Name: "usage", Help: "device-hours per user and kind of lease", Options: withHelp(cli.UsageOptions)},
			{Name: "drain", Help: "take a device out of service (root)", Options: withHelp(cli.DrainOptions), MaxArgs: 1},
			{Name: "undrain", Help: "put a drained device back in service (root)", Options: withHelp(cli.UndrainOptions), MaxArgs: 1},
			{Name: "reload", Help: "read the configuration file again (root)", Options: withHelp(cli.ReloadOptions)},
		},
	}
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
