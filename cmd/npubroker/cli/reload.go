package cli

import (
	"fmt"
	"strings"

	"github.com/npurun/npurun/internal/exitcode"
	"github.com/npurun/npurun/internal/quantity"
)

// ReloadUsage is reload's line of npubroker's usage.
const ReloadUsage = "npubroker reload [--json] [--socket PATH]"

const reloadHelp = `Usage:
  ` + ReloadUsage + `

reload has the broker read its configuration file again (the one it was
started with) and take it up without a restart: pools, limits, [user.*],
[group.*], [restrict], [status], time limits. A file that does not
validate, or that changes what only a restart changes (the device list,
the state directory, [usage], [slurm], metrics_listen), is not taken: the
broker says why, and nothing changes. No lease, connection or task is
dropped; a request waiting in line that the new configuration refuses is
told why and ends (npurun exits 77, a task fails, not started), while a
lease it would not grant runs on to its end. Root only; SIGHUP does the
same and says the outcome in the broker's log. Exit status: 0 taken,
1 refused (the broker's words say why), 2 usage, 69 no broker (or gone
during the call), 75 the broker at a cap (try again later), 77 not root.

Options:
`

// Reload runs npubroker reload ARGS and returns its exit status.
func Reload(args []string, env Env) int {
	fs, code, done := Parse("npubroker reload", ReloadOptions, reloadHelp, true, args, env.Stderr)
	if done {
		return code
	}
	if code, done := fs.NoArgs(env.Stderr); done {
		return code
	}
	asJSON, socket := fs.Bool("json"), fs.String("socket")
	c, code := dial(socket, env)
	if c == nil {
		return code
	}
	defer c.Close()
	info, err := c.Reload()
	if err != nil {
		return fail(env, err)
	}
	if asJSON {
		return writeJSON(env, info, true)
	}
	changed := "nothing changed"
	if len(info.Changed) > 0 {
		changed = strings.Join(info.Changed, ", ") + " changed"
	}
	fmt.Fprintf(env.Stdout, "reloaded %s: %s\n", info.Config, changed)
	if info.Refused > 0 {
		fmt.Fprintf(env.Stdout, "%s waiting refused by the new configuration, and told why\n", quantity.Count(info.Refused, "request", "requests"))
	}
	return exitcode.OK
}
