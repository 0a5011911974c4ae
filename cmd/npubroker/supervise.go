package main

import (
	"fmt"
	"os"
)

// supervise is replaced by the supervisor package once it lands.
func supervise(args []string) int {
	fmt.Fprintln(os.Stderr, "npubroker: supervise: not built in")
	return 1
}
