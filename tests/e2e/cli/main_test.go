// Package cli tests the command lines as users meet them: flags, exit
// codes, error messages, configuration errors, completion scripts and the
// README's quick start.
package cli

import (
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
