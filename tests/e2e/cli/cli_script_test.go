package cli

import (
	"path/filepath"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"
	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
)

// TestCLIScripts runs the scripts of testdata/cli: command lines of npurun,
// task-submit and npubroker as a user types them, with what each prints
// and its exit status, against a real broker where a script starts one.
// Each script's first line names the Go test it was. Besides the commands
// of harness.ScriptParams (broker start, broker kill, hold, release,
// awaitfree):
//
//	unixsocket [-listen] TYPE PATH   bind a Unix socket of TYPE (stream or seqpacket)
//	                                 at PATH, listening with -listen, open until the end
//
// A command that fails runs twice: `! exec CMD` for what it prints, then
// `exec sh -c 'CMD >/dev/null 2>&1; echo "exit $?"'` and `stdout '^exit N$'`
// for its status (testscript's exec tells 0 from not 0 only), as
// tests/e2e/status/testdata/status/errors.txtar does. `cmp stdout empty`
// is nothing at all on standard output.
func TestCLIScripts(t *testing.T) {
	p := harness.ScriptParams(t, filepath.Join("testdata", "cli"))
	p.Cmds["unixsocket"] = scriptUnixSocket
	testscript.Run(t, p)
}

func scriptUnixSocket(ts *testscript.TestScript, neg bool, args []string) {
	listen := len(args) > 0 && args[0] == "-listen"
	if listen {
		args = args[1:]
	}
	types := map[string]int{"stream": unix.SOCK_STREAM, "seqpacket": unix.SOCK_SEQPACKET}
	typ, ok := types[""]
	if len(args) == 2 {
		typ, ok = types[args[0]]
	}
	if neg || !ok {
		ts.Fatalf("usage: unixsocket [-listen] stream|seqpacket PATH")
	}
	fd, err := unix.Socket(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC, 0)
	ts.Check(err)
	ts.Defer(func() { unix.Close(fd) })
	ts.Check(unix.Bind(fd, &unix.SockaddrUnix{Name: ts.MkAbs(args[1])}))
	if listen {
		ts.Check(unix.Listen(fd, 1))
	}
}
