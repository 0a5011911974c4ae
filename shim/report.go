package shim

import (
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/exitcode"
)

// InstalledBroker is npubroker's path as installed (make install sets it
// to $(SBINDIR)/npubroker); npurun status and npurun usage run it.
var InstalledBroker = "/usr/sbin/npubroker"

// reportCommands are npubroker's commands for every user that npurun runs
// as its own: npubroker is in an sbin directory, on no ordinary user's
// PATH.
var reportCommands = []string{"status", "usage"}

// isReport tells whether args, npurun's command line, is npurun status or
// npurun usage: the first word alone decides (npurun -- status runs a
// program named status).
func isReport(args []string) bool {
	return len(args) > 0 && (args[0] == reportCommands[0] || args[0] == reportCommands[1])
}

// runReport becomes `npubroker status|usage ARGS`: the same code as
// npubroker's, whose parsing, table and JSON stay out of npurun (they
// would slow every start). The npubroker beside npurun's executable is
// used (a build directory), else the installed one.
func runReport(args []string) int {
	path := ""
	if exe, err := os.Readlink("/proc/self/exe"); err == nil {
		p := exe[:strings.LastIndexByte(exe, '/')+1] + "npubroker"
		if unix.Access(p, unix.X_OK) == nil {
			path = p
		}
	}
	if path == "" {
		path = InstalledBroker
	}
	err := unix.Exec(path, append([]string{"npubroker"}, args...), os.Environ())
	warn("%s: %v", path, err)
	hint("npurun %s runs npubroker %s: install npubroker (make install, or the npurun package)", args[0], args[0])
	if err == unix.ENOENT {
		return exitcode.NotFound
	}
	return exitcode.NoExec
}
