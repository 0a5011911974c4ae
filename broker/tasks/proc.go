package tasks

import (
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// BootID names this boot of the machine; "" if unknown.
func BootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// monoNow is the monotonic clock: time since boot, not counting suspend,
// which no change of the wall clock moves.
func monoNow() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

func closeFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}
