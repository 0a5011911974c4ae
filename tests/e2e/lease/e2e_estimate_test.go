package lease

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// TestEstimatedStart: the estimated start of each waiting request, as
// status --json, the status table, task-submit list and npurun's
// progress line show it, against a schedule the test works out from the
// leases' starts and the time limits (plus kill_grace, 1s): tasks X (npu0,
// --time 10m) and Y (npu1, --time 20m) run; an npurun W (1 device, no
// limit) starts by X's end and then keeps npu0 with no known end; task Z
// (1 device, --time 5m) starts by Y's end; task Q (1 device, no limit)
// by Z's end, and keeps npu1; task R (1 device) waits for devices no
// known time frees: unknown.
func TestEstimatedStart(t *testing.T) {
	harness.NeedRoot(t)
	b := harness.StartBroker(t, harness.TaskConfig(2))
	x := harness.SubmitTask(t, b, nil, "/", "-d", "0", "--time", "10m", "--", "sleep", "600")
	y := harness.SubmitTask(t, b, nil, "/", "-d", "1", "--time", "20m", "--", "sleep", "600")
	board := harness.WaitBoard(t, b, func(bd *wire.Board) bool {
		return boardDevice(t, bd, 0).Lease != nil && boardDevice(t, bd, 1).Lease != nil
	})
	const grace = time.Second
	endX := boardDevice(t, board, 0).Lease.Since + (10*time.Minute + grace).Milliseconds()
	endY := boardDevice(t, board, 1).Lease.Since + (20*time.Minute + grace).Milliseconds()

	w := harness.Queue(t, b, "W", "-n", "1", "true")
	z := harness.SubmitTask(t, b, nil, "/", "-n", "1", "--time", "5m", "--", "true")
	q := harness.SubmitTask(t, b, nil, "/", "-n", "1", "--", "true")
	rr := harness.SubmitTask(t, b, nil, "/", "-n", "1", "--", "true")

	board = harness.WaitBoard(t, b, func(bd *wire.Board) bool {
		for _, ln := range bd.Waiting {
			if ln.Pool == "default" && ln.Count == 4 {
				return true
			}
		}
		return false
	})
	starts := map[string]int64{}
	for _, ln := range board.Waiting {
		for _, wi := range ln.Waiters {
			name := "W"
			switch wi.Task {
			case z:
				name = "Z"
			case q:
				name = "Q"
			case rr:
				name = "R"
			}
			starts[name] = wi.Start
		}
	}
	endZ := endY + (5*time.Minute + grace).Milliseconds()
	want := map[string]int64{"W": endX, "Z": endY, "Q": endZ, "R": 0}
	for name, at := range want {
		if starts[name] != at {
			t.Errorf("status --json: %s starts at %d, want %d (0: unknown)", name, starts[name], at)
		}
	}

	now := time.Now()
	table := b.Status(t)
	for _, s := range []string{wire.StartBy(endX, now), wire.StartBy(endY, now), wire.StartBy(endZ, now), "start unknown"} {
		if !strings.Contains(table, s) {
			t.Errorf("status table lacks %q:\n%s", s, table)
		}
	}
	// npurun's progress line: its place, then its start.
	if line := w.WaitLine("starts by"); !strings.Contains(line, wire.StartBy(endX, time.Now())) {
		t.Errorf("npurun's progress line %q, want %q", line, wire.StartBy(endX, time.Now()))
	}

	// task-submit list, --json and the table.
	r := harness.RunTaskCmd(t, b.TaskSubmit("list", "--json"))
	var ts []wire.TaskInfo
	if err := json.Unmarshal([]byte(r.Stdout), &ts); err != nil {
		t.Fatalf("list --json: %v: %s", err, r.Stdout)
	}
	if zi, ri := harness.FindTask(ts, z), harness.FindTask(ts, rr); zi == nil || ri == nil || zi.Start != endY || ri.Start != 0 {
		t.Errorf("list --json: Z %+v, R %+v; want Z's start %d, R's unknown", zi, ri, endY)
	}
	list := harness.RunTaskCmd(t, b.TaskSubmit("list")).Stdout
	byZ := "by " + time.UnixMilli(endY).Format("15:04:05")
	if time.UnixMilli(endY).Day() != time.Now().Day() {
		byZ = "by " + time.UnixMilli(endY).Format("Jan 02 15:04")
	}
	for _, row := range strings.Split(list, "\n") {
		f := strings.Fields(row)
		switch {
		case len(f) > 0 && f[0] == harness.IDStr(z) && !strings.Contains(row, byZ):
			t.Errorf("list: Z's row %q lacks %q", row, byZ)
		case len(f) > 0 && f[0] == harness.IDStr(rr) && !strings.Contains(row, "unknown"):
			t.Errorf("list: R's row %q lacks unknown", row)
		}
	}

	for _, id := range []uint64{x, y} {
		harness.RunTaskCmd(t, b.TaskSubmit("cancel", harness.IDStr(id)))
	}
	w.MustSucceed()
	for _, id := range []uint64{z, q, rr} {
		if r := harness.WaitTask(t, b, id); r.Code != 0 {
			t.Errorf("task %d: %s", id, r)
		}
	}
}
