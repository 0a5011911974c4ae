// Package containers tests containers end to end: a dockerd and Podman of
// the tests' own, npurun-runtime and the broker's hand-over of a lease to a
// container.
package containers

import (
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
