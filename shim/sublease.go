package shim

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/exitcode"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
)

// Sub-leases: an npurun inside a lease that asks for some of its devices
// (-n K, -d LIST) takes them from the lease, never from the broker, and
// waits while a sibling's sub-lease has them. Four jobs of
//
//	npurun -n 4 sh -c 'for i in 1 2 3 4 5 6; do npurun -n 1 python t.py & done; wait'
//
// (or the tasks of a 4-device Slurm job) run four at a time, one device
// each.
//
// A sub-lease of device d is an abstract Unix socket bound to a name
// derived from d's lock file (its device and inode numbers: fresh for
// every lease) and the nesting depth, listening, held by the command's
// process tree as the lease's descriptors are (placed at 20 and above,
// close-on-exec clear): the kernel frees the name when the last process
// holding it exits, crash or kill -9 alike. Only the lease's holders know
// the lock file's numbers through a descriptor; anyone may stat the file,
// so a name held by another account is refused as a squatter, and one of
// the same account is that account's own affair. A waiter connects to the
// holder's socket and wakes when it closes (POLLHUP): release is an
// event. One waiter at a time collects devices, the holder of the
// lease's "line" name; the others wait for the line. A request inside a
// sub-lease uses the names of the next depth (NPURUN_SUBLEASE says which
// depth a lease is at, tagged with its first lock file's numbers), so it
// never waits for its own ancestor.
//
// Abstract socket names belong to a network namespace: npuruns in
// containers with namespaces of their own do not see each other's.

// SubleaseVar names the depth of the sub-lease a command runs in:
// "DEV:INO:DEPTH", DEV:INO the numbers of the lock file of its lease's
// first device (another lease's value is ignored).
const SubleaseVar = "NPURUN_SUBLEASE"

// subleaseRecheck bounds a waiter's sleep where no event tells it of a
// release (a holder whose socket it could not connect to).
const subleaseRecheck = time.Second

// sublease is the devices a nested npurun took from its lease.
type sublease struct {
	devices []int    // physical ids, in the lease's order
	fds     []int    // the held sockets, placed at 20 and above
	env     []string // SubleaseVar for the command
}

// lockID identifies a lease's lock file.
type lockID struct{ dev, ino uint64 }

func (l lockID) String() string {
	return strconv.FormatUint(l.dev, 10) + ":" + strconv.FormatUint(l.ino, 10)
}

// subleaseName is the abstract name of the sub-lease of the device whose
// lock file is id, at depth; line names the lease's line instead.
func subleaseName(id lockID, depth int, line bool) string {
	n := "\x00npurun-sublease/" + id.String() + "/" + strconv.Itoa(depth)
	if line {
		n += "/line"
	}
	return n
}

// leaseDepth is the depth of the lease whose first lock file is first,
// from NPURUN_SUBLEASE: 0 where it names another lease or none.
func leaseDepth(first lockID) int {
	v := os.Getenv(SubleaseVar)
	i := strings.LastIndexByte(v, ':')
	if i < 0 || v[:i] != first.String() {
		return 0
	}
	d, err := strconv.Atoi(v[i+1:])
	if err != nil || d < 0 || d > 1000 {
		return 0
	}
	return d
}

// subleaseWaiter reports a sub-lease's wait as a request's wait is
// reported: a line rewritten in place on a terminal, one per change with
// -v.
type subleaseWaiter interface {
	say(msg string)
	clear()
}

// takeSublease takes the devices of the lease that o names (-d), or o.N
// of them (-n), waiting while siblings hold them (never with --no-wait;
// for at most --timeout). It returns the sub-lease, or the exit status
// and a message on failure.
func (l *lease) takeSublease(o Options, w subleaseWaiter) (*sublease, int, error) {
	ids := make([]lockID, len(l.fds))
	for i, fd := range l.fds {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return nil, exitcode.Failure, fmt.Errorf("lease descriptor %d of device %d: %w", fd, l.devices[i], err)
		}
		ids[i] = lockID{st.Dev, st.Ino}
	}
	depth := leaseDepth(ids[0]) + 1
	want := o.N
	candidates := l.runtimeOrder()
	if len(o.Devices) > 0 {
		candidates, want = o.Devices, len(o.Devices)
	}
	if want == 0 {
		want = 1
	}
	var deadline time.Time
	if o.Timeout > 0 {
		deadline = time.Now().Add(o.Timeout)
	}
	uid := uint32(os.Getuid())
	s := &sublease{}
	fail := func(code int, err error) (*sublease, int, error) {
		closeFDs(s.fds)
		w.clear()
		return nil, code, err
	}
	what := npu.Unknown.Format(l.devices)

	// The line: one collector at a time. A request that does not wait
	// collects nothing over time, so it takes no place in the line: it
	// tries the devices once, beside a collector that may be taking its
	// own (two npurun --no-wait -n 1 started together both run).
	line := -1
	for !o.NoWait {
		fd, holder, err := bindOrConnect(subleaseName(ids[0], depth, true))
		if err != nil {
			return fail(exitcode.Failure, fmt.Errorf("inside a lease of %s: %w", what, err))
		}
		if holder == nil {
			line = fd
			break
		}
		if holder.cred != nil && holder.cred.Uid != uid && uid != 0 {
			holder.close()
			return fail(exitcode.Failure, fmt.Errorf("inside a lease of %s: its sub-leases' line is held by pid %d of uid %d, another account", what, holder.cred.Pid, holder.cred.Uid))
		}
		w.say(fmt.Sprintf("waiting for %s of the lease of %s: another npurun is taking its devices", wanted(o, want), what))
		err = awaitRelease([]*subHolder{holder}, deadline)
		holder.close()
		if err != nil {
			return fail(exitcode.TempFail, fmt.Errorf("inside a lease of %s: gave up after %s waiting for %s", what, quantity.Duration(o.Timeout), wanted(o, want)))
		}
	}
	if line >= 0 {
		defer unix.Close(line)
	}

	held := map[int]int{} // device -> socket
	defer func() {
		for _, fd := range held {
			unix.Close(fd)
		}
	}()
	for {
		var busy []*subHolder
		for _, d := range candidates {
			if len(held) == want {
				break
			}
			if _, ok := held[d]; ok {
				continue
			}
			i := slices.Index(l.devices, d)
			fd, holder, err := bindOrConnect(subleaseName(ids[i], depth, false))
			if err != nil {
				closeHolders(busy)
				return fail(exitcode.Failure, fmt.Errorf("inside a lease of %s: device %d: %w", what, d, err))
			}
			if holder == nil {
				held[d] = fd
				continue
			}
			if holder.cred != nil && holder.cred.Uid != uid && uid != 0 {
				closeHolders(append(busy, holder))
				return fail(exitcode.Failure, fmt.Errorf("inside a lease of %s: the sub-lease of device %d is held by pid %d of uid %d, another account", what, d, holder.cred.Pid, holder.cred.Uid))
			}
			holder.device = d
			busy = append(busy, holder)
		}
		if len(held) == want {
			closeHolders(busy)
			break
		}
		if o.NoWait {
			closeHolders(busy)
			return fail(exitcode.TempFail, fmt.Errorf("inside a lease of %s: %s held by other npuruns' sub-leases (%s)", what, wanted(o, want), holders(busy)))
		}
		w.say(fmt.Sprintf("waiting for %s of the lease of %s: held by %s", wanted(o, want), what, holders(busy)))
		err := awaitRelease(busy, deadline)
		closeHolders(busy)
		if err != nil {
			return fail(exitcode.TempFail, fmt.Errorf("inside a lease of %s: gave up after %s waiting for %s", what, quantity.Duration(o.Timeout), wanted(o, want)))
		}
	}
	w.clear()
	for _, d := range l.devices { // in the lease's order
		fd, ok := held[d]
		if !ok {
			continue
		}
		nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD, wire.FirstLeaseFD) // close-on-exec clear
		if err != nil {
			return fail(exitcode.Failure, fmt.Errorf("place the sub-lease of device %d: %w", d, err))
		}
		s.devices = append(s.devices, d)
		s.fds = append(s.fds, nfd)
	}
	first := ids[slices.Index(l.devices, s.devices[0])]
	s.env = []string{SubleaseVar + "=" + first.String() + ":" + strconv.Itoa(depth)}
	return s, 0, nil
}

// runtimeOrder is the lease's devices in NPURUN_DEVICES' order, the
// runtime's devices 0, 1, ...: -n K takes the first K that are free, so
// that without siblings it takes what a nested npurun -n K took before
// sub-leases (npu.Narrow). The lease's order where NPURUN_DEVICES does not
// list them.
func (l *lease) runtimeOrder() []int {
	var order []int
	for _, f := range strings.Split(os.Getenv("NPURUN_DEVICES"), ",") {
		id, err := strconv.Atoi(f)
		if err != nil || !slices.Contains(l.devices, id) || slices.Contains(order, id) {
			return slices.Clone(l.devices)
		}
		order = append(order, id)
	}
	if len(order) != len(l.devices) {
		return slices.Clone(l.devices)
	}
	return order
}

// wanted says what a sub-lease request asks for.
func wanted(o Options, n int) string {
	if len(o.Devices) > 0 {
		return npu.Unknown.Format(o.Devices)
	}
	if n == 1 {
		return "1 device"
	}
	return strconv.Itoa(n) + " devices"
}

// subHolder is a connection to the socket that holds a name, whose end
// is the name's release.
type subHolder struct {
	fd     int // -1 where no connection could be made
	cred   *unix.Ucred
	device int
}

func (h *subHolder) close() {
	if h.fd >= 0 {
		unix.Close(h.fd)
		h.fd = -1
	}
}

func closeHolders(hs []*subHolder) {
	for _, h := range hs {
		h.close()
	}
}

func holders(hs []*subHolder) string {
	var parts []string
	for _, h := range hs {
		if h.cred != nil {
			parts = append(parts, fmt.Sprintf("device %d: pid %d", h.device, h.cred.Pid))
		} else {
			parts = append(parts, fmt.Sprintf("device %d", h.device))
		}
	}
	return strings.Join(parts, ", ")
}

// bindOrConnect binds a listening socket (close-on-exec) to the abstract
// name, or, where another holds it, connects to that one: the socket and
// nil, or -1 and the holder.
func bindOrConnect(name string) (int, *subHolder, error) {
	for try := 0; ; try++ {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return -1, nil, fmt.Errorf("socket: %w", err)
		}
		err = unix.Bind(fd, &unix.SockaddrUnix{Name: name})
		if err == nil {
			if err := unix.Listen(fd, 64); err != nil {
				unix.Close(fd)
				return -1, nil, fmt.Errorf("listen: %w", err)
			}
			return fd, nil, nil
		}
		unix.Close(fd)
		if err != unix.EADDRINUSE {
			return -1, nil, fmt.Errorf("bind: %w", err)
		}
		c, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
		if err != nil {
			return -1, nil, fmt.Errorf("socket: %w", err)
		}
		err = unix.Connect(c, &unix.SockaddrUnix{Name: name})
		switch {
		case err == nil:
			cred, _ := unix.GetsockoptUcred(c, unix.SOL_SOCKET, unix.SO_PEERCRED)
			return -1, &subHolder{fd: c, cred: cred}, nil
		case err == unix.ECONNREFUSED && try < 3:
			// Bound but not listening yet, or just released: again.
			unix.Close(c)
			continue
		default:
			// Its queue full (EAGAIN), or not a sub-lease's socket: a
			// holder all the same, watched by time.
			unix.Close(c)
			return -1, &subHolder{fd: -1}, nil
		}
	}
}

// errDeadline means a wait passed its deadline.
var errDeadline = errors.New("deadline passed")

// awaitRelease waits until one of the holders' sockets closes, or a
// holder it could not connect to may have released, or deadline passes.
func awaitRelease(hs []*subHolder, deadline time.Time) error {
	var pfds []unix.PollFd
	timed := false
	for _, h := range hs {
		if h.fd >= 0 {
			pfds = append(pfds, unix.PollFd{Fd: int32(h.fd), Events: unix.POLLIN | unix.POLLRDHUP})
		} else {
			timed = true
		}
	}
	for {
		ms := -1
		if timed {
			ms = int(subleaseRecheck / time.Millisecond)
		}
		if !deadline.IsZero() {
			left := int(time.Until(deadline) / time.Millisecond)
			if left <= 0 {
				return errDeadline
			}
			if ms < 0 || left < ms {
				ms = left
			}
		}
		n, err := unix.Poll(pfds, ms)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("poll: %w", err)
		}
		if n > 0 || timed {
			return nil
		}
		if !deadline.IsZero() && time.Now().After(deadline) {
			return errDeadline
		}
	}
}
