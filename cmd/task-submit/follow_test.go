package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
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
			go func() { done <- follow(out, path, end) }()

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
	if err := follow(out, filepath.Join(t.TempDir(), "no", "118.log"), end); err != nil {
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
	err := follow(make(chanWriter, 100), filepath.Join(t.TempDir(), "118.log"), end)
	if err == nil {
		t.Fatal("follow with a broken end: no error")
	}
}

// A log path under a file, not a directory, is an error, not a hang.
func TestFollowNotADirectory(t *testing.T) {
	dir := t.TempDir()
	appendFile(t, filepath.Join(dir, "file"), "")
	end := newPipeEnd(t)
	err := follow(make(chanWriter, 100), filepath.Join(dir, "file", "118.log"), end)
	if err == nil {
		t.Fatal("follow under a file: no error")
	}
}

func TestFollowUnreadable(t *testing.T) {
	if os.Getuid() == 0 {
		t.Skip("root reads every file")
	}
	p := filepath.Join(t.TempDir(), "118.log")
	appendFile(t, p, "secret\n")
	if err := os.Chmod(p, 0); err != nil {
		t.Fatal(err)
	}
	err := follow(make(chanWriter, 100), p, newPipeEnd(t))
	if !errors.Is(err, os.ErrPermission) {
		t.Fatalf("follow of an unreadable log = %v, want a permission error", err)
	}
}
