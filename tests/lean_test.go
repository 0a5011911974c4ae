package tests

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestNpurunImportsLean: npurun starts in front of every job, and every
// package it links is initialised at every start. It speaks the lease
// exchange with a codec of its own and parses its command line by hand;
// these must not come back into its import graph (issue 9): if one must,
// say why here.
func TestNpurunImportsLean(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/npurun/npurun/cmd/npurun").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	for _, banned := range []string{
		"encoding/json",                // the lease exchange has its own codec (broker/client/codec.go)
		"net",                          // raw socket calls (broker/client/conn.go)
		"flag",                         // the command line is parsed by hand (shim/args.go)
		"github.com/spf13/pflag",       // likewise
		"encoding/csv",                 // pflag's
		"github.com/prometheus/procfs", // the broker's
		"github.com/npurun/npurun/broker/client/jsoncodec",
		"github.com/npurun/npurun/policy",
	} {
		if slices.Contains(deps, banned) {
			t.Errorf("npurun links %s again", banned)
		}
	}
}
