// Command task-submit queues a command to run detached on accelerator devices leased from npubroker, and lists, shows, follows, waits for and cancels such tasks.
//
// Its logic is package cli; this main only runs it.
package main

import (
	"os"

	"github.com/npurun/npurun/cmd/task-submit/cli"
)

// version is set by the Makefile (-X main.version=...).
var version = "dev"

func main() {
	os.Exit(cli.Run(os.Args[1:], version))
}
