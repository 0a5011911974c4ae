package cli

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
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
		"encoding/json",                // the lease exchange has its own codec (wire/codec.go)
		"net",                          // raw socket calls (wire/conn.go)
		"flag",                         // the command line is parsed by hand (shim/args.go)
		"github.com/spf13/pflag",       // likewise
		"encoding/csv",                 // pflag's
		"github.com/prometheus/procfs", // the broker's
		"github.com/npurun/npurun/wire/jsoncodec",
		"github.com/npurun/npurun/policy",
	} {
		if slices.Contains(deps, banned) {
			t.Errorf("npurun links %s again", banned)
		}
	}
}

// TestTaskSubmitImportsLean: task-submit starts in front of every task;
// it parses its command line by hand (cmd/task-submit/cli/args.go), since
// pflag brings net, flag and encoding/csv, whose initialisation costs
// 0.6 to 0.9 ms of its start (issue 9). encoding/json stays for the
// listings and --json; the submission itself goes through the hand codec.
func TestTaskSubmitImportsLean(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/npurun/npurun/cmd/task-submit").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	for _, banned := range []string{"net", "flag", "github.com/spf13/pflag", "encoding/csv", "github.com/prometheus/procfs"} {
		if slices.Contains(deps, banned) {
			t.Errorf("task-submit links %s again", banned)
		}
	}
}

// TestNpurunLinksNoScriptWriters: npurun reads its options from the table
// that the completion scripts are made of, but has task-submit write its
// script (npurun --completion SHELL becomes task-submit __script npurun
// SHELL): linked into npurun, the writers' 100 kB of code made every start
// some 50 µs (1.5%) slower (issue 20.6).
func TestNpurunLinksNoScriptWriters(t *testing.T) {
	b := harness.Bins(t)
	out, err := exec.Command("go", "tool", "nm", b.Npurun).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool nm: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "internal/completion.Help") {
		t.Fatalf("npurun has no internal/completion.Help: is it built without symbols?")
	}
	for _, sym := range []string{"internal/completion.Script", "internal/completion.bash", "internal/completion.zsh", "internal/completion.fish"} {
		if strings.Contains(string(out), sym+"\n") || strings.Contains(string(out), sym+".") {
			t.Errorf("npurun links %s", sym)
		}
	}
}

// TestSlurmScriptImportsLean: npurun-slurm is slurmd's Prolog and Epilog,
// run twice for every Slurm job with devices, and its start is part of
// every such job's (srun waits for the Prolog): the lease exchange's
// codec, no encoding/json, no configuration file.
func TestSlurmScriptImportsLean(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/npurun/npurun/cmd/npurun-slurm").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	for _, banned := range []string{"encoding/json", "net", "flag", "github.com/spf13/pflag", "github.com/prometheus/procfs",
		"github.com/npurun/npurun/wire/jsoncodec", "github.com/npurun/npurun/policy", "github.com/BurntSushi/toml"} {
		if slices.Contains(deps, banned) {
			t.Errorf("npurun-slurm links %s", banned)
		}
	}
}
