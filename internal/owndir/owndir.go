// Package owndir makes directories that only the running user may write. It
// imports only the standard library and x/sys/unix, and never accepts a
// symbolic link or a directory that someone else owns.
package owndir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Make makes dir with mode, owned by us, writable by nobody else, and sets
// the mode of one that exists. It refuses a symbolic link and a directory
// owned by someone else.
func Make(dir string, mode uint32) error {
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
