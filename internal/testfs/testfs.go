// Package testfs holds what the unit and end-to-end tests both do to a
// filesystem: fill it, to see what the broker does on a full disk, and
// mark each device a holder is granted with a file made O_EXCL, the
// workload's own check of mutual exclusion. Only tests import it.
package testfs

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
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

// Mark is a test workload's own check of mutual exclusion: it makes a
// file per device granted to holder (dir/npuN, created O_EXCL) and fails
// the test, naming holder and device, where another holder's file is
// there already. The function it returns removes the files it made, for
// the holder to call before it lets its lease go.
func Mark(t testing.TB, dir, holder string, devices []int) (unmark func()) {
	var made []string
	for _, id := range devices {
		m := filepath.Join(dir, "npu"+strconv.Itoa(id))
		f, err := os.OpenFile(m, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			t.Errorf("%s granted npu%d while another holds it: %v", holder, id, err)
			continue
		}
		f.Close()
		made = append(made, m)
	}
	return func() {
		for _, m := range made {
			os.Remove(m)
		}
	}
}
