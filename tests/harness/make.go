package harness

import (
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// MakeInRepo prepares a make command in the repository root with vars, and
// DESTDIR unset unless vars set it.
func MakeInRepo(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	root, err := RootDir()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("make", append([]string{"--no-print-directory", "-C", root}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DESTDIR=") && !strings.HasPrefix(kv, "MAKEFLAGS=") && !strings.HasPrefix(kv, "MFLAGS=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	return cmd
}

func CopyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
