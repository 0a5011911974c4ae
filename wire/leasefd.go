package wire

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// LeaseVar names the variable through which a command finds its lease's
// descriptors: "DEVICE:FD,…", in the order of the grant.
const LeaseVar = "NPURUN_LEASE"

// FirstLeaseFD is the lowest descriptor a command's lease is placed at.
// Shells close or mark descriptors below it: an interactive login bash
// sets close-on-exec on 3 to 19 at start-up (bash's shell.c), so a lease
// there would be dropped by everything the login starts, and a POSIX sh
// can name only 0 to 9 in a redirection. zsh and fish leave inherited
// descriptors as they are.
const FirstLeaseFD = 20

// PlaceLease puts a lease's descriptors where the command it is handed to
// keeps them: each of fds (the descriptor of devices[i]) is duplicated to
// the lowest free descriptor at FirstLeaseFD or above, close-on-exec
// clear there. It returns the new descriptors and the NPURUN_LEASE entry
// ("NPURUN_LEASE=DEVICE:FD,…") that names them. fds are left as they are
// (received with MSG_CMSG_CLOEXEC, an exec closes them); the caller
// closes the new ones where no exec follows. On error nothing new is left
// open.
//
// Every path that hands a lease to a command goes through here: npurun
// CMD, npurun --login and the task supervisor. (pam_npurun.so, in C,
// does the same in its keep().)
func PlaceLease(devices, fds []int) ([]int, string, error) {
	if len(devices) != len(fds) {
		return nil, "", fmt.Errorf("place lease: %d devices and %d descriptors", len(devices), len(fds))
	}
	placed := make([]int, 0, len(fds))
	for i, fd := range fds {
		nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD, FirstLeaseFD)
		if err != nil {
			closeAll(placed)
			return nil, "", fmt.Errorf("place lease descriptor of device %d: %w", devices[i], err)
		}
		placed = append(placed, nfd)
	}
	return placed, LeaseEntry(devices, placed), nil
}

// LeaseEntry is the NPURUN_LEASE entry naming devices held at fds:
// "NPURUN_LEASE=DEVICE:FD,…".
func LeaseEntry(devices, fds []int) string {
	var b strings.Builder
	b.WriteString(LeaseVar + "=")
	for i, id := range devices {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(id) + ":" + strconv.Itoa(fds[i]))
	}
	return b.String()
}

// LockDir is where the broker serving socket keeps its lock files: the
// directory "locks" beside the socket.
func LockDir(socket string) string {
	return socket[:strings.LastIndexByte(socket, '/')+1] + "locks"
}

// HoldsLock tells whether descriptor fd is device id's current lock file
// in dir (LockDir), and this open file holds an exclusive flock on it.
// The broker puts a fresh lock file in place whenever a lease ends, so a
// descriptor kept from an earlier lease, or a look-alike file elsewhere,
// is another file. /proc/self/fdinfo lists the locks of the open file
// behind the descriptor only. A nested npurun checks the lease it
// inherits with it, and npurun-runtime the lease it is handed.
//
// A share of a device (npurun --mem) is on a lock file of its own,
// npuN.sK.lock, made for it and removed when it ends: the descriptor's
// own name (its /proc/self/fd link) says which, and that name must still
// name the descriptor's file.
func HoldsLock(fd, id int, dir string) bool {
	var have, cur unix.Stat_t
	if unix.Fstat(fd, &have) != nil {
		return false
	}
	prefix := "npu" + strconv.Itoa(id)
	if unix.Stat(dir+"/"+prefix+".lock", &cur) != nil || have.Dev != cur.Dev || have.Ino != cur.Ino {
		var buf [512]byte
		n, err := unix.Readlink("/proc/self/fd/"+strconv.Itoa(fd), buf[:])
		if err != nil || n <= 0 || n >= len(buf) {
			return false
		}
		name := string(buf[:n])
		slash := strings.LastIndexByte(name, '/')
		base := name[slash+1:]
		slot, ok := strings.CutPrefix(base, prefix+".s")
		if !ok {
			return false
		}
		slot, ok = strings.CutSuffix(slot, ".lock")
		if !ok || slot == "" || strings.Trim(slot, "0123456789") != "" {
			return false
		}
		if unix.Stat(dir+"/"+base, &cur) != nil || have.Dev != cur.Dev || have.Ino != cur.Ino {
			return false
		}
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

// EndedLock tells whether descriptor fd is a lock file of device id in
// dir (LockDir) that is not its current one: the lock file of a lease
// that has ended (the broker put a fresh one in its place, and removed a
// share's), which holds nothing. Its /proc/self/fd link names it, with
// " (deleted)" after it once it is replaced. A nested npurun that
// inherits such a descriptor says its lease has ended.
func EndedLock(fd, id int, dir string) bool {
	if HoldsLock(fd, id, dir) {
		return false
	}
	var buf [512]byte
	n, err := unix.Readlink("/proc/self/fd/"+strconv.Itoa(fd), buf[:])
	if err != nil || n <= 0 || n >= len(buf) {
		return false
	}
	name := strings.TrimSuffix(string(buf[:n]), " (deleted)")
	base, ok := strings.CutPrefix(name, dir+"/")
	if !ok || strings.Contains(base, "/") {
		return false
	}
	prefix := "npu" + strconv.Itoa(id)
	if base == prefix+".lock" || base == "."+prefix+".lock.new" {
		return true
	}
	slot, ok := strings.CutPrefix(base, prefix+".s")
	if !ok {
		return false
	}
	slot, ok = strings.CutSuffix(slot, ".lock")
	return ok && slot != "" && strings.Trim(slot, "0123456789") == ""
}
