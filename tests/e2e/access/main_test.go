// Package access tests device discipline end to end: the PAM module through
// real Linux-PAM and a real sshd on 127.0.0.1, device nodes hidden and
// shown, sessions, login shells, and unleased use found in /proc.
package access

import (
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
