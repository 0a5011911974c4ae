package cli

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/npurun/npurun/wire"
)

func TestParseSince(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want time.Duration
		err  string
	}{
		{in: "7d", want: 7 * 24 * time.Hour},
		{in: "2w", want: 14 * 24 * time.Hour},
		{in: "1d12h", want: 36 * time.Hour},
		{in: "90m", want: 90 * time.Minute},
		{in: "1.5d", want: 36 * time.Hour},
		{in: "", err: `bad duration "" for --since: empty`},
		{in: "0d", err: `bad duration "0d" for --since: must be more than 0`},
		{in: "7", err: `bad duration "7" for --since: no unit after 7`},
		{in: "d", err: `bad duration "d" for --since: a number must come before "d"`},
		{in: "7x", err: `bad duration "7x" for --since: unknown unit "x"`},
		{in: "-1d", err: `bad duration "-1d" for --since: negative`},
		{in: "999999d", err: "longer than 292 years"},
		{in: "40000d", err: `bad duration "40000d" for --since: more than a hundred years`},
	} {
		got, err := ParseSince(tt.in)
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("ParseSince(%q) = %v, %v; want error %q", tt.in, got, err, tt.err)
		case tt.err == "" && (err != nil || got != tt.want):
			t.Errorf("ParseSince(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func board(now time.Time) *wire.Board {
	ms := func(d time.Duration) int64 { return now.Add(-d).UnixMilli() }
	long := "python train.py --config " + strings.Repeat("very-long-", 20) + "end"
	return &wire.Board{
		Time: now.UnixMilli(), Vendor: "ascend",
		Devices: []wire.DeviceState{
			{ID: 0, Name: "npu0", Pool: "interactive", State: wire.DeviceLeased, Since: ms(2*time.Hour + 13*time.Minute),
				Lease: &wire.LeaseInfo{Kind: wire.KindInline, User: "alice", Holders: []wire.Holder{
					{PID: 4121, User: "alice", Command: long}, {PID: 4122, User: "alice", Command: "python worker"}}}},
			{ID: 1, Name: "npu1", Pool: "interactive", State: wire.DeviceFree},
			{ID: 4, Name: "npu4", Pool: "interactive", State: wire.DeviceLogin, Since: ms(12 * time.Minute),
				Lease: &wire.LeaseInfo{Kind: wire.KindLogin, User: "student", Service: "sshd", TTY: "pts/3", RHost: "10.0.0.5"}},
			{ID: 12, Name: "npu12", Pool: "queue", State: wire.DeviceTask, Since: ms(40 * time.Minute),
				Lease: &wire.LeaseInfo{Kind: wire.KindTask, Task: 118, User: "bob", Holders: []wire.Holder{{PID: 5120, User: "bob"}}}},
			{ID: 13, Name: "npu13", Pool: "queue", State: wire.DeviceReserved, Since: ms(3 * time.Minute),
				ReservedFor: &wire.WaiterInfo{Kind: wire.KindTask, Task: 121, User: "carol", N: 2}},
		},
		Waiting: []wire.Line{
			{Pool: "interactive", Count: 0, Waiters: []wire.WaiterInfo{}},
			{Pool: "queue", Count: 2, Waiters: []wire.WaiterInfo{
				{Position: 1, Kind: wire.KindTask, Task: 121, User: "carol", N: 2, Since: ms(4 * time.Minute), Start: ms(-30 * time.Minute)},
				{Position: 2, Kind: wire.KindInline, User: "dave", N: 1, Devices: []int{13}, Since: ms(time.Minute)},
			}},
		},
		Unleased: []wire.Unleased{{Device: 7, Name: "npu7", Node: "/dev/davinci7", PID: 777, User: "erin", Command: "python hack.py", Since: ms(3 * time.Minute), Action: "term"}},
	}
}

// TestTable: the board as the issue shows it, the command column cut to
// the width given, hidden commands and login sessions written for people.
func TestTable(t *testing.T) {
	now := time.Now()
	got := Table(board(now), 100, now)
	for _, want := range []string{
		"DEVICE  POOL         STATE     USER     PID   COMMAND",
		"npu1    interactive  free\n",
		"npu4    interactive  login     student  -     sshd pts/3 from 10.0.0.5",
		"npu12   queue        task 118  bob      5120  -",
		"npu13   queue        reserved  -        -     for task 121 (needs 2)",
		`WAITING  pool "interactive": 0    pool "queue": 2` + "\n",
		"  1  task 121  carol  2 devices  4m  " + wire.StartBy(now.Add(30*time.Minute).UnixMilli(), now) + "\n",
		"  2  npurun    dave   npu 13     1m  start unknown\n",
		"UNLEASED USE\n  npu7  erin  777  python hack.py  /dev/davinci7 open without a lease for 3m; sent SIGTERM\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	for _, line := range strings.Split(got, "\n") {
		if strings.HasPrefix(line, "npu") && utf8.RuneCountInString(line) > 100 {
			t.Errorf("line longer than 100: %q", line)
		}
	}
	npu0 := strings.Split(got, "\n")[1]
	if !strings.Contains(npu0, "python train.py --config very-long-") || !strings.Contains(npu0, "…") || !strings.HasSuffix(npu0, "2h13m") {
		t.Errorf("npu0's command is not cut to fit with its duration after it: %q", npu0)
	}
	if wide := Table(board(now), 0, now); !strings.Contains(wide, "very-long-end (+1)") {
		t.Errorf("with no width the command is cut:\n%s", wide)
	}
}

// TestTableUnleasedKinds: a node mapped with no descriptor open, and a
// control node used with no lease at all, are said so.
func TestTableUnleasedKinds(t *testing.T) {
	now := time.Now()
	b := board(now)
	ms := func(d time.Duration) int64 { return now.Add(-d).UnixMilli() }
	b.Unleased = []wire.Unleased{
		{Device: 8, Name: "npu8", Node: "/dev/davinci8", Mapped: true, PID: 778, User: "erin", Command: "python hide.py", Since: ms(2 * time.Minute)},
		{Device: -1, Node: "/dev/davinci_manager", Control: true, PID: 779, User: "fred", Command: "python probe.py", Since: ms(time.Minute)},
	}
	got := Table(b, 0, now)
	for _, want := range []string{
		"UNLEASED USE\n  npu8  erin  778  python hide.py   /dev/davinci8 mapped without a lease for 2m\n",
		"  -     fred  779  python probe.py  /dev/davinci_manager open without a lease for 1m (control node; no lease at all)\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}

// TestTableClaimedOrigin: a login lease's origin that its user claimed
// (a session request not made by root) says so where the table shows it.
func TestTableClaimedOrigin(t *testing.T) {
	now := time.Now()
	b := board(now)
	b.Devices[2].Lease.Claimed = true
	if got := Table(b, 0, now); !strings.Contains(got, "sshd pts/3 from 10.0.0.5 (as claimed by student)") {
		t.Errorf("table:\n%s", got)
	}
}

// TestTableControls: what users control (command lines, a session's tty
// and host) reaches the reader's terminal with no control character in it.
func TestTableControls(t *testing.T) {
	now := time.Now()
	b := board(now)
	b.Devices[0].Lease.Holders[0].Command = "evil \x1b]0;owned\x07\x1b[2J\r\x9b31m"
	b.Devices[2].Lease.TTY = "pts/3\x1b[1A"
	b.Unleased[0].Command = "hack\nnpu9    interactive  free"
	got := Table(b, 0, now)
	for _, r := range got {
		if r != '\n' && (r < 0x20 || r >= 0x7f && r < 0xa0) {
			t.Fatalf("table carries control character %U:\n%q", r, got)
		}
	}
	if !strings.Contains(got, "evil ?]0;owned??[2J??31m") || !strings.Contains(got, "hack?npu9") {
		t.Errorf("controls not shown as '?':\n%s", got)
	}
}

func TestUsageTable(t *testing.T) {
	got := UsageTable(&wire.UsageReport{Since: time.Date(2026, 1, 2, 3, 4, 0, 0, time.Local).UnixMilli(), Rows: []wire.UsageRow{
		{User: "alice", Kind: "inline", Pool: "interactive", Leases: 12, DeviceHours: 3.4249},
		{User: "bob", Kind: "task", Pool: "queue", Leases: 3, DeviceHours: 40.1},
	}})
	want := "since 2026-01-02 03:04\n" +
		"USER   KIND    POOL         LEASES  DEVICE-HOURS\n" +
		"alice  inline  interactive  12      3.42\n" +
		"bob    task    queue        3       40.10\n" +
		"TOTAL                       15      43.52\n"
	if got != want {
		t.Errorf("usage table:\n%s\nwant\n%s", got, want)
	}
}

// TestCommandErrors: usage errors exit 2 naming what is wrong; no broker
// exits 69 with a hint.
func TestCommandErrors(t *testing.T) {
	for _, tt := range []struct {
		run  func([]string, Env) int
		args []string
		code int
		msg  string
	}{
		{Status, []string{"--bogus"}, 2, "npubroker: unknown flag: --bogus"},
		{Status, []string{"extra"}, 2, `npubroker: status takes no arguments, got "extra"`},
		{Usage, []string{"--since", "soon"}, 2, `npubroker: bad duration "soon" for --since: a number must come before "soon"`},
		{Status, []string{"--socket", "/nonexistent/broker.sock"}, 69, "npubroker: hint: "},
		{Usage, []string{"--since", "1d", "--socket", "/nonexistent/broker.sock"}, 69, "no broker at /nonexistent/broker.sock"},
	} {
		var out, errs strings.Builder
		code := tt.run(tt.args, Env{Stdout: &out, Stderr: &errs, Getenv: func(string) string { return "" }})
		if code != tt.code || !strings.Contains(errs.String(), tt.msg) || out.Len() != 0 {
			t.Errorf("%v: exit %d, stderr %q, stdout %q; want exit %d and %q", tt.args, code, errs.String(), out.String(), tt.code, tt.msg)
		}
	}
}

// TestTableContainers: a container's lease is its user's, its command the
// container's name and id before the first holder's command; a task whose
// holders are in a container says which after its command; an unleased use
// in a container names it; a name with control characters is cleaned.
func TestTableContainers(t *testing.T) {
	now := time.Now()
	b := board(now)
	id := "3f2a9c1d0b7e" + strings.Repeat("0", 52)
	ctr := &wire.ContainerRef{Engine: "docker", ID: id, Name: "train"}
	b.Devices[0].State = wire.DeviceContainer
	b.Devices[0].Lease = &wire.LeaseInfo{Kind: wire.KindContainer, User: "alice", Container: ctr, Holders: []wire.Holder{
		{PID: 4121, User: "root", Command: "python train.py", Container: ctr}}}
	b.Devices[3].Lease.Holders[0].Command = "sleep 60"
	b.Devices[3].Lease.Holders[0].Container = &wire.ContainerRef{Engine: "docker", ID: strings.Repeat("ab", 32)}
	b.Unleased[0].Container = &wire.ContainerRef{Engine: "docker", ID: strings.Repeat("cd", 32), Name: "sneak\x1b[2J"}
	got := Table(b, 0, now)
	for _, want := range []string{
		"npu0    interactive  container  alice    4121  container train (3f2a9c1d0b7e): python train.py",
		"npu12   queue        task 118   bob      5120  sleep 60 (container abababababab)",
		"npu7  erin  777  sneak?[2J (cdcdcdcdcdcd): python hack.py",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}

// TestTableSlurmJobUser: a Slurm job's lease whose holders are its step
// daemons alone (root's slurmstepd, as under srun) is shown as the job's
// user's, as --json's user says (issue 27.23: USER was root); a lease
// whose descriptor another account's process holds is still its owner's,
// that account named after the command.
func TestTableSlurmJobUser(t *testing.T) {
	now := time.Now()
	b := board(now)
	b.Devices[0].State = wire.DeviceSlurm
	b.Devices[0].Lease = &wire.LeaseInfo{Kind: wire.KindSlurm, SlurmJob: 42, User: "alice", UID: 1001, Holders: []wire.Holder{
		{PID: 300, UID: 0, User: "root", Command: "slurmstepd: [42.extern]"},
		{PID: 301, UID: 0, User: "root", Command: "slurmstepd: [42.0]"}}}
	b.Devices[3].Lease.UID = 1002
	b.Devices[3].Lease.Holders[0].UID, b.Devices[3].Lease.Holders[0].User = 1003, "carol"
	got := Table(b, 0, now)
	for _, want := range []string{
		"npu0    interactive  job 42    alice    300   slurmstepd: [42.extern] (+1)",
		"npu12   queue        task 118  bob      5120  - (held by carol)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}
