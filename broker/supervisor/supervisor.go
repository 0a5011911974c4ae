// Package supervisor runs one detached task as its submitter and reports how it ended to the broker.
package supervisor

// The broker starts `npubroker supervise ID` already as the submitter, in a
// session of its own, with cwd "/", PATH alone in its environment, one JSON
// client.Spec on standard input, the lease's flock-held lock files at
// descriptors 3, 4, … (one per Spec.Devices entry, in order) and /dev/null
// for standard output and error. The supervisor starts the command with
// those descriptors, closes its own copies at once (the lease lives and dies
// with the command's process tree), waits, and reports the end with
// task-done until the broker acknowledges it.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/client"
)

// maxSpec is the most the broker may write on standard input.
const maxSpec = 1 << 20

// firstLease is the descriptor of the first lock file, in the supervisor
// and in the command alike.
const firstLease = 3

// errUsage marks a Spec or command line the supervisor refuses outright.
var errUsage = errors.New("usage: npubroker supervise ID")

// Main is the body of `npubroker supervise ID`; args is ["ID"]. It returns
// 0 once the broker has acknowledged the task's end, 1 when it gave up
// reporting, 2 when the command line or the Spec is unusable.
func Main(args []string) int {
	cancel := catchSignals()
	spec, err := readSpec(os.Stdin, args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "npubroker: supervise: %v\n", err)
		return 2
	}
	if err := releaseStdin(); err != nil {
		fmt.Fprintf(os.Stderr, "npubroker: supervise: %v\n", err)
	}
	keepOnlyLease(len(spec.Devices))
	st := runTask(spec, cancel)
	return report(spec, st)
}

// catchSignals makes SIGHUP and SIGINT harmless and returns the channel on
// which SIGTERM, the broker's cancel, arrives. The two are caught into a
// channel nobody reads rather than ignored: an ignored disposition would
// pass through exec to the command, a caught one is reset to the default.
func catchSignals() <-chan os.Signal {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP, syscall.SIGINT)
	cancel := make(chan os.Signal, 1)
	signal.Notify(cancel, syscall.SIGTERM)
	return cancel
}

// readSpec reads the broker's Spec and checks it names the task of args.
func readSpec(r io.Reader, args []string) (*client.Spec, error) {
	if len(args) != 1 {
		return nil, errUsage
	}
	id, err := strconv.ParseUint(args[0], 10, 64)
	if err != nil {
		return nil, fmt.Errorf("task id %q: %w", args[0], errUsage)
	}
	b, err := io.ReadAll(io.LimitReader(r, maxSpec+1))
	if err != nil {
		return nil, fmt.Errorf("read spec: %w", err)
	}
	if len(b) > maxSpec {
		return nil, fmt.Errorf("read spec: larger than %d bytes", maxSpec)
	}
	var spec client.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, fmt.Errorf("decode spec: %w", err)
	}
	return &spec, checkSpec(&spec, id)
}

// checkSpec refuses a Spec the supervisor could not even report on.
func checkSpec(spec *client.Spec, id uint64) error {
	switch {
	case spec.ID != id:
		return fmt.Errorf("spec is for task %d, not task %d", spec.ID, id)
	case spec.Socket == "":
		return fmt.Errorf("spec of task %d names no broker socket", id)
	case len(spec.Devices) > client.MaxDevices:
		return fmt.Errorf("spec of task %d names %d devices, more than %d", id, len(spec.Devices), client.MaxDevices)
	}
	return nil
}

// releaseStdin closes the pipe the Spec came on, keeping descriptor 0
// taken by /dev/null so that no later open lands there.
func releaseStdin() error {
	null, err := os.Open(os.DevNull)
	if err != nil {
		return fmt.Errorf("release stdin: %w", err)
	}
	defer null.Close()
	if err := unix.Dup3(int(null.Fd()), 0, 0); err != nil {
		return fmt.Errorf("release stdin: %w", err)
	}
	return nil
}

// keepOnlyLease marks every inherited descriptor above the lease's
// close-on-exec, so that nothing the broker let slip reaches the command.
// Best effort: kernels before 5.11 lack the flag.
func keepOnlyLease(n int) {
	_ = unix.CloseRange(uint(firstLease+n), math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
}
