package main

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// slowStartDelay is how long a slow supervisor takes to start.
const slowStartDelay = 500 * time.Millisecond

// slowSupervisor plays a supervisor that is slow to start, as one is on a
// loaded machine: installed as npurun-supervise beside a broker (with the
// real one beside it as npurun-supervise.real), it waits slowStartDelay,
// with every signal's default action (SIGTERM ends it), then becomes the
// real supervisor. Tests use it to hit the window between a supervisor's
// start and the moment it catches SIGTERM.
func slowSupervisor() {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "workload: slow supervisor:", err)
		os.Exit(2)
	}
	time.Sleep(slowStartDelay)
	real := filepath.Join(filepath.Dir(self), filepath.Base(self)+".real")
	err = syscall.Exec(real, os.Args, os.Environ())
	fmt.Fprintln(os.Stderr, "workload: slow supervisor: exec", real+":", err)
	os.Exit(2)
}
