// Package testfs holds what the unit and end-to-end tests both do to a
// filesystem: fill it, to see what the broker does on a full disk. Only
// tests import it.
package testfs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// Fill takes the space left on the filesystem of dir, down to the last
// byte, with a file in dir, and returns the function that gives it back.
func Fill(t testing.TB, dir string) func() {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	for { // the last page, byte by byte
		if _, err := f.Write(buf[:1]); err != nil {
			break
		}
	}
	return func() {
		t.Helper()
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	}
}
