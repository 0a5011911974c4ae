// Package atomicfile writes a small file whole, and reads one back: a reader, or the next
// start after a crash at any moment, sees the old content or the new,
// never a part.
package atomicfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Write replaces path with data, mode perm: a temporary file beside it
// (".NAME.new", made with O_EXCL and O_NOFOLLOW: a link planted there is
// an error, not followed), written, chmod'ed past the umask and fsync'd,
// renamed over path, and the directory fsync'd. On an error path is as
// it was and the temporary file is gone.
func Write(path string, data []byte, perm uint32) error {
	dir := filepath.Dir(path)
	tmp := filepath.Join(dir, "."+filepath.Base(path)+".new")
	os.Remove(tmp) // one a crash left
	fd, err := unix.Open(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, perm)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(os.FileMode(perm))
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return SyncDir(dir)
}

// SyncDir fsyncs directory dir, so that a rename or removal in it lasts.
func SyncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// ReadJSON reads the JSON file that Write made at path into v, as it is
// read back at a start: not following a link, not blocking on what is not
// a regular file, at most max bytes, no field v does not name. It tells
// false, and no error, where there is no file. Its errors read
// "PATH: what is wrong" and wrap the system's (unix.ENOTDIR: the
// directory is a file).
func ReadJSON(path string, max int, v any) (bool, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return false, fmt.Errorf("%s: not a regular file", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	if len(data) > max {
		return false, fmt.Errorf("%s: larger than %d bytes", path, max)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	return true, nil
}
