package bench

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
)

// benchGoFloorSource is a Go program that does nothing but exec /bin/true.
const benchGoFloorSource = `package main

import "syscall"

func main() { syscall.Exec("/bin/true", []string{"/bin/true"}, nil) }
`

// benchStamperSource writes the time (Unix ns) into the file it is given,
// as the first thing it does: a command whose start is all there is to it.
const benchStamperSource = `#include <stdio.h>
#include <time.h>
int main(int argc, char **argv) {
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	FILE *f = argc > 1 ? fopen(argv[1], "w") : NULL;
	if (!f) return 1;
	fprintf(f, "%lld\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
	return fclose(f) != 0;
}
`

// benchPeers are the programs built for the comparisons, once per run, in
// a directory every user can read.
type benchPeers struct {
	GoFloor string   // the Go program that execs /bin/true
	Stamp   []string // argv prefix of the stamping command: STAMP FILE
	Stamper string   // what Stamp is, for the tables
}

var benchPeersOnce = sync.OnceValues(func() (*benchPeers, error) {
	dir, err := os.MkdirTemp("", "npurun-peers-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	// Built as the Makefile builds npurun: static, -trimpath, no symbols.
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(benchGoFloorSource), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module gofloor\n\ngo 1.21\n"), 0o644); err != nil {
		return nil, err
	}
	p := &benchPeers{GoFloor: filepath.Join(dir, "gofloor")}
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", p.GoFloor, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the Go floor program: %v\n%s", err, out)
	}
	// The stamper in C, static where the C library allows; without a C
	// compiler, a shell and date(1), slower by their own start.
	src := filepath.Join(dir, "stamp.c")
	if err := os.WriteFile(src, []byte(benchStamperSource), 0o644); err != nil {
		return nil, err
	}
	stamp := filepath.Join(dir, "stamp")
	for _, flags := range [][]string{{"-static"}, nil} {
		args := append(append([]string{"-O2"}, flags...), "-o", stamp, src)
		if exec.Command("cc", args...).Run() == nil {
			p.Stamp, p.Stamper = []string{stamp}, "a C program ("+strings.TrimSpace("cc -O2 "+strings.Join(flags, " "))+")"
			break
		}
	}
	if p.Stamp == nil {
		p.Stamp, p.Stamper = []string{"sh", "-c", `exec date +%s%N > "$1"`, "sh"}, "sh -c 'exec date +%s%N' (no C compiler)"
	}
	return p, nil
})

func peers(b *testing.B) *benchPeers {
	b.Helper()
	p, err := benchPeersOnce()
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// stampArgs is the stamping command for file.
func (p *benchPeers) stampArgs(file string) []string {
	return append(append([]string(nil), p.Stamp...), file)
}

// benchTsp is a task-spooler server of the benchmark's own: its socket and
// its jobs' output files in a temporary directory, one slot; killed when
// the benchmark ends.
type benchTsp struct {
	env []string
}

// startTsp starts tsp's server with one slot. Without tsp (Debian:
// task-spooler) the benchmark is skipped, or fails under CI=true, where
// .ci/run installs it.
func startTsp(b *testing.B) *benchTsp {
	b.Helper()
	if _, err := exec.LookPath("tsp"); err != nil {
		if os.Getenv("CI") == "true" {
			b.Fatal("tsp not found, and CI=true: install task-spooler (.ci/run does)")
		}
		b.Skip("tsp not found: install task-spooler (Debian, Ubuntu) to compare with it")
	}
	dir := harness.SharedDir(b)
	ts := &benchTsp{env: append(os.Environ(), "TS_SOCKET="+filepath.Join(dir, "socket"), "TMPDIR="+dir, "TS_MAXFINISHED=1000")}
	ts.run(b, "-S", "1") // starts the server
	b.Cleanup(func() { ts.cmd("-K").Run() })
	return ts
}

func (ts *benchTsp) cmd(args ...string) *exec.Cmd {
	cmd := exec.Command("tsp", args...)
	cmd.Env = ts.env
	return cmd
}

// run runs tsp ARGS and returns its standard output.
func (ts *benchTsp) run(b *testing.B, args ...string) string {
	b.Helper()
	out, err := ts.cmd(args...).Output()
	if err != nil {
		b.Fatalf("tsp %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

// jobID reads the job id tsp prints when it queues a command.
func tspJobID(b *testing.B, out string) string {
	b.Helper()
	id := strings.TrimSpace(out)
	if _, err := strconv.Atoi(id); err != nil {
		b.Fatalf("tsp said %q, not a job id", out)
	}
	return id
}

// wait waits for job id to end.
func (ts *benchTsp) wait(b *testing.B, id string) {
	b.Helper()
	if err := ts.cmd("-w", id).Run(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) { // -w exits with the job's status
			b.Fatalf("tsp -w %s: %v", id, err)
		}
	}
}

// benchSide is one side of a comparison: a name and what takes a sample.
type benchSide struct {
	name   string
	sample func() time.Duration
	got    []time.Duration
}

// benchInterleave takes n samples of each side, one of each per round, the
// order rotated every round.
func benchInterleave(n int, sides ...*benchSide) {
	for i := range n {
		for j := range sides {
			s := sides[(i+j)%len(sides)]
			s.got = append(s.got, s.sample())
		}
	}
}

// row is the side's p10, p50 and p90 in ms, after its name.
func (s *benchSide) row() []string {
	return []string{s.name, benchF3(benchQuantile(s.got, .1)), benchF3(benchQuantile(s.got, .5)), benchF3(benchQuantile(s.got, .9))}
}

func (s *benchSide) p50() time.Duration { return benchQuantile(s.got, .5) }

// ratio is a's p50 over b's, as "1.23×".
func ratio(a, b *benchSide) string {
	return fmt.Sprintf("%.2f×", float64(a.p50())/float64(b.p50()))
}

// benchSubmit runs a submitting command (task-submit, tsp) whose job will
// stamp a file when it starts, and returns when it was started and what
// it printed.
func benchSubmit(b *testing.B, cmd *exec.Cmd) (time.Time, string) {
	b.Helper()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	t0 := time.Now()
	if err := cmd.Run(); err != nil {
		b.Fatalf("%v: %v\n%s", cmd.Args, err, errb.String())
	}
	return t0, out.String()
}

// benchSince is the time from t0 to the stamp in file.
func benchSince(b *testing.B, t0 time.Time, file string) time.Duration {
	return time.Duration(benchReadStamp(b, file) - t0.UnixNano())
}

// benchTrue is the machine's /bin/true: fork, exec and exit, from here.
func benchTrue(b *testing.B) time.Duration {
	return benchTimeRun(b, exec.Command("/bin/true"))
}
