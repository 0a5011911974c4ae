// Package tasks tests task-submit end to end: submission, the supervisor,
// task lives, faults, restarts, containment and privacy, as real users
// against a real broker.
package tasks

import (
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
