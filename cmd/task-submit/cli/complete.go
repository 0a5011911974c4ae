package cli

import (
	"bytes"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/npurun/npurun/internal/completion"
	"github.com/npurun/npurun/internal/exitcode"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/shim"
	"github.com/npurun/npurun/wire"
)

// Shell completion: task-submit --completion SHELL prints task-submit's
// script, made of the same option tables that parse its command line
// (submitOptions, each command's options); task-submit __complete KIND is how the
// scripts of npurun, task-submit and npubroker ask the broker for task
// ids, pools and devices.

// completionFlag binds the hidden --completion SHELL of fs to shell.
func completionFlag(fs *flagSet, shell *string) {
	fs.bind(completion.CompletionOption.Long, true, false, func(v string) error {
		if !slices.Contains(completion.Shells, v) {
			return &usageError{msg: "--completion takes bash, zsh or fish, not " + strconv.Quote(v)}
		}
		*shell = v
		return nil
	})
}

// completionCommand is task-submit's command line as the completion
// scripts see it: its tables of options, -h and --help added to each.
func completionCommand() *completion.Command {
	withHelp := func(table []completion.Option) []completion.Option {
		return append(slices.Clip(table), completion.HelpOption)
	}
	c := &completion.Command{
		Name:    "task-submit",
		Options: withHelp(submitOptions),
		Args:    completion.CommandLine, // after "--"
	}
	for _, sc := range commands {
		s := completion.Subcommand{Name: sc.name, Help: sc.help, Options: withHelp(sc.options), Args: sc.id}
		if sc.id != completion.None {
			s.MaxArgs = 1
		}
		c.Subcommands = append(c.Subcommands, s)
	}
	return c
}

// printCompletion writes task-submit's script for shell, which
// --completion checked.
func printCompletion(w io.Writer, shell string) int {
	script, _ := completion.Script(shell, completionCommand())
	if _, err := io.WriteString(w, script); err != nil {
		warn("%v", err)
		return 1
	}
	return 0
}

// printScript is `task-submit __script PROGRAM SHELL`: PROGRAM's script
// for SHELL, PROGRAM being npurun (whose --completion runs this, to keep
// the script writers out of npurun) or task-submit.
func printScript(args []string, w io.Writer) int {
	var c *completion.Command
	switch {
	case len(args) != 2:
	case args[0] == "npurun":
		c = shim.CompletionCommand()
	case args[0] == "task-submit":
		c = completionCommand()
	}
	script, ok := "", false
	if c != nil {
		script, ok = completion.Script(args[1], c)
	}
	if !ok {
		warn("__script takes npurun or task-submit, then bash, zsh or fish")
		return exitcode.Usage
	}
	if _, err := io.WriteString(w, script); err != nil {
		warn("%v", err)
		return 1
	}
	return 0
}

// completeTimeout bounds a query of the completion scripts: the shell
// waits for it at a tab.
const completeTimeout = 500 * time.Millisecond

// maxCompletions bounds the values a query prints.
const maxCompletions = 1000

// completeValues is `task-submit __complete KIND [--socket PATH]`, run by
// the completion scripts: it prints the values of KIND the broker knows,
// one a line, each followed by a tab and what it is (for zsh and fish to
// show). It never fails: where no broker answers within completeTimeout,
// KIND is unknown or anything goes wrong, it prints nothing and exits 0,
// since a completion has nothing to tell the shell on the user's line.
func completeValues(args []string, stdout io.Writer) int {
	if len(args) == 0 {
		return 0
	}
	kind, ok := completion.ParseQuery(args[0])
	if !ok {
		return 0
	}
	socket := ""
	for i := 1; i < len(args); i++ {
		if v, ok := strings.CutPrefix(args[i], "--socket="); ok {
			socket = v
		} else if args[i] == "--socket" && i+1 < len(args) {
			i++
			socket = args[i]
		}
	}
	done := make(chan []byte, 1)
	go func() { done <- queryValues(kind, wire.SocketPath(socket)) }()
	select {
	case out := <-done:
		stdout.Write(out)
	case <-time.After(completeTimeout):
		// The query goes on in its goroutine until the process exits.
	}
	return 0
}

// queryValues asks the broker at path for kind's values; nil on any error.
func queryValues(kind completion.Kind, path string) []byte {
	c, err := wire.Dial(path)
	if err != nil {
		return nil
	}
	defer c.Close()
	var b bytes.Buffer
	n := 0
	add := func(value, what string) {
		if n < maxCompletions {
			b.WriteString(value + "\t" + oneLine(what) + "\n")
			n++
		}
	}
	switch kind {
	case completion.Pools, completion.Devices:
		board, err := c.Status()
		if err != nil {
			return nil
		}
		if kind == completion.Devices {
			for _, d := range board.Devices {
				add(strconv.Itoa(d.ID), deviceWhat(&d))
			}
			break
		}
		// The pools in the configuration's order, as the lines of
		// waiters come, then any other a device names.
		var pools []string
		for _, l := range board.Waiting {
			pools = append(pools, l.Pool)
		}
		for _, d := range board.Devices {
			if d.Pool != "" && !slices.Contains(pools, d.Pool) {
				pools = append(pools, d.Pool)
			}
		}
		for _, p := range pools {
			all, free := 0, 0
			for _, d := range board.Devices {
				if d.Pool == p {
					all++
					if d.State == wire.DeviceFree {
						free++
					}
				}
			}
			add(p, quantity.Count(all, "device", "devices")+", "+strconv.Itoa(free)+" free")
		}
	case completion.Tasks, completion.LiveTasks:
		// Root may cancel, wait for and show anyone's tasks: all of them.
		ts, err := c.List(os.Geteuid() == 0)
		if err != nil {
			return nil
		}
		// The newest first: the likeliest to be meant, and those kept
		// where there are more than maxCompletions.
		slices.Reverse(ts)
		for i := range ts {
			t := &ts[i]
			if kind == completion.LiveTasks && ended(t) {
				continue
			}
			what := t.State
			if t.UID != uint32(os.Geteuid()) {
				what += ", " + t.User
			}
			add(strconv.FormatUint(t.ID, 10), what+": "+truncate(nameOrCommand(t), 60))
		}
	}
	return b.Bytes()
}

// deviceWhat says what a device is doing: "npu3 in pool queue: free",
// "npu4 in pool queue: task 118 of bob", "npu5: leased by alice".
func deviceWhat(d *wire.DeviceState) string {
	s := d.Name
	if d.Pool != "" {
		s += " in pool " + d.Pool
	}
	s += ": " + d.State
	if l := d.Lease; l != nil && l.Task != 0 {
		s += " " + strconv.FormatUint(l.Task, 10) + " of " + l.User
	} else if l != nil {
		s += " by " + l.User
	}
	return s
}
