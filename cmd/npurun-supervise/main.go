// Command npurun-supervise runs one detached task for npubroker, as its submitter, and reports how it ended.
package main

// The broker starts it, as the submitter, for each task (npubroker(8), The
// supervisor); it is not for people. It is a program of its own, static and
// small, so that a task's start costs the start of a small Go program, not
// of the daemon.

import (
	"os"

	"github.com/npurun/npurun/supervisor"
)

func main() { os.Exit(supervisor.Main(os.Args[1:])) }
