package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// endSource tells follow when the task has ended: a descriptor to poll,
// and a reader of what arrives on it, called when it is readable.
type endSource interface {
	Fd() int
	Ended() (bool, error)
}

// follow copies the log at path to out, and then what is appended to it,
// until end reports that the task has ended; it then copies the rest and
// returns. The log need not exist yet (a task's supervisor creates it when
// the task starts): until it does, follow watches the directory it will
// appear in, or the deepest one on the way that exists. It waits in poll(2)
// on an inotify descriptor beside end's, and never sleeps. The log is
// opened with open (see open.go).
func follow(out io.Writer, path string, end endSource, open func(string) (*os.File, error)) error {
	ifd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("inotify: %w", err)
	}
	lw := &logWatch{ifd: ifd, path: path, wd: -1, openLog: open}
	defer lw.close()
	events := make([]byte, 64<<10) // read and dropped: any event means "look again"
	for {
		if err := lw.arm(); err != nil {
			return err
		}
		if err := lw.copy(out); err != nil {
			return err
		}
		pfd := []unix.PollFd{
			{Fd: int32(ifd), Events: unix.POLLIN},
			{Fd: int32(end.Fd()), Events: unix.POLLIN},
		}
		if _, err := unix.Poll(pfd, -1); err != nil {
			if err == unix.EINTR {
				continue
			}
			return fmt.Errorf("poll: %w", err)
		}
		if pfd[1].Revents != 0 {
			done, err := end.Ended()
			if err != nil {
				return err
			}
			if done {
				if err := lw.open(); err != nil {
					return err
				}
				return lw.copy(out)
			}
		}
		if pfd[0].Revents != 0 {
			if err := drain(ifd, events); err != nil {
				return err
			}
		}
	}
}

// logWatch is the inotify watch that follow keeps on a log, or on the way
// to it.
type logWatch struct {
	ifd  int
	path string
	wd   int      // the current watch; -1 for none
	f    *os.File // the log, once it exists

	openLog func(string) (*os.File, error)
}

// arm makes sure the next change that matters wakes poll: once the log
// exists, a write to it; before that, the creation of the log or of the
// next missing directory on its way.
func (lw *logWatch) arm() error {
	for lw.f == nil {
		want := filepath.Dir(lw.path)
		dir := want
		for {
			wd, err := unix.InotifyAddWatch(lw.ifd, dir, unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_ONLYDIR)
			if err == nil {
				lw.replace(wd)
				break
			}
			if err == unix.ENOENT && filepath.Dir(dir) != dir {
				dir = filepath.Dir(dir)
				continue
			}
			return &fs.PathError{Op: "watch", Path: dir, Err: err}
		}
		if dir != want {
			// Watched from above. The watch is in place first, so a
			// directory made since the failed attempt below is seen here.
			rel, err := filepath.Rel(dir, want)
			if err != nil {
				return err
			}
			next := filepath.Join(dir, strings.SplitN(rel, "/", 2)[0])
			if _, err := os.Stat(next); err == nil {
				continue
			}
			return nil
		}
		if err := lw.open(); err != nil {
			return err
		}
		if lw.f == nil {
			return nil
		}
		// Opened after the directory watch was placed: nothing written
		// since is missed, as copy reads to the end after this.
		wd, err := unix.InotifyAddWatch(lw.ifd, lw.path, unix.IN_MODIFY)
		if err != nil {
			return &fs.PathError{Op: "watch", Path: lw.path, Err: err}
		}
		lw.replace(wd)
	}
	return nil
}

// open opens the log if it exists and is not open yet.
func (lw *logWatch) open() error {
	if lw.f != nil {
		return nil
	}
	f, err := lw.openLog(lw.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	}
	lw.f = f
	return nil
}

// copy copies what the log holds beyond what was copied before.
func (lw *logWatch) copy(out io.Writer) error {
	if lw.f == nil {
		return nil
	}
	_, err := io.Copy(out, lw.f)
	return err
}

func (lw *logWatch) replace(wd int) {
	if lw.wd >= 0 && lw.wd != wd {
		unix.InotifyRmWatch(lw.ifd, uint32(lw.wd)) // may already be gone with its directory
	}
	lw.wd = wd
}

func (lw *logWatch) close() {
	if lw.f != nil {
		lw.f.Close()
	}
	unix.Close(lw.ifd)
}

// drain reads the pending inotify events of the non-blocking ifd.
func drain(ifd int, buf []byte) error {
	for {
		n, err := unix.Read(ifd, buf)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return nil
		case err != nil:
			return fmt.Errorf("read inotify events: %w", err)
		case n == 0:
			return nil
		}
	}
}
