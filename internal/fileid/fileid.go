// Package fileid names a file by what it is, not by its path: the device
// of its file system and its inode. It is the one name that the lease
// table (a lease's lock files) and the /proc scan (the files a process has
// open) share; it owns nothing else and never touches /proc.
package fileid

import "golang.org/x/sys/unix"

// ID names a file by the device it is on and its inode.
type ID struct{ Dev, Ino uint64 }

// Of returns the ID of the file open at fd.
func Of(fd int) (ID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return ID{}, err
	}
	return ID{Dev: st.Dev, Ino: st.Ino}, nil
}
