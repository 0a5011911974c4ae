// Package slurm tests npurun under Slurm: a private slurmctld and slurmd in
// a temporary directory, the SPANK plugin, the Prolog and Epilog, and a
// broker that takes its devices from Slurm.
package slurm

import (
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
