package status

import (
	"path/filepath"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/npurun/npurun/tests/harness"
)

// TestStatusScripts runs the scripts of testdata/status: npubroker status
// and usage as a user types them, against a real broker, with the
// commands of harness.ScriptParams (broker start, broker kill, hold,
// release, awaitfree).
func TestStatusScripts(t *testing.T) {
	testscript.Run(t, harness.ScriptParams(t, filepath.Join("testdata", "status")))
}
