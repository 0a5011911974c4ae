// Package lease tests leases end to end: npurun and the broker's grants,
// queue, release, drain, reload, shares and sub-leases, with the built
// binaries against a real broker on a real Unix socket, real flock and real
// /proc; mutual exclusion is checked by the workload's own markers.
package lease

import (
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
