// Package board tests npuboard end to end: a live broker on fake devices,
// npuboards as each other's peers, and the page in headless Chromium.
package board

import (
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
