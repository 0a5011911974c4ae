package shim

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/npu"
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
	dir := socket[:strings.LastIndexByte(socket, '/')+1] + "locks"
	v := os.Getenv(client.LeaseVar)
	if v == "" {
		return nil, false
	}
	l := &lease{}
	for _, part := range strings.Split(v, ",") {
		dev, fdText, ok := strings.Cut(part, ":")
		id, err1 := strconv.Atoi(dev)
		fd, err2 := strconv.Atoi(fdText)
		if !ok || err1 != nil || err2 != nil || fd < 0 || !holdsLock(fd, id, dir) {
			return nil, false
		}
		l.devices = append(l.devices, id)
		l.fds = append(l.fds, fd)
	}
	return l, len(l.devices) > 0
}

// holdsLock tells whether descriptor fd is device id's current lock file
// in dir, and this open file holds an exclusive flock on it. The broker
// puts a fresh lock file in place whenever a lease ends, so a descriptor
// kept from an earlier lease, or a look-alike file elsewhere, is another
// file. /proc/self/fdinfo lists the locks of the open file behind the
// descriptor only.
func holdsLock(fd, id int, dir string) bool {
	var have, cur unix.Stat_t
	if unix.Fstat(fd, &have) != nil || unix.Stat(dir+"/npu"+strconv.Itoa(id)+".lock", &cur) != nil {
		return false
	}
	if have.Dev != cur.Dev || have.Ino != cur.Ino {
		return false
	}
	info, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return false
	}
	for _, line := range bytes.Split(info, []byte("\n")) {
		if bytes.HasPrefix(line, []byte("lock:")) && bytes.Contains(line, []byte("FLOCK")) && bytes.Contains(line, []byte("WRITE")) {
			return true
		}
	}
	return false
}

// covers tells whether a nested request fits in the inherited lease.
func (l *lease) covers(o Options) error {
	for _, id := range o.Devices {
		if !slices.Contains(l.devices, id) {
			return fmt.Errorf("inside a lease of %s, which does not include device %d", npu.Unknown.Format(l.devices), id)
		}
	}
	if o.N > len(l.devices) {
		return fmt.Errorf("inside a lease of %s, %d asked", npu.Unknown.Format(l.devices), o.N)
	}
	return nil
}

// env is what a nested npurun changes in its command's environment, and
// the descriptors it adds for the command: nothing where the lease's
// descriptors are at 20 and above; where one lies below (an older
// npurun's), the lease placed again as npurun places a new one, so that
// a shell below keeps it.
func (l *lease) env() ([]string, []int, error) {
	if slices.Min(l.fds) >= client.FirstLeaseFD {
		return nil, nil, nil
	}
	placed, leaseVar, err := client.PlaceLease(l.devices, l.fds)
	if err != nil {
		return nil, nil, err
	}
	return []string{leaseVar}, placed, nil
}
