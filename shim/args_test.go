package shim

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestParseArgs: npurun's grammar is getopt's, and what it read is what
// was meant.
func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want Options
		argv []string
	}{
		{[]string{"python", "train.py", "-n", "2"}, Options{}, []string{"python", "train.py", "-n", "2"}},
		{[]string{"-n", "2", "python"}, Options{N: 2}, []string{"python"}},
		{[]string{"-n2", "--", "-x"}, Options{N: 2}, []string{"-x"}},
		{[]string{"--devices=3", "sh"}, Options{N: 3}, []string{"sh"}},
		{[]string{"-d", "3", "-d0-1,8", "--device=1", "sh"}, Options{Devices: []int{0, 1, 3, 8}}, []string{"sh"}},
		{[]string{"-vq", "--no-wait", "-p", "queue", "sh"}, Options{Verbose: true, Quiet: true, NoWait: true, Pool: "queue"}, []string{"sh"}},
		{[]string{"--timeout", "10m", "--socket=/s", "sh"}, Options{Timeout: 10 * time.Minute, Socket: "/s"}, []string{"sh"}},
		{[]string{"--timeout", "1d12h", "sh"}, Options{Timeout: 36 * time.Hour}, []string{"sh"}},
		{[]string{"--no-device", "make", "-j8"}, Options{NoDevice: true}, []string{"make", "-j8"}},
		{[]string{"--login", "-q"}, Options{Login: true, Quiet: true}, []string{}},
		{[]string{"-", "x"}, Options{}, []string{"-", "x"}},
	} {
		cmd, err := parseArgs(tc.args)
		if err != nil {
			t.Errorf("parseArgs(%q): %v", tc.args, err)
			continue
		}
		if !reflect.DeepEqual(cmd.o, tc.want) || !reflect.DeepEqual(cmd.argv, tc.argv) {
			t.Errorf("parseArgs(%q) = %+v %q, want %+v %q", tc.args, cmd.o, cmd.argv, tc.want, tc.argv)
		}
	}
}

// TestParseArgsRefuses: a bad command line is a usage error that says
// what is wrong.
func TestParseArgsRefuses(t *testing.T) {
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--frobnicate", "sh"}, "unknown option --frobnicate"},
		{[]string{"-x", "sh"}, "unknown option -x"},
		{[]string{"-n"}, "option -n needs a value"},
		{[]string{"--pool"}, "option --pool needs a value"},
		{[]string{"-n", "two", "sh"}, `bad device count "two" for -n`},
		{[]string{"-d", "0-3x", "sh"}, `bad device list "0-3x"`},
		{[]string{"--timeout=soon", "sh"}, `bad duration "soon" for --timeout: a number must come before "soon"`},
		{[]string{"--timeout=1y", "sh"}, `bad duration "1y" for --timeout: unknown unit "y" (d, h, m, s or ms)`},
		{[]string{"--timeout=-1m", "sh"}, `bad duration "-1m" for --timeout: negative`},
		{[]string{"--no-wait=yes", "sh"}, "option --no-wait takes no value"},
		{[]string{}, "no command given"},
		{[]string{"-n", "0", "sh"}, "bad device count 0"},
		{[]string{"-n", "-1", "sh"}, "bad device count -1"},
		{[]string{"-n", "2", "-d", "1", "sh"}, "-n 2 does not match the 1 device named"},
		{[]string{"-d", "1", "-p", "q", "sh"}, "--device and --pool exclude each other"},
		{[]string{"--no-device", "-n", "1", "sh"}, "--no-device takes no device"},
		{[]string{"--timeout", "1m", "--no-wait", "sh"}, "--timeout takes a positive duration"},
		{[]string{"--login", "sh"}, "--login takes no command"},
	} {
		cmd, err := parseArgs(tc.args)
		if err == nil {
			err = cmd.check()
		}
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(ue.msg, tc.msg) {
			t.Errorf("npurun %q: %v, want a usage error saying %q", tc.args, err, tc.msg)
		}
	}
	if _, err := parseArgs([]string{"-vh"}); !errors.Is(err, errHelp) {
		t.Errorf("-vh: %v, want help", err)
	}
}

// TestUsage: --help, its list of options written from the table that
// parses them, reads as it did when it was written out by hand (the man
// page's SYNOPSIS follows the usage lines; tests/docs/man_test.go).
func TestUsage(t *testing.T) {
	want := `Usage:
  npurun [-n N | -d LIST] [-p POOL] [-m SIZE] [--no-wait] [--timeout DURATION] [--time DURATION] [-v | -q] [--socket PATH] [--] COMMAND [ARG...]
  npurun [-n N | -d LIST] [-p POOL] [-m SIZE] [--no-wait] [--timeout DURATION] [--time DURATION] [-v | -q] [--socket PATH] [--container ENGINE] [--] docker|podman run [RUN-OPTION...] IMAGE [ARG...]
  npurun --no-device [--] COMMAND [ARG...]
  npurun --login [-q] [--socket PATH]
  npurun status [--json] [--watch] [--cluster] [--socket PATH]
  npurun usage [--since DUR] [--user USER] [--json] [--socket PATH]

Wait for free accelerator devices, lease them from npubroker, set
NPURUN_DEVICES and the vendor's visible-device variable, and become COMMAND.
The lease lasts until COMMAND and every process it started have exited.
A docker or podman run gets the lease in its container, with the devices'
nodes, and holds it for the container's life.

npurun status and npurun usage are npubroker's status and usage, for every
user: who holds which device, the line, unleased use; device-hours per user
(npurun status --help). To run a program named status: npurun -- status.

Options:
  -n, --devices N          number of devices (default 1)
  -d, --device LIST        exactly these devices: a LIST of physical ids and ranges,
                           such as 3 or 0-3,8; waits for them alone (may be repeated)
  -p, --pool POOL          pool to take devices from (default: the policy's default pool)
  -m, --mem SIZE           a share of each device, of SIZE of its memory (12G, 512M;
                           a bare number is GiB), on a device the policy shares
      --no-wait            fail at once with status 75 if nothing is free
      --timeout DURATION   give up after this long (e.g. 10m), with status 75
      --time DURATION      time limit of the lease (e.g. 30m): the command is sent SIGTERM
                           after it, SIGKILL after [tasks] kill_grace; lets it backfill
      --no-device          run without a lease, with every device hidden
      --container ENGINE   COMMAND is this engine's (docker or podman), whatever its name:
                           its run's container gets the lease (automatic for docker, podman)
      --login              become the login shell under the login lease (sshd's
                           ForceCommand for restricted accounts; see pam_npurun(8))
  -v, --verbose            report queue progress even when standard error is not a terminal
  -q, --quiet              report nothing while waiting
      --socket PATH        broker socket (default $NPURUN_SOCKET or /run/npurun/broker.sock)
      --version            print the version and exit
  -h, --help               print this help and exit
`
	if got := usage(); got != want {
		t.Errorf("--help:\n%s\nwant:\n%s", got, want)
	}
}

// TestParseCompletion: --completion SHELL asks for a script, of a shell
// there is one for.
func TestParseCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish"} {
		cmd, err := parseArgs([]string{"--completion", shell})
		if err != nil || cmd.completion != shell {
			t.Errorf("--completion %s: %+v, %v", shell, cmd, err)
		}
	}
	var ue *usageError
	if _, err := parseArgs([]string{"--completion=ksh"}); !errors.As(err, &ue) || !strings.Contains(ue.msg, `--completion takes bash, zsh or fish, not "ksh"`) {
		t.Errorf("--completion=ksh: %v", err)
	}
}
