package lease

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/npurun/npurun/internal/fileid"
	"golang.org/x/sys/unix"
)

// Lock files. Each device has one in the table's directory. While the
// device is free the table holds its lock file open and flock'ed; a grant
// hands that very descriptor to the holder, and the table keeps nothing
// but a second open of the file (the spare), blocked in flock in the
// device's watcher until the holder's process tree is gone.
//
// A lock file serves one lease. Every descriptor a lease's holder got
// shares the one open file the table handed out, and that holder may keep
// it after its lease ends and block in flock on it; were the next lease on
// the same file, that flock could win the lock without a grant. So when a
// lease ends the table puts a fresh lock file in its place (renew): no
// earlier lease's descriptor reaches the file a lease holds, and a nested
// npurun recognises a lease by the device and inode of the current file.

// LockPath is the lock file of physical device id in dir.
func LockPath(dir string, id int) string {
	return filepath.Join(dir, "npu"+strconv.Itoa(id)+".lock")
}

// DirMode lets everyone look up a lock file by name (stat(2): a nested
// npurun compares its descriptor with the current file) but nobody list,
// create or, the files being 0600, open one.
const DirMode = 0o711

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

// tryLock opens the lock file at path and tries it without blocking. It
// returns the descriptor and whether the lock was taken (the device is
// free).
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
	file          fileid.ID
}

// prepareLock makes a fresh lock file beside path, under a name of its
// own, locks it and opens it a second time.
func prepareLock(path string) (*freshLock, error) { return prepareLockWith(path, nil) }

// prepareLockWith is prepareLock writing content into the fresh file
// first (a share's declaration), through a descriptor of its own that
// nobody else gets: those handed out are read-only.
func prepareLockWith(path string, content []byte) (*freshLock, error) {
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
	if f.file, err = fileid.Of(locked); err != nil {
		f.discard()
		return nil, fmt.Errorf("stat %s: %w", tmp, err)
	}
	if content != nil {
		if err := writeTo(tmp, f.file, content); err != nil {
			f.discard()
			return nil, fmt.Errorf("write %s: %w", tmp, err)
		}
	}
	// The spare is a second open of the same file, a new open file that
	// shares no lock with the first: opened by its name, and checked to be
	// the file just made whatever happened to the name meanwhile.
	if f.spare, err = reopen(tmp, f.file); err != nil {
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

// errReplaced is a lock file whose name no longer names the file made.
var errReplaced = errors.New("replaced while it was being made")

// reopen opens the file at path again, never following a link, and checks
// that it is file.
func reopen(path string, file fileid.ID) (int, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return -1, err
	}
	if got, err := fileid.Of(fd); err != nil || got != file {
		unix.Close(fd)
		return -1, errReplaced
	}
	return fd, nil
}

// writeTo writes content to the file at path, never following a link,
// once it has checked that it is file.
func writeTo(path string, file fileid.ID, content []byte) error {
	var fd int
	var err error
	for {
		fd, err = unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if got, err := fileid.Of(fd); err != nil || got != file {
		return errReplaced
	}
	_, err = unix.Write(fd, content)
	return err
}

func closeFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}
