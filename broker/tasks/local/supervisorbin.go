package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/wire"
)

// Tasks run under npurun-supervise (package supervisor), a small static
// program of its own, started as the submitter. The broker runs it for
// every user, so it must be a file no user but root (or, for a broker that
// is not root, the broker's own user) can replace or change: otherwise one
// user could run code as another. The broker finds it once, at start:
//
//  1. beside its own executable (a build directory: bin/npubroker and
//     bin/npurun-supervise; the tests' binaries),
//  2. else at InstalledSupervisor, where make install puts it
//     ($(LIBEXECDIR)/npurun/npurun-supervise).
//
// It checks the file and every directory above it (owned by root or the
// broker's user, writable by nobody else; a sticky directory such as /tmp
// is fine, as only an entry's owner may replace the entry), opens it, and
// from then on runs supervisors from that open file (/proc/self/fd/N,
// which execve resolves to the file opened, as fexecve does): whatever is
// put at its path later is never run. A candidate that exists but fails
// the checks is an error, not a reason to look further.

// InstalledSupervisor is where make install puts the supervisor; the
// Makefile sets it at build time from LIBEXECDIR.
var InstalledSupervisor = "/usr/local/libexec/npurun/" + wire.SupervisorName

// supervisorBin is the supervisor program, open for the broker's life.
type supervisorBin struct {
	path string   // where it was found, for messages
	f    *os.File // executed through /proc/self/fd
}

// execPath is the path execve is given: the open file itself.
func (b *supervisorBin) execPath() string {
	return "/proc/self/fd/" + strconv.Itoa(int(b.f.Fd()))
}

// errNoSupervisor is a supervisor program that is not there.
var errNoSupervisor = errors.New("no supervisor program")

// findSupervisor finds, checks and opens the supervisor program for a
// broker whose executable is self.
func findSupervisor(self string) (*supervisorBin, error) {
	beside := filepath.Join(filepath.Dir(self), wire.SupervisorName)
	for _, p := range []string{beside, InstalledSupervisor} {
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		f, err := openTrusted(p, uint32(os.Geteuid()))
		if err != nil {
			return nil, fmt.Errorf("supervisor program %s: %w", p, err)
		}
		return &supervisorBin{path: p, f: f}, nil
	}
	return nil, fmt.Errorf("%w: neither %s nor %s exists (make install puts it in $(LIBEXECDIR)/npurun)", errNoSupervisor, beside, InstalledSupervisor)
}

// openTrusted opens the executable at path if only root and owner can
// change it, or anything on the way to it: every directory walked
// through, every entry looked up in them, symbolic links included.
func openTrusted(path string, owner uint32) (*os.File, error) {
	real, want, err := walkTrusted(path, owner)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(real, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", real, err)
	}
	f := os.NewFile(uintptr(fd), real)
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	switch {
	case err != nil:
		err = fmt.Errorf("stat %s: %w", real, err)
	case st.Dev != want.Dev || st.Ino != want.Ino:
		err = fmt.Errorf("%s changed while it was checked", real)
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		err = fmt.Errorf("%s is not a regular file", real)
	case st.Mode&0o111 == 0:
		err = fmt.Errorf("%s is not executable", real)
	case st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0:
		// Run as the submitter, it would run every task with its owner's
		// or group's rights (root's, installed), and so would anyone who
		// ran it.
		err = fmt.Errorf("%s is set-user-ID or set-group-ID (mode %04o): every task would run with its owner's rights", real, st.Mode&0o7777)
	default:
		err = trustedEntry(real, &st, owner)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// maxLinks bounds the symbolic links followed, as the kernel's ELOOP.
const maxLinks = 40

// walkTrusted resolves path one name at a time, as the kernel does,
// checking with trustedEntry each entry it looks up (and so each directory
// it walks through, and each symbolic link it follows); it returns the
// path resolved and what its last entry is.
func walkTrusted(path string, owner uint32) (string, *unix.Stat_t, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", nil, err
	}
	var st unix.Stat_t
	if err := unix.Lstat("/", &st); err != nil {
		return "", nil, fmt.Errorf("stat /: %w", err)
	}
	if err := trustedEntry("/", &st, owner); err != nil {
		return "", nil, err
	}
	cur, rest, links := "/", strings.Split(abs, "/"), 0
	for len(rest) > 0 {
		name := rest[0]
		rest = rest[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur) // cur has no link in it: as the kernel goes up
			continue
		}
		next := filepath.Join(cur, name)
		if err := unix.Lstat(next, &st); err != nil {
			return "", nil, fmt.Errorf("stat %s: %w", next, err)
		}
		if err := trustedEntry(next, &st, owner); err != nil {
			return "", nil, err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			cur = next
			continue
		}
		if links++; links > maxLinks {
			return "", nil, fmt.Errorf("%s: %w", path, unix.ELOOP)
		}
		target, err := os.Readlink(next)
		if err != nil {
			return "", nil, err
		}
		if filepath.IsAbs(target) {
			cur = "/"
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	return cur, &st, nil
}

// trustedEntry checks that only root and owner can change what st
// describes: owned by one of them, and not writable by group or others
// (a group-writable one of group root is fine, unless an ACL lets others
// write it; so is a sticky directory,
// whose entries only their owners may replace; a symbolic link's own mode
// means nothing).
func trustedEntry(path string, st *unix.Stat_t, owner uint32) error {
	if st.Uid != 0 && st.Uid != owner {
		return fmt.Errorf("%s is owned by uid %d, not root: another user could replace the program the broker runs for everyone", path, st.Uid)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return nil
	case unix.S_IFDIR:
		if st.Mode&unix.S_ISVTX != 0 {
			return nil
		}
	}
	if st.Mode&0o002 != 0 || (st.Mode&0o020 != 0 && st.Gid != 0) {
		return fmt.Errorf("%s is writable by others than its owner (mode %04o): another user could replace the program the broker runs for everyone", path, st.Mode&0o7777)
	}
	if st.Mode&0o020 != 0 {
		// With a POSIX ACL, the group bits are its mask: the most that any
		// user or group it names may do, not what group root may.
		n, err := unix.Lgetxattr(path, aclAccessXattr, nil)
		switch {
		case err == nil && n > 0:
			return fmt.Errorf("%s has an access ACL, and its mode (%04o) lets the users and groups it names write: another user could replace the program the broker runs for everyone", path, st.Mode&0o7777)
		case err != nil && !errors.Is(err, unix.ENODATA) && !errors.Is(err, unix.EOPNOTSUPP):
			return fmt.Errorf("read the ACL of %s: %w", path, err)
		}
	}
	return nil
}

// aclAccessXattr holds a file's POSIX access ACL.
const aclAccessXattr = "system.posix_acl_access"

// CheckSupervisor finds and checks the supervisor program as a broker
// started from this executable would (for check-config).
func CheckSupervisor() error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	b, err := findSupervisor(self)
	if err != nil {
		return err
	}
	return b.f.Close()
}
