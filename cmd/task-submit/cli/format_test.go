package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/wire"
)

// now is the clock of these tests: times on March 10 are "today".
var now = time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)

func ms(month time.Month, day, hour, min, sec int) int64 {
	return time.Date(2026, month, day, hour, min, sec, 0, time.UTC).UnixMilli()
}

func exit(n int) *int { return &n }

func lines(ls ...string) string { return strings.Join(ls, "\n") + "\n" }

func TestTable(t *testing.T) {
	mine := []wire.TaskInfo{
		{ID: 118, User: "alice", State: wire.StateRunning, Devices: []int{3, 5}, N: 2,
			Command: "python train.py --lr 3e-4", Submitted: ms(3, 9, 22, 15, 0), Started: ms(3, 10, 9, 30, 5)},
		{ID: 119, User: "alice", State: wire.StatePending, N: 2, Name: "big",
			Command: "torchrun --nproc_per_node=2 train.py", Submitted: ms(3, 10, 11, 58, 2), Position: 4, Start: ms(3, 10, 14, 30, 0)},
		{ID: 120, User: "alice", State: wire.StatePending, Devices: []int{9},
			Command: "python probe.py", Submitted: ms(3, 10, 11, 59, 0)},
		{ID: 121, User: "alice", State: wire.StateDone, NoDevice: true, Exit: exit(0),
			Command:   "./run-experiment.sh --config configs/very/long/path/to/experiment.yaml --seed 42",
			Submitted: ms(3, 1, 8, 0, 0), Started: ms(3, 1, 8, 1, 0), Ended: ms(3, 1, 9, 0, 0)},
		{ID: 122, User: "alice", State: wire.StateBlocked, After: []uint64{118},
			Command: "echo a\n\techo b", Submitted: ms(3, 10, 11, 59, 30)},
	}
	// The last column starts at 5+9+10+14+14 = 52: 48 characters are left.
	wantMine := lines(
		"ID   STATE    DEVICES   SUBMITTED     STARTED       NAME/COMMAND",
		"118  running  3,5       Mar 09 22:15  09:30:05      python train.py --lr 3e-4",
		"119  pending  2 wanted  11:58:02      by 14:30:00   big",
		"120  pending  device 9  11:59:00      unknown       python probe.py",
		"121  done     -         Mar 01 08:00  Mar 01 08:01  ./run-experiment.sh --config configs/very/long/…",
		"122  blocked  1 wanted  11:59:30      -             echo a echo b",
	)

	everyone := []wire.TaskInfo{
		mine[0],
		{ID: 130, User: "bob", UID: 1001, State: wire.StatePending, N: 1, Submitted: ms(3, 10, 10, 0, 0), Position: 1},
		{ID: 131, User: "bob", UID: 1001, State: wire.StateRunning, Devices: []int{7}, Name: "sweep",
			Submitted: ms(3, 10, 10, 0, 1), Started: ms(3, 10, 10, 5, 0)},
	}
	wantEveryone := lines(
		"ID   USER   STATE    DEVICES   SUBMITTED     STARTED   NAME/COMMAND",
		"118  alice  running  3,5       Mar 09 22:15  09:30:05  python train.py --lr 3e-4",
		"130  bob    pending  1 wanted  10:00:00      unknown   -",
		"131  bob    running  7         10:00:01      10:05:00  sweep",
	)

	tests := []struct {
		name string
		ts   []wire.TaskInfo
		all  bool
		want string
	}{
		{"mine", mine, false, wantMine},
		{"all hides others' commands", everyone, true, wantEveryone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			if err := writeTable(&b, tt.ts, tt.all, now); err != nil {
				t.Fatal(err)
			}
			if b.String() != tt.want {
				t.Errorf("table:\n%s\nwant:\n%s", b.String(), tt.want)
			}
			for _, l := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
				if n := len([]rune(l)); n > tableWidth {
					t.Errorf("line of %d characters, more than %d: %q", n, tableWidth, l)
				}
			}
		})
	}
}

func TestTableNarrowsToMinimum(t *testing.T) {
	ts := []wire.TaskInfo{{ID: 1, User: strings.Repeat("u", 80), State: wire.StateRunning, Devices: []int{0},
		Command: strings.Repeat("c", 40), Submitted: ms(3, 10, 1, 0, 0), Started: ms(3, 10, 1, 0, 0)}}
	var b strings.Builder
	if err := writeTable(&b, ts, true, now); err != nil {
		t.Fatal(err)
	}
	want := strings.Repeat("c", minCommandWidth-1) + "…\n"
	if !strings.HasSuffix(b.String(), want) {
		t.Errorf("table:\n%s\nwant the last row to end in %q", b.String(), want)
	}
}

func TestDeviceCell(t *testing.T) {
	tests := []struct {
		name string
		t    wire.TaskInfo
		want string
	}{
		{"default request", wire.TaskInfo{State: wire.StatePending}, "1 wanted"},
		{"count", wire.TaskInfo{State: wire.StatePending, N: 4}, "4 wanted"},
		{"named", wire.TaskInfo{State: wire.StatePending, Devices: []int{9, 10}}, "devices 9-10"},
		{"granted", wire.TaskInfo{State: wire.StateRunning, Devices: []int{2, 3}, N: 2, Started: 1}, "2-3"},
		{"no device", wire.TaskInfo{State: wire.StateRunning, NoDevice: true, Started: 1}, "-"},
		{"cancelled before it ran", wire.TaskInfo{State: wire.StateCancelled, N: 2}, "2 wanted"},
		{"a share waiting", wire.TaskInfo{State: wire.StatePending, Mem: 12 << 10}, "1 wanted (12G)"},
		{"a share granted", wire.TaskInfo{State: wire.StateRunning, Devices: []int{3}, N: 1, Mem: 1536, Started: 1}, "3 (1.5G)"},
	}
	for _, tt := range tests {
		if got := deviceCell(&tt.t); got != tt.want {
			t.Errorf("%s: deviceCell = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestTimeCell(t *testing.T) {
	tests := []struct {
		ms   int64
		want string
	}{
		{0, "-"},
		{ms(3, 10, 0, 0, 0), "00:00:00"},
		{ms(3, 10, 23, 59, 59), "23:59:59"},
		{ms(3, 9, 23, 59, 59), "Mar 09 23:59"},
		{ms(3, 11, 0, 0, 0), "Mar 11 00:00"},
		{time.Date(2025, 3, 10, 8, 0, 0, 0, time.UTC).UnixMilli(), "Mar 10 08:00"},
	}
	for _, tt := range tests {
		if got := timeCell(tt.ms, now); got != tt.want {
			t.Errorf("timeCell(%d) = %q, want %q", tt.ms, got, tt.want)
		}
	}
}

func TestTruncate(t *testing.T) {
	tests := []struct {
		s    string
		n    int
		want string
	}{
		{"abc", 3, "abc"},
		{"abcd", 3, "ab…"},
		{"", 3, ""},
		{"äöüß", 3, "äö…"},
	}
	for _, tt := range tests {
		if got := truncate(tt.s, tt.n); got != tt.want {
			t.Errorf("truncate(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
		}
	}
}

func TestOneLine(t *testing.T) {
	tests := []struct{ in, want string }{
		{"python  train.py", "python  train.py"},
		{"echo a\necho b\n", "echo a echo b"},
		{"a\x1b[31mred", "a [31mred"},
		{"tab\there", "tab here"},
	}
	for _, tt := range tests {
		if got := oneLine(tt.in); got != tt.want {
			t.Errorf("oneLine(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestShow(t *testing.T) {
	tests := []struct {
		name string
		t    wire.TaskInfo
		want string
	}{
		{"failed", wire.TaskInfo{
			ID: 118, Name: "big", User: "alice", UID: 1000, State: wire.StateFailed,
			Command: "torchrun --nproc_per_node=2 train.py", Cwd: "/home/alice/proj",
			Env: []string{"HOME=/home/alice"}, Log: "/home/alice/.local/state/npurun/tasks/118.log",
			N: 2, Pool: "queue", Devices: []int{4, 5}, After: []uint64{116, 117}, TimeSec: 3600,
			Submitted: ms(3, 10, 9, 0, 0), Started: ms(3, 10, 9, 30, 5), Ended: ms(3, 10, 10, 30, 5),
			Signal: "SIGKILL", Reason: "time limit 1h reached",
		}, lines(
			"id: 118",
			"name: big",
			"user: alice",
			"state: failed",
			"command: torchrun --nproc_per_node=2 train.py",
			"cwd: /home/alice/proj",
			"devices: 4-5",
			"pool: queue",
			"after: 116,117",
			"time limit: 1h",
			"submitted: 2026-03-10 09:00:00 UTC",
			"started: 2026-03-10 09:30:05 UTC",
			"ended: 2026-03-10 10:30:05 UTC (after 1h)",
			"signal: SIGKILL",
			"reason: time limit 1h reached",
			"log: /home/alice/.local/state/npurun/tasks/118.log",
		)},
		{"pending", wire.TaskInfo{
			ID: 119, User: "alice", State: wire.StatePending, Command: "echo a\necho b",
			Cwd: "/tmp", Log: "/tmp/x.log", Pool: "queue", Submitted: ms(3, 10, 11, 0, 0), Position: 2,
		}, lines(
			"id: 119",
			"user: alice",
			"state: pending",
			`command: "echo a\necho b"`,
			"cwd: /tmp",
			"devices: 1 wanted",
			"pool: queue",
			"submitted: 2026-03-10 11:00:00 UTC",
			"log: /tmp/x.log",
			"position: 2nd in line",
		)},
		{"another's, done, no device", wire.TaskInfo{
			ID: 7, User: "bob", UID: 1001, State: wire.StateDone, NoDevice: true,
			Submitted: ms(3, 1, 8, 0, 0), Started: ms(3, 1, 8, 0, 1), Ended: ms(3, 1, 8, 0, 3), Exit: exit(0),
		}, lines(
			"id: 7",
			"user: bob",
			"state: done",
			"command: -",
			"devices: none (--no-device)",
			"submitted: 2026-03-01 08:00:00 UTC",
			"started: 2026-03-01 08:00:01 UTC",
			"ended: 2026-03-01 08:00:03 UTC (after 2s)",
			"exit status: 0",
		)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			if err := writeShow(&b, &tt.t, time.UTC); err != nil {
				t.Fatal(err)
			}
			if b.String() != tt.want {
				t.Errorf("show:\n%s\nwant:\n%s", b.String(), tt.want)
			}
		})
	}
}

func TestWaitStatus(t *testing.T) {
	tests := []struct {
		name     string
		t        wire.TaskInfo
		code     int
		describe string
	}{
		{"succeeded", wire.TaskInfo{State: wire.StateDone, Exit: exit(0)}, 0, "succeeded"},
		{"exit 3", wire.TaskInfo{State: wire.StateFailed, Exit: exit(3)}, 3, "failed: exit 3"},
		{"exit 255", wire.TaskInfo{State: wire.StateFailed, Exit: exit(255)}, 255, "failed: exit 255"},
		{"time limit", wire.TaskInfo{State: wire.StateFailed, Signal: "SIGKILL", Reason: "time limit 1h reached"},
			137, "failed: killed by SIGKILL (time limit 1h reached)"},
		{"segfault", wire.TaskInfo{State: wire.StateFailed, Signal: "SIGSEGV"}, 139, "failed: killed by SIGSEGV"},
		{"did not start", wire.TaskInfo{State: wire.StateFailed, Reason: `start: exec: "pyhton": not found`},
			1, `failed: start: exec: "pyhton": not found`},
		{"cancelled while pending", wire.TaskInfo{State: wire.StateCancelled, Reason: "cancelled"}, 1, "cancelled"},
		{"cancelled while running", wire.TaskInfo{State: wire.StateCancelled, Signal: "SIGTERM", Reason: "cancelled"},
			143, "cancelled (killed by SIGTERM)"},
		{"cancelled, exited 0 on SIGTERM", wire.TaskInfo{State: wire.StateCancelled, Exit: exit(0)}, 1, "cancelled (exit 0)"},
		{"cancelled by root", wire.TaskInfo{State: wire.StateCancelled, Reason: "cancelled by root"}, 1, "cancelled by root"},
		{"lost", wire.TaskInfo{State: wire.StateLost, Reason: "its supervisor vanished"}, 1, "lost (its supervisor vanished)"},
		{"not ended", wire.TaskInfo{State: wire.StateRunning}, 1, "is running"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := waitStatus(&tt.t); got != tt.code {
				t.Errorf("waitStatus = %d, want %d", got, tt.code)
			}
			if got := describeEnd(&tt.t); got != tt.describe {
				t.Errorf("describeEnd = %q, want %q", got, tt.describe)
			}
		})
	}
}

func TestCancelLine(t *testing.T) {
	tests := []struct {
		name string
		t    wire.TaskInfo
		want string
	}{
		{"pending", wire.TaskInfo{ID: 118, State: wire.StateCancelled, Ended: 5}, "task 118 cancelled"},
		{"running", wire.TaskInfo{ID: 118, State: wire.StateRunning, Started: 5}, "task 118: SIGTERM sent; SIGKILL follows after the grace period"},
		{"marked cancelled, still running", wire.TaskInfo{ID: 118, State: wire.StateCancelled, Started: 5},
			"task 118: SIGTERM sent; SIGKILL follows after the grace period"},
		{"done", wire.TaskInfo{ID: 118, State: wire.StateDone, Started: 5, Ended: 6, Exit: exit(0)}, "task 118 had already ended: succeeded"},
		{"failed", wire.TaskInfo{ID: 118, State: wire.StateFailed, Started: 5, Ended: 6, Exit: exit(3)}, "task 118 had already ended: failed: exit 3"},
		{"cancelled before", wire.TaskInfo{ID: 118, State: wire.StateCancelled, Started: 5, Ended: 6, Signal: "SIGTERM"},
			"task 118 was already cancelled (killed by SIGTERM)"},
	}
	for _, tt := range tests {
		if got := cancelLine(&tt.t); got != tt.want {
			t.Errorf("%s: cancelLine = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestSubmitted(t *testing.T) {
	tests := []struct {
		r        wire.Reply
		want     string
		wantJSON string
	}{
		{wire.Reply{ID: 118, Position: 4, Pool: "queue"}, `task 118 queued (4th in line in pool "queue")`, `{"id":118,"position":4,"pool":"queue"}`},
		{wire.Reply{ID: 119, Position: 1, Pool: "default"}, `task 119 queued (1st in line in pool "default")`, `{"id":119,"position":1,"pool":"default"}`},
		{wire.Reply{ID: 120, Position: 12}, `task 120 queued (12th in line)`, `{"id":120,"position":12}`},
		{wire.Reply{ID: 121}, `task 121 submitted`, `{"id":121}`},
	}
	for _, tt := range tests {
		if got := submittedLine(&tt.r); got != tt.want {
			t.Errorf("submittedLine(%+v) = %q, want %q", tt.r, got, tt.want)
		}
		var b strings.Builder
		if err := writeJSON(&b, submitted{ID: tt.r.ID, Position: tt.r.Position, Pool: tt.r.Pool}); err != nil {
			t.Fatal(err)
		}
		if b.String() != tt.wantJSON+"\n" {
			t.Errorf("submit --json = %q, want %q", b.String(), tt.wantJSON)
		}
	}
}

// list --json is an array of TaskInfo that reads back as it was.
func TestListJSON(t *testing.T) {
	ts := []wire.TaskInfo{{ID: 1, User: "alice", State: wire.StateDone, Command: "a && b <c>", Exit: exit(0), Submitted: 1}}
	var b strings.Builder
	if err := writeJSON(&b, ts); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), `"command":"a && b <c>"`) {
		t.Errorf("list --json = %s, want the command unescaped", b.String())
	}
	var back []wire.TaskInfo
	if err := json.Unmarshal([]byte(b.String()), &back); err != nil {
		t.Fatal(err)
	}
	if len(back) != 1 || back[0].Command != ts[0].Command || *back[0].Exit != 0 {
		t.Errorf("read back %+v, want %+v", back, ts)
	}
}

// TestTasksJSONAsEncoder: list --json written by the hand encoder is
// what encoding/json's Encoder (writeJSON) writes, byte for byte: for no
// tasks, and for tasks with every kind of field and character.
func TestTasksJSONAsEncoder(t *testing.T) {
	for _, ts := range [][]wire.TaskInfo{
		{},
		{{ID: 1, User: "alice", State: wire.StateDone, Command: "a && b <c> \"q\" \\ \u2028 é \xff \x01", Exit: exit(0), Submitted: 1}},
		{{ID: 2, User: "bob", UID: 1001, State: wire.StatePending, N: 2, Pool: "queue", Devices: []int{3}, After: []uint64{1}, Position: 4, Start: 5, Submitted: 6, Held: true},
			{ID: 18446744073709551615, State: wire.StateFailed, Signal: "SIGKILL", Reason: "time limit", Exit: exit(-1), Env: []string{"A=<b>"}, Source: wire.SourceAccounting}},
	} {
		var hand, enc strings.Builder
		if err := writeTasksJSON(&hand, ts); err != nil {
			t.Fatal(err)
		}
		if err := writeJSON(&enc, ts); err != nil {
			t.Fatal(err)
		}
		if hand.String() != enc.String() {
			t.Errorf("list --json:\nhand:    %s\nencoder: %s", hand.String(), enc.String())
		}
	}
	var none strings.Builder
	if err := writeTasksJSON(&none, nil); err != nil || none.String() != "[]\n" {
		t.Errorf("list --json of no tasks = %q (%v), want \"[]\\n\"", none.String(), err)
	}
}

func TestOrdinal(t *testing.T) {
	for n, want := range map[int]string{1: "1st", 2: "2nd", 3: "3rd", 4: "4th", 11: "11th", 12: "12th", 13: "13th", 21: "21st", 22: "22nd", 111: "111th", 101: "101st"} {
		if got := wire.Ordinal(n); got != want {
			t.Errorf("Ordinal(%d) = %q, want %q", n, got, want)
		}
	}
}
