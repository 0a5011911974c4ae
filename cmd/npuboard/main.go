// Command npuboard serves a read-only web page of the lab's boxes: who holds which device, the line, utilization and the last day.
package main

import (
	"os"

	"github.com/npurun/npurun/board"
)

func main() { os.Exit(board.Run(os.Args[1:], os.Stderr)) }
