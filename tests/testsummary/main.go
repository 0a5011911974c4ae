// Command testsummary turns `go test -json` into what `make test` prints: each package's verdict line, every skipped test with its reason, and the whole output of every failed test.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// event is one line of `go test -json` (see `go doc cmd/test2json`).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string // build-output, build-fail
}

// Usage: go test -json ./... 2>&1 | go run ./tests/testsummary
//
// The exit status is 1 when a test, a package or a build failed, else 0
// (the Makefile also keeps go test's own status with pipefail). Lines that
// are not JSON events (the go command's own errors) pass through as they
// are. Verdict lines keep go test's form ("ok  \tpkg\t1.2s", "FAIL\tpkg"),
// which .ci/run counts.
func main() {
	failed, err := summarize(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testsummary: %v\n", err)
		os.Exit(1)
	}
	if failed {
		os.Exit(1)
	}
}

// summarize reads events from r and writes the summary to w. It reports
// whether anything failed.
func summarize(r io.Reader, w io.Writer) (bool, error) {
	out := bufio.NewWriter(w)
	defer out.Flush()
	type key struct{ pkg, test string }
	// Output held until its test or package ends; a test's lines go into
	// its package's when the test fails, to keep a failed package's
	// output whole.
	held := make(map[key][]string)
	failed := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil || e.Action == "" {
			fmt.Fprintf(out, "%s\n", line)
			out.Flush()
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "output":
			held[k] = append(held[k], e.Output)
		case "build-output":
			fmt.Fprint(out, e.Output)
		case "build-fail":
			failed = true
		case "skip":
			if e.Test != "" {
				// "--- SKIP: TestX (0.00s)" and the reason it logged.
				for _, s := range held[k] {
					if !strings.HasPrefix(s, "=== ") {
						fmt.Fprint(out, s)
					}
				}
			} else {
				printVerdict(out, held[k]) // "?   \tpkg\t[no test files]"
			}
			delete(held, k)
		case "pass":
			if e.Test == "" {
				printVerdict(out, held[k])
				out.Flush()
			}
			delete(held, k)
		case "fail":
			failed = true
			if e.Test != "" {
				for _, s := range held[k] {
					fmt.Fprint(out, s)
				}
				delete(held, k)
				continue
			}
			// The package: everything it printed outside its tests (a
			// panic, a timeout, a build error), then its verdict.
			for _, s := range held[k] {
				fmt.Fprint(out, s)
			}
			delete(held, k)
			out.Flush()
		}
	}
	if err := sc.Err(); err != nil {
		return true, err
	}
	// Output of tests or packages that never ended (go test killed).
	for k, lines := range held {
		if len(lines) > 0 && k.test == "" {
			failed = true
			for _, s := range lines {
				fmt.Fprint(out, s)
			}
		}
	}
	return failed, nil
}

// printVerdict writes the verdict lines of a package that did not fail:
// "ok  \tpkg\t1.2s" or "?   \tpkg\t[no test files]", and nothing else of
// its own output ("PASS", coverage).
func printVerdict(w io.Writer, lines []string) {
	for _, s := range lines {
		if strings.HasPrefix(s, "ok ") || strings.HasPrefix(s, "?") {
			fmt.Fprint(w, s)
		}
	}
}
