package shim

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/npu"
)

// lease is a lease this process inherited from an npurun above it.
type lease struct {
	devices []int
	fds     []int
}

// drop closes this process's copies of the lease's descriptors.
func (l *lease) drop() {
	for _, fd := range l.fds {
		unix.Close(fd)
	}
}

// inheritedLease finds the lease named by $NPURUN_LEASE and checks it
// rather than trusting it: each descriptor must be open, be the lock file
// of its device, and hold an exclusive flock.
func inheritedLease() (*lease, bool) {
	v := os.Getenv(LeaseVar)
	if v == "" {
		return nil, false
	}
	l := &lease{}
	for _, part := range strings.Split(v, ",") {
		dev, fdText, ok := strings.Cut(part, ":")
		id, err1 := strconv.Atoi(dev)
		fd, err2 := strconv.Atoi(fdText)
		if !ok || err1 != nil || err2 != nil || fd < 0 || !holdsLock(fd, id) {
			return nil, false
		}
		l.devices = append(l.devices, id)
		l.fds = append(l.fds, fd)
	}
	return l, len(l.devices) > 0
}

// holdsLock tells whether descriptor fd is device id's lock file and this
// open file holds an exclusive flock on it. /proc/self/fdinfo lists the
// locks of the open file behind the descriptor only.
func holdsLock(fd, id int) bool {
	link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil || !strings.HasSuffix(link, "/npu"+strconv.Itoa(id)+".lock") {
		return false
	}
	info, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return false
	}
	for _, line := range bytes.Split(info, []byte("\n")) {
		if bytes.HasPrefix(line, []byte("lock:")) && bytes.Contains(line, []byte("FLOCK")) && bytes.Contains(line, []byte("WRITE")) {
			var st unix.Stat_t
			return unix.Fstat(fd, &st) == nil
		}
	}
	return false
}

// covers tells whether a nested request fits in the inherited lease.
func (l *lease) covers(o Options) error {
	for _, id := range o.Devices {
		if !slices.Contains(l.devices, id) {
			return fmt.Errorf("inside a lease of npu %s, which does not include npu %d", npu.FormatIDs(l.devices), id)
		}
	}
	if o.N > len(l.devices) {
		return fmt.Errorf("inside a lease of %d devices (npu %s), %d asked", len(l.devices), npu.FormatIDs(l.devices), o.N)
	}
	return nil
}
