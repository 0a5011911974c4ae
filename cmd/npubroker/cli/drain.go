package cli

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/npurun/npurun/internal/exitcode"
	"github.com/npurun/npurun/internal/printable"
	"github.com/npurun/npurun/wire"
)

// DrainUsage and UndrainUsage are the drain commands' lines of
// npubroker's usage.
const (
	DrainUsage   = "npubroker drain DEVICE [--reason TEXT] [--json] [--socket PATH]"
	UndrainUsage = "npubroker undrain DEVICE [--json] [--socket PATH]"
)

const drainHelp = `Usage:
  ` + DrainUsage + `
  ` + UndrainUsage + `

drain takes DEVICE (npu3, gpu3 or 3) out of service: no new lease is
granted on it, to npurun, tasks or logins, while the lease that holds it,
if one does, runs on to its end. The drain, with its reason, who drained
it and since when, shows in npubroker status, in the progress line of a
request that only the drained device could serve, and lasts across the
broker's restarts until undrain puts the device back in service. Root
only (a Slurm-managed device is drained in Slurm instead). Exit status:
0 done, 1 refused, 2 usage (no such device), 69 no broker (or gone during
the call), 75 the broker at a cap (try again later), 77 not root.

Options:
`

// Drain runs `npubroker drain ARGS` and returns its exit status.
func Drain(args []string, env Env) int { return drainCmd("drain", args, env) }

// Undrain runs `npubroker undrain ARGS` and returns its exit status.
func Undrain(args []string, env Env) int { return drainCmd("undrain", args, env) }

func drainCmd(op string, args []string, env Env) int {
	table := UndrainOptions
	if op == "drain" {
		table = DrainOptions
	}
	fs, code, done := Parse("npubroker "+op, table, drainHelp, true, args, env.Stderr)
	if done {
		return code
	}
	asJSON, socket := fs.Bool("json"), fs.String("socket")
	if fs.NArg() != 1 {
		fmt.Fprintf(env.Stderr, "npubroker: %s takes one device, such as npu3, got %d arguments\n", op, fs.NArg())
		return exitcode.Usage
	}
	ask := func(c *wire.Conn) (*wire.DrainInfo, error) {
		defer c.Close()
		if op == "drain" {
			return c.Drain(fs.Arg(0), fs.String("reason"))
		}
		return c.Undrain(fs.Arg(0))
	}
	c, code := dial(socket, env)
	if c == nil {
		return code
	}
	info, err := ask(c)
	if wire.Gone(err) {
		info, err = askAgain(env, socketPath(socket, env), op, ask, err)
		if errors.Is(err, wire.ErrNoBroker) {
			fmt.Fprintf(env.Stderr, "npubroker: %v\n", err)
			return exitcode.Unavailable
		}
	}
	if err != nil {
		return fail(env, err)
	}
	if asJSON {
		return writeJSON(env, info, true)
	}
	writeDrain(env.Stdout, op, info)
	return exitcode.OK
}

// writeDrain says what drain or undrain did, for people.
func writeDrain(w io.Writer, op string, d *wire.DrainInfo) {
	switch {
	case op == "undrain" && !d.Was:
		fmt.Fprintf(w, "%s was not drained\n", d.Device)
	case op == "undrain":
		fmt.Fprintf(w, "%s undrained: in service again\n", d.Device)
	default:
		fmt.Fprintf(w, "%s drained by %s since %s", d.Device, d.By, time.UnixMilli(d.Since).Format("2006-01-02 15:04:05"))
		if d.Reason != "" {
			fmt.Fprintf(w, ": %s", printable.String(d.Reason))
		}
		fmt.Fprintln(w)
		if d.Leased {
			fmt.Fprintf(w, "its lease runs on to its end; no new lease is granted on %s\n", d.Device)
		}
	}
}

// drainAgainFor is how long drain and undrain ask again, of the broker
// that comes next, when the broker goes away before answering.
var drainAgainFor = 30 * time.Second

// askAgain asks a drain or undrain again of the broker at path after the
// broker it was asked of went away without answering (gone, the error it
// met): killed, or restarting, whether or not it had made the change
// (done twice, either changes nothing the second time, so the answer is
// as good). It waits for the next broker up to drainAgainFor, and returns
// its answer, or the last error met.
func askAgain(env Env, path, op string, ask func(*wire.Conn) (*wire.DrainInfo, error), gone error) (*wire.DrainInfo, error) {
	fmt.Fprintf(env.Stderr, "npubroker: the broker went away before answering (%v); asking the broker that comes next\n", gone)
	err := gone
	deadline := time.Now().Add(drainAgainFor)
	for wait := 50 * time.Millisecond; time.Now().Add(wait).Before(deadline); wait = min(2*wait, time.Second) {
		time.Sleep(wait) // a broker starting again: nothing to wait on but the socket
		c, derr := wire.Dial(path)
		if derr != nil {
			err = derr
			continue
		}
		var info *wire.DrainInfo
		if info, err = ask(c); !wire.Gone(err) {
			return info, err
		}
	}
	return nil, fmt.Errorf("%s: no broker answered within %s: %w", op, drainAgainFor, err)
}
