// Command npurun-runtime-create is npurun-runtime's create: the OCI runtime's part that gives a container the lease of the devices it may open; see package ociruntime. npurun-runtime (container/front) runs it for create and run, and runc for every other command.
package main

import (
	"os"

	"github.com/npurun/npurun/container/ociruntime"
)

func main() {
	os.Exit(ociruntime.Main(os.Args[1:]))
}
