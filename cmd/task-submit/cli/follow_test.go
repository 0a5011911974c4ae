package cli

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pipeEnd stands in for the wait connection: the task ends when the test
// writes to the pipe.
type pipeEnd struct{ r, w *os.File }

func newPipeEnd(t *testing.T) *pipeEnd {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return &pipeEnd{r: r, w: w}
}

func (p *pipeEnd) Fd() int { return int(p.r.Fd()) }

func (p *pipeEnd) Ended() (bool, error) {
	var b [1]byte
	if _, err := p.r.Read(b[:]); err != nil {
		return false, err
	}
	return b[0] == 'x', nil // anything else is progress, not the end
}

func (p *pipeEnd) send(t *testing.T, b byte) {
	if _, err := p.w.Write([]byte{b}); err != nil {
		t.Fatal(err)
	}
}

// chanWriter hands what follow writes to the test.
type chanWriter chan []byte

func (c chanWriter) Write(p []byte) (int, error) {
	c <- bytes.Clone(p)
	return len(p), nil
}

// expect reads what follow wrote until it is want; a follow that misses
// a change never writes it, and the test fails after a generous bound.
func expect(t *testing.T, out chanWriter, want string) {
	t.Helper()
	var got []byte
	deadline := time.After(10 * time.Second)
	for string(got) != want {
		select {
		case b := <-out:
			got = append(got, b...)
			if len(got) > len(want) {
				t.Fatalf("follow wrote %q, want %q", got, want)
			}
		case <-deadline:
			t.Fatalf("follow wrote %q, want %q", got, want)
		}
	}
}

func appendFile(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

func TestFollow(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) string // makes what exists at the start; returns the log's path
		first string                                // what the log holds once it exists
	}{
		{"log exists", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "118.log")
			appendFile(t, p, "one\n")
			return p
		}, "one\n"},
		{"log appears later", func(t *testing.T, dir string) string {
			return filepath.Join(dir, "118.log")
		}, ""},
		{"directories appear later", func(t *testing.T, dir string) string {
			return filepath.Join(dir, "state", "npurun", "tasks", "118.log")
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := tt.setup(t, t.TempDir())
			end := newPipeEnd(t)
			out := make(chanWriter, 100)
			done := make(chan error, 1)
			go func() { done <- follow(out, path, end, logOpener{}.open) }()

			expect(t, out, tt.first)
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			appendFile(t, path, "two\n")
			expect(t, out, "two\n")
			end.send(t, 'q') // progress: follow goes on
			appendFile(t, path, "three")
			expect(t, out, "three")
			appendFile(t, path, " four\n")
			end.send(t, 'x')
			if err := <-done; err != nil {
				t.Fatalf("follow: %v", err)
			}
			close(out)
			var rest []byte
			for b := range out {
				rest = append(rest, b...)
			}
			if string(rest) != " four\n" {
				t.Errorf("after the end follow wrote %q, want %q", rest, " four\n")
			}
		})
	}
}

// A task that ends before its log appears (cancelled while pending) ends
// the follow with nothing written.
func TestFollowNoLog(t *testing.T) {
	end := newPipeEnd(t)
	end.send(t, 'x')
	out := make(chanWriter, 100)
	if err := follow(out, filepath.Join(t.TempDir(), "no", "118.log"), end, logOpener{}.open); err != nil {
		t.Fatalf("follow: %v", err)
	}
	if len(out) != 0 {
		t.Errorf("follow wrote %q, want nothing", <-out)
	}
}

// The end source's errors end the follow.
func TestFollowEndError(t *testing.T) {
	end := newPipeEnd(t)
	end.w.Close()
	err := follow(make(chanWriter, 100), filepath.Join(t.TempDir(), "118.log"), end, logOpener{}.open)
	if err == nil {
		t.Fatal("follow with a broken end: no error")
	}
}

// A log path under a file, not a directory, is an error, not a hang.
func TestFollowNotADirectory(t *testing.T) {
	dir := t.TempDir()
	appendFile(t, filepath.Join(dir, "file"), "")
	end := newPipeEnd(t)
	err := follow(make(chanWriter, 100), filepath.Join(dir, "file", "118.log"), end, logOpener{}.open)
	if err == nil {
		t.Fatal("follow under a file: no error")
	}
}

// TestFollowUnreadable: a log its reader may not open ends the follow with
// a permission error. As root, the log is opened with its owner's rights,
// so the test reads as root a file root alone may read, on behalf of an
// owner with no rights to it: by its owner bits (0600), and by its group
// (0640, group root: root's own groups are dropped too).
func TestFollowUnreadable(t *testing.T) {
	tests := []struct {
		name string
		mode os.FileMode
	}{
		{"owner only", 0o600},
		{"owner and group root", 0o640},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(openDir(t), "118.log")
			appendFile(t, p, "secret\n")
			open := logOpener{}.open
			if os.Geteuid() == 0 {
				if err := os.Chown(p, 0, 0); err != nil {
					t.Fatal(err)
				}
				open = logOpener{asOwner: true, uid: 65534, gid: 65534}.open
				if tc.mode&0o040 != 0 {
					// Root in group root: its supplementary groups must be
					// dropped for the owner's open, or the group bits let
					// it through.
					saved, err := syscall.Getgroups()
					if err != nil {
						t.Fatal(err)
					}
					if err := syscall.Setgroups([]int{0}); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { syscall.Setgroups(saved) })
				}
			} else {
				tc.mode = 0
			}
			if err := os.Chmod(p, tc.mode); err != nil {
				t.Fatal(err)
			}
			out := make(chanWriter, 100)
			end := newPipeEnd(t)
			done := make(chan error, 1)
			go func() { done <- follow(out, p, end, open) }()
			var err error
			select {
			case err = <-done:
			case b := <-out:
				end.send(t, 'x') // let the follow end
				t.Fatalf("follow read %q from a log its reader may not read", b)
			case <-time.After(10 * time.Second):
				t.Fatal("follow of an unreadable log neither failed nor read within 10s")
			}
			if !errors.Is(err, os.ErrPermission) {
				t.Fatalf("follow of an unreadable log = %v, want a permission error", err)
			}
			threadsAreRoot(t)
		})
	}
}

// openDir is a temporary directory that everyone may enter, with its
// parents (a t.TempDir's parent is private): what an owner may not read
// there is refused for the file's own mode, not for the way to it.
func openDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "task-submit-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// threadsAreRoot checks, as root, that every thread of this process has
// root's file-system ids and its groups back after an open as another user.
func threadsAreRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		return
	}
	self, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	groups := statusField(string(self), "Groups:")
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		data, err := os.ReadFile("/proc/self/task/" + task.Name() + "/status")
		if err != nil {
			continue // exited meanwhile
		}
		st := string(data)
		if uid, gid := statusField(st, "Uid:"), statusField(st, "Gid:"); uid != "0 0 0 0" || gid != "0 0 0 0" || statusField(st, "Groups:") != groups {
			t.Errorf("thread %s: Uid %q Gid %q Groups %q after an open as another user, want root's", task.Name(), uid, gid, statusField(st, "Groups:"))
		}
	}
}

// statusField is a line of /proc/PID/status, its blanks collapsed.
func statusField(status, key string) string {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return ""
}

// TestOpenLog: a log that is a symbolic link or a FIFO is refused at once,
// by root and by its owner alike; a regular file opens.
func TestOpenLog(t *testing.T) {
	dir := openDir(t)
	target := filepath.Join(dir, "target")
	appendFile(t, target, "x\n")
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	openers := map[string]logOpener{"as itself": {}}
	if os.Geteuid() == 0 {
		if err := os.Chmod(target, 0o644); err != nil {
			t.Fatal(err)
		}
		openers["as an owner"] = logOpener{asOwner: true, uid: 65534, gid: 65534}
	}
	for name, o := range openers {
		t.Run(name, func(t *testing.T) {
			if _, err := o.open(link); !errors.Is(err, unix.ELOOP) {
				t.Errorf("open of a symbolic link = %v, want ELOOP", err)
			}
			done := make(chan error, 1)
			go func() {
				f, err := o.open(fifo)
				if f != nil {
					f.Close()
				}
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, errNotRegular) {
					t.Errorf("open of a FIFO = %v, want %v", err, errNotRegular)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("open of a FIFO blocked")
			}
			f, err := o.open(target)
			if err != nil {
				t.Fatalf("open of a regular file: %v", err)
			}
			defer f.Close()
			if b, err := io.ReadAll(f); err != nil || string(b) != "x\n" {
				t.Errorf("read %q, %v; want %q", b, err, "x\n")
			}
			threadsAreRoot(t)
		})
	}
}
