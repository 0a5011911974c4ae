// Package status tests what the broker reports: npubroker status (text,
// --json, the scripts in testdata/status), usage accounting, metrics and
// the log.
package status

import (
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
