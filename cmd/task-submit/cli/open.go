package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"runtime"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A task's log is at a path its submitter chose, in directories the
// submitter controls: whoever reads it must not be tricked into reading
// something else. So a log is opened
//
//   - never through a symbolic link in its last component (O_NOFOLLOW: the
//     supervisor writes it that way too);
//   - without blocking, and only if it is a regular file (O_NONBLOCK, then
//     fstat): a FIFO put in its place would otherwise hang the reader;
//   - by root, with the rights of the task's owner, not root's: the open
//     is made on a thread of its own whose file-system uid and gid are the
//     owner's and which has no supplementary groups (setfsuid, setfsgid and
//     setgroups are per thread in Linux; the thread is thrown away if its
//     credentials cannot be put back). The descriptor is then read as
//     usual. A path the owner could not open — /etc/shadow behind a link
//     the owner made, a file in root's directories — is refused.

// logOpener opens logs for one task.
type logOpener struct {
	asOwner  bool // open with the owner's rights (root reading another's log)
	uid, gid int
}

// errNotRegular is a log that is not a regular file.
var errNotRegular = errors.New("not a regular file")

// openerFor is the opener for the log of a task of uid, read by this
// process: with the owner's rights when this process is root. The owner's
// group is their primary group from the user database, or nogroup's
// number where they are not in it.
func openerFor(uid uint32) logOpener {
	if os.Geteuid() != 0 || uid == 0 {
		return logOpener{}
	}
	gid := 65534
	if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
		if g, err := strconv.Atoi(u.Gid); err == nil {
			gid = g
		}
	}
	return logOpener{asOwner: true, uid: int(uid), gid: gid}
}

// open opens the log at path for reading.
func (o logOpener) open(path string) (*os.File, error) {
	flags := unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC
	var fd int
	var err error
	if o.asOwner {
		fd, err = openAs(path, flags, o.uid, o.gid)
	} else {
		fd, err = unix.Open(path, flags, 0)
	}
	if err == unix.ELOOP {
		err = fmt.Errorf("%w: a symbolic link, which logs are never read through", err)
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "open", Path: path, Err: errNotRegular}
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, unix.O_RDONLY); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "fcntl", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// openAs opens path with the file-system rights of uid and gid and no
// supplementary groups, on a thread of its own.
func openAs(path string, flags, uid, gid int) (int, error) {
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// Locked, and never unlocked unless root's credentials are back:
		// a goroutine that ends locked takes its thread with it.
		runtime.LockOSThread()
		fd, restored, err := openAsLocked(path, flags, uid, gid)
		if restored {
			runtime.UnlockOSThread()
		}
		ch <- result{fd, err}
	}()
	r := <-ch
	return r.fd, r.err
}

func openAsLocked(path string, flags, uid, gid int) (fd int, restored bool, err error) {
	groups, err := unix.Getgroups()
	if err != nil {
		return -1, true, err
	}
	if err := setThreadGroups(nil); err != nil {
		return -1, true, err
	}
	// setfsuid(-1) changes nothing and returns the current value.
	unix.SetfsgidRetGid(gid)
	unix.SetfsuidRetUid(uid)
	if cur, _ := unix.SetfsuidRetUid(-1); cur != uid {
		fd, err = -1, fmt.Errorf("set the file-system uid to %d: refused", uid)
	} else if cur, _ := unix.SetfsgidRetGid(-1); cur != gid {
		fd, err = -1, fmt.Errorf("set the file-system gid to %d: refused", gid)
	} else {
		fd, err = unix.Open(path, flags, 0)
	}
	unix.SetfsuidRetUid(0)
	unix.SetfsgidRetGid(0)
	back, _ := unix.SetfsuidRetUid(-1)
	backG, _ := unix.SetfsgidRetGid(-1)
	restored = back == 0 && backG == 0 && setThreadGroups(groups) == nil
	return fd, restored, err
}

// setThreadGroups sets the calling thread's supplementary groups alone (the
// raw system call: the C library's and Go's setgroups change every thread).
func setThreadGroups(groups []int) error {
	gids := make([]uint32, len(groups))
	for i, g := range groups {
		gids[i] = uint32(g)
	}
	var p unsafe.Pointer
	if len(gids) > 0 {
		p = unsafe.Pointer(&gids[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(gids)), uintptr(p), 0); e != 0 {
		return e
	}
	runtime.KeepAlive(gids)
	return nil
}
