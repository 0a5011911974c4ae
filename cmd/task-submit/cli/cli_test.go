package cli

import (
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/npurun/npurun/wire"
)

func TestParseSubmit(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want wire.Submission
	}{
		{"run", []string{"--run", "python train.py --lr 3e-4"},
			wire.Submission{Shell: "python train.py --lr 3e-4"}},
		{"argv", []string{"-n", "2", "--time", "6h", "--name", "big", "--", "torchrun", "--nproc_per_node=2", "train.py"},
			wire.Submission{Argv: []string{"torchrun", "--nproc_per_node=2", "train.py"}, N: 2, TimeSec: 6 * 3600, Name: "big"}},
		{"device", []string{"--device", "9", "--run", "python probe.py"},
			wire.Submission{Shell: "python probe.py", Devices: []int{9}}},
		{"devices with matching count", []string{"-n", "2", "-d", "2,3", "--run", "x"},
			wire.Submission{Shell: "x", N: 2, Devices: []int{2, 3}}},
		{"device ranges as in the config", []string{"-d", "8,0-3", "--run", "x"},
			wire.Submission{Shell: "x", Devices: []int{0, 1, 2, 3, 8}}},
		{"repeated and overlapping", []string{"-d", "2-3", "-d", "3,5", "--run", "x"},
			wire.Submission{Shell: "x", Devices: []int{2, 3, 5}}},
		{"a count with a leading zero is decimal", []string{"-n", "010", "--run", "x"},
			wire.Submission{Shell: "x", N: 10}},
		{"no device", []string{"--no-device", "--run", "make build"},
			wire.Submission{Shell: "make build", NoDevice: true}},
		{"after", []string{"--after", "118,7", "--after", "9", "--run", "python eval.py"},
			wire.Submission{Shell: "python eval.py", After: []uint64{118, 7, 9}}},
		{"pool and log", []string{"-p", "queue", "--log", "out.log", "--", "true"},
			wire.Submission{Argv: []string{"true"}, Pool: "queue", Log: "out.log"}},
		{"time rounds up to seconds", []string{"--time", "1500ms", "--run", "x"},
			wire.Submission{Shell: "x", TimeSec: 2}},
		{"time in days", []string{"--time", "1d12h", "--run", "x"},
			wire.Submission{Shell: "x", TimeSec: 36 * 3600}},
		{"time of a century, the longest", []string{"--time", "36500d", "--run", "x"},
			wire.Submission{Shell: "x", TimeSec: 100 * 365 * 24 * 3600}},
		{"time of a century, the longest", []string{"--time", "876000h", "--run", "x"},
			wire.Submission{Shell: "x", TimeSec: 100 * 365 * 24 * 3600}},
		{"command flags are the command's", []string{"--", "ls", "-n", "--json"},
			wire.Submission{Argv: []string{"ls", "-n", "--json"}}},
		{"a subcommand's name after --", []string{"--", "list"},
			wire.Submission{Argv: []string{"list"}}},
		{"values attached", []string{"-n2", "-d0-1", "--time=1m", "--name=a=b", "--after=3,4", "--log=l", "--", "x"},
			wire.Submission{Argv: []string{"x"}, N: 2, Devices: []int{0, 1}, TimeSec: 60, Name: "a=b", After: []uint64{3, 4}, Log: "l"}},
		{"pool attached", []string{"-pqueue", "--run=x"},
			wire.Submission{Shell: "x", Pool: "queue"}},
		{"a switch set and unset", []string{"--no-device=true", "--no-device=false", "--run", "x"},
			wire.Submission{Shell: "x"}},
		{"a value that looks like an option", []string{"--name", "--json", "--log", "-", "--", "x"},
			wire.Submission{Argv: []string{"x"}, Name: "--json", Log: "-"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parse(tt.args, io.Discard)
			if err != nil {
				t.Fatalf("parse(%q): %v", tt.args, err)
			}
			if o.cmd != "submit" {
				t.Fatalf("parse(%q).cmd = %q, want submit", tt.args, o.cmd)
			}
			if !reflect.DeepEqual(o.sub, tt.want) {
				t.Errorf("parse(%q).sub = %+v, want %+v", tt.args, o.sub, tt.want)
			}
		})
	}
}

func TestParseUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // the message, or a part of it
	}{
		{"nothing", nil, "no command given"},
		{"bare dash", []string{"--"}, "no command given"},
		{"both forms", []string{"--run", "x", "--", "y"}, "--run and a command after -- exclude each other"},
		{"empty run", []string{"--run", " "}, "--run takes a command line"},
		{"no dash", []string{"python", "train.py"}, `unknown command "python"`},
		{"run unquoted", []string{"--run", "python", "train.py"}, `--run takes one string, and "train.py" follows it`},
		{"no device with count", []string{"--no-device", "-n", "2", "--run", "x"}, "--no-device takes no device, count or pool"},
		{"no device with device", []string{"--no-device", "-d", "1", "--run", "x"}, "--no-device takes no device, count or pool"},
		{"no device with pool", []string{"--no-device", "-p", "queue", "--run", "x"}, "--no-device takes no device, count or pool"},
		{"device with pool", []string{"-d", "1", "-p", "queue", "--run", "x"}, "--device and --pool exclude each other"},
		{"count mismatch", []string{"-n", "3", "-d", "1,2", "--run", "x"}, "-n 3 does not match the 2 devices named"},
		{"count mismatch with one", []string{"-n", "3", "-d", "1", "--run", "x"}, "-n 3 does not match the 1 device named"},
		{"negative count", []string{"-n", "-1", "--run", "x"}, "bad device count -1"},
		{"zero count", []string{"-n", "0", "--run", "x"}, "bad device count 0: -n takes 1 or more"},
		{"no device with zero count", []string{"--no-device", "-n", "0", "--run", "x"}, "--no-device takes no device, count or pool"},
		{"negative device", []string{"-d", "-1", "--run", "x"}, `bad device list "-1": negative device id "-1"`},
		{"not a device list", []string{"-d", "0-x", "--run", "x"}, `bad device list "0-x": "0-x" is not a range of device ids`},
		{"backwards range", []string{"-d", "3-1", "--run", "x"}, `bad device list "3-1": range "3-1" runs backwards`},
		{"range count mismatch", []string{"-n", "2", "-d", "0-3", "--run", "x"}, "-n 2 does not match the 4 devices named"},
		{"zero time", []string{"--time", "0s", "--run", "x"}, "--time takes a positive duration"},
		{"negative time", []string{"--time", "-1h", "--run", "x"}, `bad duration "-1h" for --time: negative`},
		{"bad time", []string{"--time", "6", "--run", "x"}, `bad duration "6" for --time: no unit after 6 (d, h, m, s or ms)`},
		{"time in an unknown unit", []string{"--time", "1y", "--run", "x"}, `bad duration "1y" for --time: unknown unit "y" (d, h, m, s or ms)`},
		// Rounded up to seconds, the largest durations wrapped negative.
		{"time at the end of int64", []string{"--time", "2562047h47m16s", "--run", "x"}, `bad duration "2562047h47m16s" for --time: longer than 36500d, the most`},
		{"time beyond int64", []string{"--time", "3000000h", "--run", "x"}, `bad duration "3000000h" for --time: longer than 292 years`},
		{"empty time", []string{"--time=", "--run", "x"}, `bad duration "" for --time: empty`},
		{"time a second past a century", []string{"--time", "876000h1s", "--run", "x"}, `bad duration "876000h1s" for --time: longer than 36500d, the most`},
		{"bad after", []string{"--after", "abc", "--run", "x"}, `--after: bad task id "abc"`},
		{"empty log", []string{"--log", "", "--run", "x"}, "--log takes a file name"},
		{"name with newline", []string{"--name", "a\nb", "--run", "x"}, "--name takes one line"},
		{"unknown flag", []string{"--frobnicate", "--run", "x"}, "unknown option --frobnicate"},
		{"submit flag before list", []string{"-n", "2", "list"}, "--devices is for submitting, not for list"},
		{"list with argument", []string{"list", "118"}, "list takes no arguments"},
		{"show without id", []string{"show"}, "show takes one task id"},
		{"wait with two ids", []string{"wait", "1", "2"}, "wait takes one task id"},
		{"bad id", []string{"show", "abc"}, `bad task id "abc"`},
		{"zero id", []string{"cancel", "0"}, `bad task id "0"`},
		{"negative id", []string{"logs", "--", "-5"}, `bad task id "-5"`},
		{"json for wait", []string{"--json", "wait", "1"}, "wait takes no --json"},
		{"all for show", []string{"show", "--all", "1"}, "unknown option --all"},
		{"unknown short", []string{"-x", "--run", "x"}, "unknown option -x"},
		{"unknown short in a group", []string{"logs", "-fz", "1"}, "unknown option -z"},
		{"missing value", []string{"--run"}, "option --run needs a value"},
		{"missing short value", []string{"-n"}, "option -n needs a value"},
		{"bad count", []string{"-n", "two", "--run", "x"}, `bad device count "two" for -n`},
		{"hexadecimal count", []string{"-n", "0x2", "--run", "x"}, `bad device count "0x2" for -n`},
		{"bad switch", []string{"--json=maybe", "--run", "x"}, `option --json takes no value (or =true, =false), not "maybe"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(tt.args, io.Discard)
			var ue *usageError
			if !errors.As(err, &ue) {
				t.Fatalf("parse(%q) = %v, want a usage error", tt.args, err)
			}
			if !strings.Contains(ue.msg, tt.want) {
				t.Errorf("parse(%q) = %q, want %q in it", tt.args, ue.msg, tt.want)
			}
		})
	}
}

func TestParseCommands(t *testing.T) {
	tests := []struct {
		args []string
		want options
	}{
		{[]string{"list"}, options{cmd: "list"}},
		{[]string{"list", "--all", "--json"}, options{cmd: "list", all: true, json: true}},
		{[]string{"--json", "list"}, options{cmd: "list", json: true}},
		{[]string{"--socket", "/tmp/b.sock", "list"}, options{cmd: "list", socket: "/tmp/b.sock"}},
		{[]string{"list", "--socket=/tmp/b.sock"}, options{cmd: "list", socket: "/tmp/b.sock"}},
		{[]string{"show", "118"}, options{cmd: "show", id: 118}},
		{[]string{"show", "118", "--json"}, options{cmd: "show", id: 118, json: true}},
		{[]string{"logs", "-f", "118"}, options{cmd: "logs", id: 118, follow: true}},
		{[]string{"logs", "118"}, options{cmd: "logs", id: 118}},
		{[]string{"wait", "118"}, options{cmd: "wait", id: 118}},
		{[]string{"cancel", "18446744073709551615"}, options{cmd: "cancel", id: 1<<64 - 1}},
		{[]string{"--version"}, options{cmd: "submit", version: true}},
		{[]string{"list", "--json=false", "--all=true"}, options{cmd: "list", all: true}},
		{[]string{"logs", "118", "-f"}, options{cmd: "logs", id: 118, follow: true}},
		{[]string{"show", "--", "118"}, options{cmd: "show", id: 118}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			o, err := parse(tt.args, io.Discard)
			if err != nil {
				t.Fatalf("parse(%q): %v", tt.args, err)
			}
			if !reflect.DeepEqual(*o, tt.want) {
				t.Errorf("parse(%q) = %+v, want %+v", tt.args, *o, tt.want)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"list", "--help"}, {"logs", "-h"}} {
		var b strings.Builder
		_, err := parse(args, &b)
		if !errors.Is(err, errHelp) {
			t.Errorf("parse(%q) = %v, want errHelp", args, err)
		}
		if !strings.HasPrefix(b.String(), usage) {
			t.Errorf("parse(%q) printed %q, want the usage first", args, b.String())
		}
	}
}

func TestParseID(t *testing.T) {
	tests := []struct {
		in      string
		want    uint64
		wantErr string
	}{
		{"118", 118, ""},
		{"1", 1, ""},
		{"abc", 0, `bad task id "abc"`},
		{"", 0, `bad task id ""`},
		{"0", 0, `bad task id "0"`},
		{"-1", 0, `bad task id "-1"`},
		{"+1", 0, `bad task id "+1"`},
		{"1.5", 0, `bad task id "1.5"`},
		{"18446744073709551616", 0, `bad task id "18446744073709551616"`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseID(tt.in)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("parseID(%q): %v", tt.in, err)
			case tt.wantErr != "" && (err == nil || err.Error() != tt.wantErr):
				t.Errorf("parseID(%q) = %d, %v, want error %q", tt.in, got, err, tt.wantErr)
			case got != tt.want:
				t.Errorf("parseID(%q) = %d, want %d", tt.in, got, tt.want)
			}
		})
	}
}

// The synopsis in --help is the man page's, word for word.
func TestManSynopsis(t *testing.T) {
	page, err := readManPage()
	if err != nil {
		t.Skipf("man page: %v", err)
	}
	var synopsis []string
	for _, line := range strings.Split(usage, "\n")[1:] {
		if line == "" {
			break
		}
		synopsis = append(synopsis, strings.TrimSpace(line))
	}
	got := manSynopsis(page)
	if !reflect.DeepEqual(got, synopsis) {
		t.Errorf("man page synopsis:\n%s\nwant (from --help):\n%s", strings.Join(got, "\n"), strings.Join(synopsis, "\n"))
	}
}

// TestHelpOptions: --help lists the options of the table that parses them
// (completion.Help writes it, as it does npurun's), aligned as it was,
// without the hidden --completion.
func TestHelpOptions(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--help"}, `Options:
  -n, --devices N         number of devices (default 1)
  -d, --device LIST       exactly these devices: a LIST of physical ids and ranges, such as 3 or 0-3,8 (may be repeated)
      --no-device         take no device; run when a CPU slot is free
      --cpus N            through a cluster's Slurm ([cluster]): CPUs for the task (--cpus-per-task)
  -p, --pool POOL         pool to take devices from (default: the policy's default pool)
  -m, --mem SIZE          a share of each device, of SIZE of its memory (12G, 512M; a bare number is GiB)
      --oom-retries N     with --mem: submit the task again, up to N times, if it fails out of device memory, declaring 1.25x its peak
      --time DURATION     time limit, e.g. 6h, 90m or 1d, after which the task is killed (default: the policy's)
      --name NAME         name to list the task by instead of its command
      --after ID[,ID...]  start only once these tasks have succeeded
      --log FILE          log file (default ~/.local/state/npurun/tasks/ID-TAG.log, TAG naming the broker's journal)
      --run STRING        command line run by your shell, instead of -- COMMAND [ARG...]
      --notify CMD        command line run by /bin/sh as you once the task has ended, with NPURUN_TASK_ID, NPURUN_TASK_STATE and NPURUN_TASK_EXIT set (default: the policy's [tasks] notify)
      --no-notify         run no notify command, not even the policy's
      --token TOKEN       name this submission (default: a random one): submitted again with the same TOKEN, it makes no second task
      --json              print the task's id, position and pool as JSON
      --socket PATH       broker socket (default $NPURUN_SOCKET or /run/npurun/broker.sock)
      --version           print the version and exit
  -h, --help              print this help and exit
`},
		{[]string{"list", "--help"}, `Options:
      --all             everyone's tasks (others' commands as npubroker status shows them)
      --ended           the tasks that have ended: those the broker keeps, then those its accounting log remembers
      --since DURATION  with --ended: those that ended within DURATION, e.g. 7d or 12h (default 7d)
      --json            print the tasks as a JSON array
      --socket PATH     broker socket (default $NPURUN_SOCKET or /run/npurun/broker.sock)
  -h, --help            print this help and exit
`},
	} {
		var b strings.Builder
		if _, err := parse(tt.args, &b); !errors.Is(err, errHelp) {
			t.Fatalf("parse(%q) = %v, want errHelp", tt.args, err)
		}
		if _, got, _ := strings.Cut(b.String(), "\nOptions:\n"); "Options:\n"+got != tt.want {
			t.Errorf("%q printed:\n%s\nwant:\n%s", tt.args, "Options:\n"+got, tt.want)
		}
	}
}

// TestParseCompletion: --completion SHELL asks for a script, of a shell
// there is one for, and needs no command.
func TestParseCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish"} {
		o, err := parse([]string{"--completion", shell}, io.Discard)
		if err != nil || o.completion != shell {
			t.Errorf("--completion %s: %+v, %v", shell, o, err)
		}
	}
	var ue *usageError
	if _, err := parse([]string{"--completion=ksh"}, io.Discard); !errors.As(err, &ue) || ue.msg != `--completion takes bash, zsh or fish, not "ksh"` {
		t.Errorf("--completion=ksh: %v", err)
	}
}
