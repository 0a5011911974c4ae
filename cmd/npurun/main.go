// Command npurun runs a command on accelerator devices leased from npubroker.
package main

import (
	"os"

	"github.com/npurun/npurun/shim"
)

var version = "dev"

func main() {
	os.Exit(shim.Main(os.Args[1:], version))
}
