// Package bench holds the benchmarks make bench runs: grant latency next to
// flock(1), hand-over, throughput under contention, kill bursts, broker
// memory, Slurm allocation next to srun.
package bench

import (
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
