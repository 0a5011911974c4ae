// Command npurun-slurm is slurmd's Prolog and Epilog for npurun: it tells npubroker which devices a Slurm job holds, and when it ended.
package main

import (
	"os"

	"github.com/npurun/npurun/slurm"
)

var version = "dev"

func main() {
	os.Exit(slurm.Script(os.Args[1:], os.Getenv, os.Stderr, version))
}
