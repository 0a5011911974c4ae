// Package packaging tests what is installed: make install and uninstall,
// and the Debian packages built, installed, upgraded and purged
// (tests/packaging/deb_test.go, build tag debtest, make deb-test).
package packaging

import (
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
