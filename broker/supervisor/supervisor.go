// Package supervisor runs one detached task as its submitter and reports how it ended to the broker.
package supervisor

// The broker starts `npubroker supervise ID` already as the submitter, in a
// session of its own, with cwd "/", PATH alone in its environment and
// /dev/null for standard output and error. Its standard input is a
// SOCK_SEQPACKET socket to the broker carrying two messages: the Spec, at
// once; then, when the task is granted and its start is in the journal, the
// go-ahead (a Spec with the devices and their variables) with the lease's
// flock-held lock descriptors. If the socket closes before the go-ahead, the
// task was not started (cancelled, or the broker died): the supervisor exits
// having run nothing. Otherwise it starts the command with the descriptors,
// closes its own copies at once (the lease lives and dies with the command's
// process tree), waits, and reports the end with task-done until the broker
// acknowledges it.

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/client"
	_ "github.com/npurun/npurun/broker/client/jsoncodec" // messages beyond the lease exchange
)

// maxSpec is the largest message the broker may send.
const maxSpec = client.MaxMessage

// brokerFD is the descriptor of the socket to the broker.
const brokerFD = 0

// errUsage marks a Spec or command line the supervisor refuses outright.
var errUsage = errors.New("usage: npubroker supervise ID")

// Main is the body of `npubroker supervise ID`; args is ["ID"]. It returns
// 0 once the broker has acknowledged the task's end, 1 when it gave up
// reporting, 2 when the command line or the Spec is unusable.
func Main(args []string) int {
	cancel := catchSignals()
	// Nothing inherited beyond the standard three reaches the command.
	_ = unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	spec, err := readSpec(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "npubroker: supervise: %v\n", err)
		return 2
	}
	prep := prepare(spec)
	leases, err := awaitGoAhead(spec)
	if err != nil {
		// Not started: cancelled while waiting, or the broker is gone.
		fmt.Fprintf(os.Stderr, "npubroker: supervise: task %d not started: %v\n", spec.ID, err)
		return 0
	}
	if err := releaseStdin(); err != nil {
		fmt.Fprintf(os.Stderr, "npubroker: supervise: %v\n", err)
	}
	st := runTask(spec, prep, leases, cancel)
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
func readSpec(args []string) (*client.Spec, error) {
	if len(args) != 1 {
		return nil, errUsage
	}
	id, err := strconv.ParseUint(args[0], 10, 64)
	if err != nil {
		return nil, fmt.Errorf("task id %q: %w", args[0], errUsage)
	}
	var spec client.Spec
	fds, err := receive(&spec)
	closeAll(fds) // the Spec comes alone
	if err != nil {
		return nil, fmt.Errorf("read spec: %w", err)
	}
	return &spec, checkSpec(&spec, id)
}

// awaitGoAhead waits for the broker's word to start and returns the
// lease's lock files, one per device.
func awaitGoAhead(spec *client.Spec) ([]*os.File, error) {
	var g client.Spec
	fds, err := receive(&g)
	switch {
	case err != nil:
		closeAll(fds)
		return nil, err
	case g.ID != spec.ID || len(g.Devices) != len(fds) || len(fds) > client.MaxDevices:
		closeAll(fds)
		return nil, fmt.Errorf("go-ahead for task %d with %d devices and %d descriptors", g.ID, len(g.Devices), len(fds))
	}
	spec.Devices = g.Devices
	spec.Env = append(spec.Env, g.Env...)
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		files[i] = os.NewFile(uintptr(fd), "npu"+strconv.Itoa(g.Devices[i])+".lock")
	}
	return files, nil
}

// receive reads one message from the broker into v, with the descriptors
// that came with it.
func receive(v any) ([]int, error) {
	buf := make([]byte, maxSpec+1)
	oob := make([]byte, unix.CmsgSpace(client.MaxDevices*4))
	b, fds, err := client.RecvMsg(brokerFD, buf, oob, 0)
	if err != nil {
		return nil, err
	}
	if len(b) > maxSpec {
		return fds, fmt.Errorf("message larger than %d bytes", maxSpec)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fds, fmt.Errorf("decode: %w", err)
	}
	return fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
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
