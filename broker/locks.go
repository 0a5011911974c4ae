package broker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// device is one accelerator's lock. While the device is free the broker
// holds its lock file open and flock'ed (fd >= 0); a grant hands that very
// descriptor to the client and the broker keeps nothing but a second open
// of the file, blocked in flock until the holder's process tree is gone.
type device struct {
	id     int
	path   string
	fd     int    // locked descriptor while free; -1 while leased
	holder uint32 // uid the lease was granted to (this broker's grants only)
	leased bool   // granted by this broker (false: found held at start)
	since  time.Time
	watch  chan int // descriptors for the device's watcher to wait on
}

// LockPath is the lock file of physical device id in dir.
func LockPath(dir string, id int) string {
	return filepath.Join(dir, "npu"+strconv.Itoa(id)+".lock")
}

// prepareLockDir makes dir, owned by us and open to nobody else. It refuses
// a symlink or a directory owned by someone else.
func prepareLockDir(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	if err := unix.Mkdir(dir, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("create lock directory %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("lock directory %s: %w", dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("lock directory %s: not a directory", dir)
	}
	if st.Uid != uint32(os.Geteuid()) {
		return fmt.Errorf("lock directory %s: owned by uid %d, not by the broker's uid %d", dir, st.Uid, os.Geteuid())
	}
	if st.Mode&0o077 != 0 {
		if err := unix.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("lock directory %s: %w", dir, err)
		}
	}
	return nil
}

// openLock opens a device's lock file, creating it, never following a link.
func openLock(path string) (int, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CREAT|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, fmt.Errorf("open lock %s: %w", path, err)
		}
		return fd, nil
	}
}

// flock takes an exclusive lock, blocking unless nonblock.
func flock(fd int, nonblock bool) error {
	how := unix.LOCK_EX
	if nonblock {
		how |= unix.LOCK_NB
	}
	for {
		err := unix.Flock(fd, how)
		if err != unix.EINTR {
			return err
		}
	}
}

// tryLock opens the lock of d and tries it without blocking. It returns the
// descriptor and whether the lock was taken (the device is free).
func tryLock(path string) (int, bool, error) {
	fd, err := openLock(path)
	if err != nil {
		return -1, false, err
	}
	switch err := flock(fd, true); {
	case err == nil:
		return fd, true, nil
	case errors.Is(err, unix.EWOULDBLOCK):
		return fd, false, nil
	default:
		unix.Close(fd)
		return -1, false, fmt.Errorf("lock %s: %w", path, err)
	}
}
