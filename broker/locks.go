package broker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/procscan"
)

// device is one accelerator's lock. While the device is free the broker
// holds its lock file open and flock'ed (fd >= 0); a grant hands that very
// descriptor to the client and the broker keeps nothing but a second open
// of the file (spare), blocked in flock until the holder's process tree is
// gone.
//
// A lock file serves one lease. Every descriptor a lease's client got
// shares the one open file the broker granted, and that client may keep it
// after its lease ends and block in flock on it; were the next lease on the
// same file, that flock could win the lock without a grant. So when a lease
// ends the broker puts a fresh lock file in its place (renew): no earlier
// lease's descriptor reaches the file a lease holds, and a nested npurun
// recognises a lease by the device and inode of the current file.
type device struct {
	id     int
	path   string
	fd     int     // locked descriptor while free; -1 while leased
	spare  int     // a second open of the free lock file, for the watcher; -1 if none
	holder uint32  // uid the lease was granted to (this broker's grants only)
	leased bool    // granted by this broker (false: found held at start)
	origin *Origin // the session the lease was granted to, if it was one
	since  time.Time
	watch  chan int // descriptors for the device's watcher to wait on

	// ended is the lock file whose release the watcher has seen, from
	// the moment flock returns (before it waits for the broker's lock to
	// record the end); nil while it waits on a lease.
	ended atomic.Pointer[procscan.FileID]
}

// released tells whether d's watcher has seen the lease on lock file
// file end.
func (d *device) released(file procscan.FileID) bool {
	e := d.ended.Load()
	return e != nil && *e == file
}

// LockPath is the lock file of physical device id in dir.
func LockPath(dir string, id int) string {
	return filepath.Join(dir, "npu"+strconv.Itoa(id)+".lock")
}

// lockDirMode lets everyone look up a lock file by name (stat(2): a nested
// npurun compares its descriptor with the current file) but nobody list,
// create or, the files being 0600, open one.
const lockDirMode = 0o711

// prepareLockDir makes dir, owned by us and open to nobody else. It refuses
// a symlink or a directory owned by someone else.
func prepareLockDir(dir string) error {
	return prepareDir(dir, 0o700)
}

// prepareDir makes dir with mode, owned by us, writable by nobody else. It
// refuses a symlink or a directory owned by someone else.
func prepareDir(dir string, mode uint32) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	if err := unix.Mkdir(dir, mode); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("create directory %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("directory %s: %w", dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("directory %s: not a directory", dir)
	}
	if st.Uid != uint32(os.Geteuid()) {
		return fmt.Errorf("directory %s: owned by uid %d, not by the broker's uid %d", dir, st.Uid, os.Geteuid())
	}
	if st.Mode&0o7777 != mode {
		if err := unix.Chmod(dir, mode); err != nil {
			return fmt.Errorf("directory %s: %w", dir, err)
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

// freshLock is a fresh lock file made aside, locked, with a second open of
// it, ready to be put in place of a device's lock file.
type freshLock struct {
	tmp           string
	locked, spare int
}

// prepareLock makes a fresh lock file beside path, under a name of its
// own, locks it and opens it a second time.
func prepareLock(path string) (*freshLock, error) {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".new")
	if err := unix.Unlink(tmp); err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("make lock file %s: %w", tmp, err)
	}
	var locked int
	var err error
	for {
		locked, err = unix.Open(tmp, unix.O_RDONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("make lock file %s: %w", tmp, err)
	}
	f := &freshLock{tmp: tmp, locked: locked, spare: -1}
	if err := flock(locked, true); err != nil {
		f.discard()
		return nil, fmt.Errorf("lock %s: %w", tmp, err)
	}
	// The spare is opened through the descriptor, not the name, so that it
	// is the same file whatever happens to the name.
	if f.spare, err = reopen(locked); err != nil {
		f.discard()
		return nil, fmt.Errorf("open %s again: %w", tmp, err)
	}
	return f, nil
}

// place renames the fresh file over path: from now on path names it, and
// no descriptor opened before reaches it.
func (f *freshLock) place(path string) error {
	if err := unix.Rename(f.tmp, path); err != nil {
		return fmt.Errorf("put a fresh lock file in place of %s: %w", path, err)
	}
	return nil
}

// discard closes and removes a fresh file that will not be used.
func (f *freshLock) discard() {
	closeFD(f.locked)
	closeFD(f.spare)
	unix.Unlink(f.tmp)
}

// reopen opens the file of descriptor fd again: a new open file, sharing
// no lock with fd.
func reopen(fd int) (int, error) {
	for {
		nfd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return nfd, err
		}
	}
}
