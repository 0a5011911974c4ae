package client

import (
	"fmt"
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
