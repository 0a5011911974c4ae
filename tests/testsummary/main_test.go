package main

import (
	"strings"
	"testing"
)

func TestSummarize(t *testing.T) {
	// A stream as `go test -json ./... 2>&1` writes it, cut down: a
	// package with a skipped and a failed test, one that passes, one
	// without tests, and a line of the go command's own.
	const in = `{"Action":"start","Package":"p/a"}
{"Action":"run","Package":"p/a","Test":"TestSkip"}
{"Action":"output","Package":"p/a","Test":"TestSkip","Output":"=== RUN   TestSkip\n"}
{"Action":"output","Package":"p/a","Test":"TestSkip","Output":"    a_test.go:6: needs root (run as root, or in CI)\n"}
{"Action":"output","Package":"p/a","Test":"TestSkip","Output":"--- SKIP: TestSkip (0.00s)\n"}
{"Action":"skip","Package":"p/a","Test":"TestSkip"}
{"Action":"run","Package":"p/a","Test":"TestPass"}
{"Action":"output","Package":"p/a","Test":"TestPass","Output":"=== RUN   TestPass\n"}
{"Action":"output","Package":"p/a","Test":"TestPass","Output":"--- PASS: TestPass (0.00s)\n"}
{"Action":"pass","Package":"p/a","Test":"TestPass"}
{"Action":"run","Package":"p/a","Test":"TestFail"}
{"Action":"output","Package":"p/a","Test":"TestFail","Output":"=== RUN   TestFail\n"}
{"Action":"output","Package":"p/a","Test":"TestFail","Output":"    a_test.go:9: boom\n"}
{"Action":"output","Package":"p/a","Test":"TestFail","Output":"--- FAIL: TestFail (0.00s)\n"}
{"Action":"fail","Package":"p/a","Test":"TestFail"}
{"Action":"output","Package":"p/a","Output":"FAIL\n"}
{"Action":"output","Package":"p/a","Output":"FAIL\tp/a\t0.020s\n"}
{"Action":"fail","Package":"p/a"}
{"Action":"start","Package":"p/ok"}
{"Action":"run","Package":"p/ok","Test":"TestOK"}
{"Action":"output","Package":"p/ok","Test":"TestOK","Output":"--- PASS: TestOK (0.00s)\n"}
{"Action":"pass","Package":"p/ok","Test":"TestOK"}
{"Action":"output","Package":"p/ok","Output":"PASS\n"}
{"Action":"output","Package":"p/ok","Output":"ok  \tp/ok\t0.009s\n"}
{"Action":"pass","Package":"p/ok"}
# p/broken
{"Action":"output","Package":"p/none","Output":"?   \tp/none\t[no test files]\n"}
{"Action":"skip","Package":"p/none"}
`
	const want = `    a_test.go:6: needs root (run as root, or in CI)
--- SKIP: TestSkip (0.00s)
=== RUN   TestFail
    a_test.go:9: boom
--- FAIL: TestFail (0.00s)
FAIL
FAIL	p/a	0.020s
ok  	p/ok	0.009s
# p/broken
?   	p/none	[no test files]
`
	var out strings.Builder
	failed, err := summarize(strings.NewReader(in), &out)
	if err != nil {
		t.Fatal(err)
	}
	if !failed {
		t.Error("failed = false, want true: TestFail failed")
	}
	if out.String() != want {
		t.Errorf("summary:\n%s\nwant:\n%s", out.String(), want)
	}

	// Only passes and skips: not failed.
	i := strings.Index(in, `{"Action":"start","Package":"p/ok"}`)
	out.Reset()
	if failed, err := summarize(strings.NewReader(in[i:]), &out); err != nil || failed {
		t.Errorf("passing packages: failed = %v, %v; want false", failed, err)
	}
	// A package cut off without its verdict (go test killed) fails.
	cut := strings.Index(in, `{"Action":"fail","Package":"p/a"}`)
	out.Reset()
	if failed, _ := summarize(strings.NewReader(in[:cut]), &out); !failed || !strings.Contains(out.String(), "FAIL\tp/a") {
		t.Errorf("cut-off package: failed = %v, output:\n%s", failed, out.String())
	}
}
