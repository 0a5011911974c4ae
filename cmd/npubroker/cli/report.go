// Package cli is npubroker's commands for clients (status, usage, drain,
// undrain, reload): it asks the broker over the wire and writes its answer
// as a table or as JSON. It also makes every npubroker command's flag set
// from that command's table of options (NewFlags), the table its
// completion script is written from. It is client code: it must never
// import the daemon (broker/...), and the daemon never imports it.
package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/exitcode"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
	_ "github.com/npurun/npurun/wire/jsoncodec" // messages beyond the lease exchange
)

// StatusUsage is the status command's line of npubroker's usage.
const StatusUsage = "npubroker status [--json] [--watch] [--cluster] [--socket PATH]"

// UsageUsage is the usage command's line of npubroker's usage.
const UsageUsage = "npubroker usage [--since DUR] [--user USER] [--by user|device] [--json] [--socket PATH]"

const statusHelp = `Usage:
  ` + StatusUsage + `

Show every device (free, leased, a task's, a login's, reserved for the
first request in line), who holds each lease now as /proc shows it (user,
pid, command, since when), the requests waiting per pool, and processes
that have a device node open without a lease. Any user may ask. On a
terminal the table fits its width; --json prints the broker's answer with
stable field names.

Options:
`

const usageHelp = `Usage:
  ` + UsageUsage + `

Sum the device-hours of leases per user, kind of lease (inline: npurun;
task; login) and pool, from the broker's accounting log, over the last DUR
(such as 7d, 24h, 90m; 7d without --since); with --by device, the same
sums per device. Any user may ask.

Options:
`

// Env is what a command reads of its surroundings; tests give their own.
type Env struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
}

// OSEnv is the process's own standard streams and environment.
func OSEnv() Env { return Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv} }

// Status runs `npubroker status ARGS` and returns its exit status.
func Status(args []string, env Env) int {
	fs, code, done := Parse("npubroker status", StatusOptions, statusHelp, true, args, env.Stderr)
	if done {
		return code
	}
	if code, done := fs.NoArgs(env.Stderr); done {
		return code
	}
	asJSON, watch, socket := fs.Bool("json"), fs.Bool("watch"), fs.String("socket")
	if fs.Bool("cluster") {
		if watch {
			fmt.Fprintln(env.Stderr, "npubroker: --cluster and --watch exclude each other (Slurm tells no one of changes: watch -n 5 npurun status --cluster)")
			return exitcode.Usage
		}
		return clusterStatus(env, asJSON)
	}
	c, code := dial(socket, env)
	if c == nil {
		return code
	}
	defer c.Close()
	width := termWidth(env)
	if !watch {
		b, err := c.Status()
		if err != nil {
			return fail(env, err)
		}
		if asJSON {
			return writeJSON(env, b, true)
		}
		io.WriteString(env.Stdout, Table(b, width, time.UnixMilli(b.Time)))
		return exitcode.OK
	}
	if err := c.Watch(); err != nil {
		return fail(env, err)
	}
	clear := isTerminal(env.Stdout)
	for n := 0; ; n++ {
		b, err := c.NextBoard()
		if err != nil {
			return fail(env, err)
		}
		switch {
		case asJSON:
			if code := writeJSON(env, b, false); code != exitcode.OK {
				return code
			}
		case clear:
			io.WriteString(env.Stdout, "\x1b[H\x1b[2J"+Table(b, width, time.UnixMilli(b.Time)))
		default:
			if n > 0 {
				io.WriteString(env.Stdout, "\n")
			}
			io.WriteString(env.Stdout, Table(b, width, time.UnixMilli(b.Time)))
		}
	}
}

// DefaultUsageSince is how far back usage counts without --since, as
// task-submit list --ended looks back.
const DefaultUsageSince = "7d"

// Usage runs `npubroker usage ARGS` and returns its exit status.
func Usage(args []string, env Env) int {
	fs, code, done := Parse("npubroker usage", UsageOptions, usageHelp, true, args, env.Stderr)
	if done {
		return code
	}
	if code, done := fs.NoArgs(env.Stderr); done {
		return code
	}
	user, asJSON, socket, by := fs.String("user"), fs.Bool("json"), fs.String("socket"), fs.String("by")
	if by != wire.UsageByUser && by != wire.UsageByDevice {
		fmt.Fprintf(env.Stderr, "npubroker: bad value %q for --by: want %s or %s\n", by, wire.UsageByUser, wire.UsageByDevice)
		return exitcode.Usage
	}
	if by == wire.UsageByUser {
		by = "" // as a broker that knows no --by sums
	}
	since, err := ParseSince(fs.String("since"))
	if err != nil {
		fmt.Fprintf(env.Stderr, "npubroker: %v\n", err)
		fmt.Fprintf(env.Stderr, "npubroker: hint: --since takes %s\n", quantity.DurationHelp)
		return exitcode.Usage
	}
	c, code := dial(socket, env)
	if c == nil {
		return code
	}
	defer c.Close()
	rep, err := c.Usage(wire.UsageQuery{SinceMS: time.Now().Add(-since).UnixMilli(), User: user, By: by})
	if err != nil {
		return fail(env, err)
	}
	if rep.By != by {
		fmt.Fprintln(env.Stderr, "npubroker: the broker does not sum usage by device")
		fmt.Fprintln(env.Stderr, "npubroker: hint: it is older than this npubroker: restart it with the version installed")
		return exitcode.Failure
	}
	if rep.Dropped > 0 {
		fmt.Fprintf(env.Stderr, "npubroker: warning: the broker could not write %d accounting records since it started: totals may be short\n", rep.Dropped)
	}
	if rep.Incomplete > 0 {
		fmt.Fprintf(env.Stderr, "npubroker: warning: %d leases have no recorded end and are not counted\n", rep.Incomplete)
	}
	if rep.Oldest > rep.Since {
		fmt.Fprintf(env.Stderr, "npubroker: note: the accounting log goes back to %s only (older files were rotated away)\n", time.UnixMilli(rep.Oldest).Format("2006-01-02 15:04"))
	}
	if asJSON {
		return writeJSON(env, rep, true)
	}
	io.WriteString(env.Stdout, UsageTable(rep))
	return exitcode.OK
}

// socketPath is the broker's socket: flag's, or $NPURUN_SOCKET, or the
// default.
func socketPath(flag string, env Env) string {
	path := flag
	if path == "" {
		path = env.Getenv("NPURUN_SOCKET")
	}
	if path == "" {
		path = wire.DefaultSocket
	}
	return path
}

func dial(flag string, env Env) (*wire.Conn, int) {
	path := socketPath(flag, env)
	c, err := wire.Dial(path)
	if err != nil {
		return nil, fail(env, err)
	}
	return c, exitcode.OK
}

// fail says what went wrong with a request and returns the exit status
// for it (wire.ExitStatus: npurun's and task-submit's too).
func fail(env Env, err error) int {
	var e *wire.Error
	switch {
	case errors.Is(err, wire.ErrClosed):
		// A watch ends so when the broker stops: say it in words.
		fmt.Fprintln(env.Stderr, "npubroker: the broker closed the connection: it stopped or is restarting")
	case wire.Gone(err):
		fmt.Fprintf(env.Stderr, "npubroker: the broker went away before it answered (%v)\n", err)
		fmt.Fprintf(env.Stderr, "npubroker: hint: %s\n", wire.Hint(err))
	default:
		fmt.Fprintf(env.Stderr, "npubroker: %v\n", err)
		h := wire.Hint(err)
		if errors.As(err, &e) {
			h = e.Hint
		}
		if h != "" {
			fmt.Fprintf(env.Stderr, "npubroker: hint: %s\n", h)
		}
	}
	return wire.ExitStatus(err)
}

func writeJSON(env Env, v any, indent bool) int {
	if err := WriteJSON(env.Stdout, v, indent); err != nil {
		fmt.Fprintf(env.Stderr, "npubroker: %v\n", err)
		return exitcode.Failure
	}
	return exitcode.OK
}

// WriteJSON writes v as npubroker status --json (usage --json) prints it:
// indented, or one line for a watch; npuboard's /api/status is this too.
func WriteJSON(w io.Writer, v any, indent bool) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if indent {
		enc.SetIndent("", "  ")
	}
	return enc.Encode(v)
}

// ParseSince reads a duration as --since takes it, as every command
// reads one (quantity.ParseDuration: 7d, 24h, 90m, 1d12h), more than 0
// and at most a hundred years.
func ParseSince(s string) (time.Duration, error) {
	const limit = 100 * 365 * quantity.Day
	d, err := quantity.ParseDuration(s)
	var de *quantity.DurationError
	switch {
	case errors.As(err, &de):
		return 0, errors.New(de.For("--since"))
	case d <= 0:
		return 0, fmt.Errorf("bad duration %q for --since: must be more than 0", s)
	case d > limit:
		return 0, fmt.Errorf("bad duration %q for --since: more than a hundred years", s)
	}
	return d, nil
}

// termWidth is the width to fit tables to: $COLUMNS, else the terminal's
// on standard output, else 0 (no limit).
func termWidth(env Env) int {
	if n, err := strconv.Atoi(env.Getenv("COLUMNS")); err == nil && n > 0 {
		return n
	}
	if f, ok := env.Stdout.(*os.File); ok {
		if ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ); err == nil && ws.Col > 0 {
			return int(ws.Col)
		}
	}
	return 0
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// cut shortens s to at most n characters, ending it with "…" if cut.
func cut(s string, n int) string {
	if n <= 0 || utf8.RuneCountInString(s) <= n {
		return s
	}
	if n == 1 {
		return "…"
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// vendorOf is the board's vendor, for device lists.
func vendorOf(b *wire.Board) npu.Vendor { return npu.Vendor(b.Vendor) }
