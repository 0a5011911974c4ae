package shim

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
)

// lease is a lease this process inherited from an npurun above it.
type lease struct {
	devices []int
	fds     []int
}

// inheritedLease finds the lease named by $NPURUN_LEASE and checks it
// rather than trusting it: each descriptor must be open, be the current
// lock file of its device at the broker that serves socket (the broker
// keeps them in "locks" beside its socket), and hold an exclusive flock.
func inheritedLease(socket string) (*lease, bool) {
	dir := wire.LockDir(socket)
	v := os.Getenv(wire.LeaseVar)
	if v == "" {
		return nil, false
	}
	l := &lease{}
	for _, part := range strings.Split(v, ",") {
		dev, fdText, ok := strings.Cut(part, ":")
		id, err1 := strconv.Atoi(dev)
		fd, err2 := strconv.Atoi(fdText)
		if !ok || err1 != nil || err2 != nil || fd < 0 || !wire.HoldsLock(fd, id, dir) {
			return nil, false
		}
		l.devices = append(l.devices, id)
		l.fds = append(l.fds, fd)
	}
	return l, len(l.devices) > 0
}

// endedLease names the devices of $NPURUN_LEASE whose descriptor is open
// and is the lock file of a lease that has ended (wire.EndedLock): a
// descriptor kept, or received, after its lease. nil where none is.
func endedLease(socket string) []int {
	v := os.Getenv(wire.LeaseVar)
	if v == "" {
		return nil
	}
	dir := wire.LockDir(socket)
	var ended []int
	for _, part := range strings.Split(v, ",") {
		dev, fdText, _ := strings.Cut(part, ":")
		id, err1 := strconv.Atoi(dev)
		fd, err2 := strconv.Atoi(fdText)
		if err1 == nil && err2 == nil && fd >= 0 && wire.EndedLock(fd, id, dir) {
			ended = append(ended, id)
		}
	}
	return ended
}

// sayEnded tells that the lease this process inherited has ended, where
// it has, before npurun asks for one of its own.
func sayEnded(socket string) {
	if ended := endedLease(socket); len(ended) > 0 {
		warn("the lease of %s that this command inherited (NPURUN_LEASE) has ended: its holders are gone and its devices went back to the broker; asking for a lease of its own", npu.Unknown.Format(ended))
	}
}

// covers tells whether a nested request fits in the inherited lease.
func (l *lease) covers(o Options) error {
	var missing []int
	for _, id := range o.Devices {
		if !slices.Contains(l.devices, id) {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("inside a lease of %s, which does not hold %s", npu.Unknown.Format(l.devices), npu.Unknown.Format(missing))
	}
	if o.N > len(l.devices) {
		return fmt.Errorf("inside a lease of %s, %d asked", npu.Unknown.Format(l.devices), o.N)
	}
	return nil
}

// env is what a nested npurun that covers(o) changes in its command's
// environment, and the descriptors it adds for the command. Asking for
// the whole lease (no -n or -d, or all its devices) changes nothing.
// Asking for some of its devices (-d) or fewer (-n K: the first K in
// NPURUN_DEVICES' order, the runtime's devices 0 to K-1) narrows
// NPURUN_DEVICES, the visible-device variable and NPURUN_LEASE to them;
// the other devices stay leased to the tree, their descriptors open, as
// under npurun --no-device. A lease found below descriptor 20 (an older
// npurun's) is placed again as npurun places a new one, so that a shell
// below keeps it. It also returns the devices the command runs on.
func (l *lease) env(o Options) ([]string, []int, []int, error) {
	var env []string
	devices, fds := l.devices, l.fds
	if n := max(len(o.Devices), o.N); n > 0 && n < len(l.devices) {
		narrowed, chosen, err := npu.Narrow(os.LookupEnv, o.Devices, n)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("inside a lease of %s: %w", npu.Unknown.Format(l.devices), err)
		}
		for _, id := range chosen {
			if !slices.Contains(l.devices, id) {
				return nil, nil, nil, fmt.Errorf("inside a lease of %s: NPURUN_DEVICES lists device %d, which it does not hold", npu.Unknown.Format(l.devices), id)
			}
		}
		devices, fds = nil, nil
		for i, id := range l.devices { // in the lease's order
			if slices.Contains(chosen, id) {
				devices, fds = append(devices, id), append(fds, l.fds[i])
			}
		}
		env = narrowed
	}
	var placed []int
	leaseVar := wire.LeaseEntry(devices, fds)
	if slices.Min(fds) < wire.FirstLeaseFD {
		var err error
		if placed, leaseVar, err = wire.PlaceLease(devices, fds); err != nil {
			return nil, nil, nil, err
		}
	}
	if env == nil && placed == nil {
		return nil, nil, devices, nil
	}
	return append(env, leaseVar), placed, devices, nil
}
