package harness

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// Main runs a test package's tests, then removes what the harness made
// for all of them (the built binaries, the SPANK plugin's build, the
// container root file system), and exits with the tests' status. Every
// package under tests/ calls it from its TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if d := builtDir(); d != "" {
		os.RemoveAll(d)
	}
	if SpankDir != "" {
		os.RemoveAll(SpankDir)
	}
	RemoveRootfs()
	os.Exit(code)
}

// RootDir is the repository's root: the directory above the test's own
// that holds go.mod (go test runs a test in its package's directory).
var RootDir = sync.OnceValues(func() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("no go.mod above the test's directory")
		}
		dir = up
	}
})

// Root is RootDir for paths joined to it: it panics where there is no
// repository above (a test run from outside one cannot read its files).
func Root() string {
	dir, err := RootDir()
	if err != nil {
		panic(err)
	}
	return dir
}
