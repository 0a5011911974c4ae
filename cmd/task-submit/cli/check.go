package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/wire"
)

// A task bound to fail should not be reported as queued: what can be
// checked at submit time, task-submit checks, as the submitter it runs as
// (the broker, root, would see another file system than the task's
// supervisor, which runs as the submitter too).

// checkLog tells whether a task's supervisor, running as this user, will
// be able to write its log at path: an existing file must be one this
// user may write and not a symbolic link (the supervisor never follows
// one); a missing one needs a directory on its way in which this user may
// create what is missing.
func checkLog(path string) error {
	fi, err := os.Lstat(path)
	switch {
	case err == nil:
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("log %s is a symbolic link, which a task's log is never written through", path)
		case fi.IsDir():
			return fmt.Errorf("log %s is a directory", path)
		case unix.Access(path, unix.W_OK) != nil:
			return fmt.Errorf("log %s is not writable by you", path)
		}
		return nil
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("log %s: %w", path, unwrapPath(err))
	}
	// Missing: the supervisor makes it, and the directories on its way.
	for dir := filepath.Dir(path); ; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		switch {
		case err == nil && !fi.IsDir():
			return fmt.Errorf("log %s: %s is not a directory", path, dir)
		case err == nil && unix.Access(dir, unix.W_OK|unix.X_OK) != nil:
			return fmt.Errorf("log %s: you may not create files in %s", path, dir)
		case err == nil:
			return nil
		case !errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("log %s: %w", path, unwrapPath(err))
		}
	}
}

// checkDefaultLog checks the default log's place when no --log is given:
// the submitter's home directory must exist. Where the user database does
// not know this user (an account only LDAP knows, as task-submit reads
// /etc/passwd alone), $HOME stands in for it; with neither, the broker
// decides.
func checkDefaultLog() error {
	home := ""
	if u, err := user.Current(); err == nil {
		home = u.HomeDir
	}
	if home == "" {
		home = os.Getenv("HOME")
	}
	if home == "" {
		return nil
	}
	if fi, err := os.Stat(home); err != nil || !fi.IsDir() {
		return fmt.Errorf("your home directory %s does not exist, and a task's log goes under it (~/%s/ID-TAG.log) unless --log names another", home, wire.DefaultLogDir)
	}
	return checkLog(wire.DefaultLog(home, 1, "check"))
}

// unwrapPath drops the path an error already names.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
