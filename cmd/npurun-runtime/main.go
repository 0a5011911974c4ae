// Command npurun-runtime is an OCI runtime in front of runc that gives a container the lease of the devices it may open; see package ociruntime.
package main

import (
	"os"

	"github.com/npurun/npurun/container/ociruntime"
)

func main() {
	os.Exit(ociruntime.Main(os.Args[1:]))
}
