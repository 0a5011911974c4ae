package lease

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// TestNpurunTime: npurun --time ends its command as a task's limit does:
// SIGTERM once the time has passed since the grant (a shell running it
// sees status 143), SIGKILL after [tasks] kill_grace (1s here) for a
// command that ignores SIGTERM (137); a limit beyond [tasks] max_time is
// refused (status 77).
func TestNpurunTime(t *testing.T) {
	harness.NeedRoot(t)
	b := harness.StartBroker(t, harness.TaskConfig(1)+"max_time = \"1h\"\n")
	run := func(script string) (string, time.Duration) {
		t.Helper()
		cmd := exec.Command("sh", "-c", script)
		cmd.Env = append(b.Env(), "NPURUN="+b.Bin.Npurun)
		t0 := time.Now()
		r := harness.RunTaskCmd(t, cmd)
		return strings.TrimSpace(r.Stdout) + r.Stderr, time.Since(t0)
	}
	for _, tc := range []struct {
		name, cmd, want string
		least, most     time.Duration
	}{
		{"SIGTERM", `"$NPURUN" --time 2s -- sleep 30; echo "status $?"`, "status 143", 2 * time.Second, 5 * time.Second},
		{"SIGKILL after the grace", `"$NPURUN" --time 2s -- sh -c 'trap "" TERM; sleep 30'; echo "status $?"`, "status 137", 3 * time.Second, 6 * time.Second},
	} {
		out, took := run(tc.cmd)
		if !strings.Contains(out, tc.want) || took < tc.least || took > tc.most {
			t.Errorf("%s: %q after %s; want %q after %s to %s", tc.name, out, took.Round(time.Millisecond), tc.want, tc.least, tc.most)
		}
	}
	if log := b.Log(); !strings.Contains(log, "time limit 2s reached") {
		t.Errorf("the broker's log does not say why it ended the leases:\n%s", log)
	}
	out, _ := run(`"$NPURUN" --time 2h -- true; echo "status $?"`)
	if !strings.Contains(out, "status 77") || !strings.Contains(out, "time limit 2h is longer than the 1h allowed") {
		t.Errorf("--time beyond max_time: %q", out)
	}
}

// TestNpurunTimeAfterRestart: an npurun --time lease outlives a broker
// killed with SIGKILL, and the broker started after it takes up its time
// limit with it (the accounting log keeps it): the command gets SIGTERM
// once its time has passed since its grant, not never.
func TestNpurunTimeAfterRestart(t *testing.T) {
	harness.NeedRoot(t)
	b := harness.StartBroker(t, harness.TaskConfig(1))
	cmd := exec.Command("sh", "-c", `"$NPURUN" --time 4s -- sh -c 'echo granted; exec sleep 60'; echo "status $?"`)
	cmd.Env = append(b.Env(), "NPURUN="+b.Bin.Npurun)
	t0 := time.Now()
	p := harness.StartProc(t, "npurun --time 4s", cmd)
	p.WaitLine("granted")
	b.FlushAccounting(t)
	b.Kill()
	b.Start()
	p.WaitLine("status 143")
	if took := time.Since(t0); took < 4*time.Second || took > 15*time.Second {
		t.Errorf("the command ended %s after its start, not about its 4s limit", took.Round(time.Millisecond))
	}
	if log := b.Log(); !strings.Contains(log, "time limit 4s reached") {
		t.Errorf("the broker started after does not say it ended the lease at its limit:\n%s", log)
	}
}

// TestBackfillWithLimit: three devices; task X holds npu2 with --time 15s; task H
// wants all three, reserves npu0 and npu1, and starts by X's end (its
// estimate: X's start, its limit and kill_grace, 1s). Task B (--time 3s)
// and an npurun N (--time 3s) each end well before that: they are
// backfilled onto the devices H reserved, say so (npurun's progress line,
// status, status --json, task-submit show, the accounting log), end by
// their limits, and H starts no later than its estimate. Task L, with no
// limit, is not backfilled.
func TestBackfillWithLimit(t *testing.T) {
	harness.NeedRoot(t)
	b := harness.StartBroker(t, harness.TaskConfig(3))
	x := harness.SubmitTask(t, b, nil, "/", "-d", "2", "--time", "15s", "--", "sleep", "600")
	harness.WaitBoard(t, b, func(bd *wire.Board) bool { return boardDevice(t, bd, 2).Lease != nil })
	h := harness.SubmitTask(t, b, nil, "/", "-n", "3", "--time", "1m", "--", "true")
	var estimate int64
	harness.WaitBoard(t, b, func(bd *wire.Board) bool {
		for _, ln := range bd.Waiting {
			for _, wi := range ln.Waiters {
				if wi.Task == h && wi.Start > 0 {
					estimate = wi.Start
					return true
				}
			}
		}
		return false
	})
	l := harness.SubmitTask(t, b, nil, "/", "-n", "1", "--", "true")
	bt := harness.SubmitTask(t, b, nil, "/", "-n", "1", "--time", "3s", "--", "sleep", "600")
	n := harness.StartProc(t, "N", b.Npurun("-v", "-n", "1", "--time", "3s", "--", "sleep", "600"))
	before := "before task " + harness.IDStr(h) + "'s start"
	if line := n.WaitLine("backfilled"); !strings.Contains(line, "npurun: backfilled (ends by ") || !strings.Contains(line, before) {
		t.Errorf("npurun's progress line %q, want backfilled, %s", line, before)
	}
	bd := harness.WaitBoard(t, b, func(bd *wire.Board) bool {
		return boardDevice(t, bd, 0).Lease != nil && boardDevice(t, bd, 1).Lease != nil
	})
	for id := range 2 {
		ls := boardDevice(t, bd, id).Lease
		if ls.Backfill == nil || ls.Backfill.Before != "task "+harness.IDStr(h) || ls.Backfill.BeforeStart != estimate ||
			ls.Backfill.EndsBy > estimate || ls.Backfill.EndsBy < ls.Since+4000 {
			t.Errorf("status --json: npu%d's lease %+v backfill %+v; want before task %d at %d, ending by its limit", id, ls, ls.Backfill, h, estimate)
		}
	}
	if table := b.Status(t); strings.Count(table, "backfilled (ends by ") != 2 || !strings.Contains(table, before) {
		t.Errorf("status does not show the two backfills:\n%s", table)
	}
	show := harness.RunTaskCmd(t, b.TaskSubmit("show", harness.IDStr(bt))).Stdout
	if !strings.Contains(show, "scheduling: backfilled (ends by ") || !strings.Contains(show, before) {
		t.Errorf("task-submit show %d:\n%s", bt, show)
	}
	b.FlushAccounting(t)
	if logged, err := os.ReadFile(filepath.Join(b.StateDir, "usage.log")); err != nil || bytes.Count(logged, []byte(`"backfill":{"ends_by":`)) != 2 {
		t.Errorf("the accounting log does not mark the two backfilled leases (%v):\n%s", err, logged)
	}

	// B and N end by their limits; then X ends by its own, and H starts.
	if r := harness.WaitTask(t, b, bt); r.Code == 0 {
		t.Errorf("task B ended well: %s", r)
	}
	if code, sig := n.Wait(); sig != syscall.SIGTERM {
		t.Errorf("npurun N: exit %d, signal %v; want ended by its limit (SIGTERM)", code, sig)
	}
	if r := harness.WaitTask(t, b, h); r.Code != 0 {
		t.Errorf("task H: %s", r)
	}
	r := harness.RunTaskCmd(t, b.TaskSubmit("list", "--json", "--all"))
	var ts []wire.TaskInfo
	if err := json.Unmarshal([]byte(r.Stdout), &ts); err != nil {
		t.Fatalf("list --json: %v: %s", err, r.Stdout)
	}
	hi, bi, li := harness.FindTask(ts, h), harness.FindTask(ts, bt), harness.FindTask(ts, l)
	if hi == nil || bi == nil || li == nil {
		t.Fatalf("list --json lacks H, B or L: %s", r.Stdout)
	}
	// H starts once X's lease has ended: its estimate, or within the
	// moment the supervisor takes to start it.
	if hi.Started > estimate+1000 {
		t.Errorf("H started at %d, %d ms after its estimate %d", hi.Started, hi.Started-estimate, estimate)
	}
	if d := bi.Ended - bi.Started; d > 3000+1000+1000 {
		t.Errorf("B ran %d ms, past its limit of 3s and the grace of 1s", d)
	}
	if li.Started < hi.Started {
		t.Errorf("L, with no limit, started at %d, before H at %d", li.Started, hi.Started)
	}
	harness.RunTaskCmd(t, b.TaskSubmit("cancel", harness.IDStr(x)))
}

// TestBackfillReload: [scheduling] backfill = false keeps a task with a
// limit waiting behind a head's reservation; a reload that turns it on
// backfills it at once.
func TestBackfillReload(t *testing.T) {
	harness.NeedRoot(t)
	conf := harness.TaskConfig(2)
	b := harness.StartBroker(t, conf+"[scheduling]\nbackfill = false\n")
	x := harness.SubmitTask(t, b, nil, "/", "-d", "1", "--time", "1m", "--", "sleep", "600")
	harness.WaitBoard(t, b, func(bd *wire.Board) bool { return boardDevice(t, bd, 1).Lease != nil })
	h := harness.SubmitTask(t, b, nil, "/", "-n", "2", "--time", "1m", "--", "true")
	bt := harness.SubmitTask(t, b, nil, "/", "-n", "1", "--time", "5s", "--", "sleep", "600")
	harness.WaitBoard(t, b, func(bd *wire.Board) bool {
		waiting := 0
		for _, ln := range bd.Waiting {
			for _, wi := range ln.Waiters {
				if wi.Task == h || wi.Task == bt {
					waiting++
				}
			}
		}
		return waiting == 2 && boardDevice(t, bd, 0).Lease == nil
	})
	harness.WriteConf(t, b, conf)
	if code, info, errs := harness.Reload(t, b); code != 0 || !slices.Contains(info.Changed, "[scheduling]") {
		t.Fatalf("reload: status %d, %+v, %s", code, info, errs)
	}
	bd := harness.WaitBoard(t, b, func(bd *wire.Board) bool { return boardDevice(t, bd, 0).Lease != nil })
	if l := boardDevice(t, bd, 0).Lease; l.Task != bt || l.Backfill == nil {
		t.Errorf("after the reload npu0 holds %+v, want task %d backfilled", l, bt)
	}
	for _, id := range []uint64{x, h, bt} {
		harness.RunTaskCmd(t, b.TaskSubmit("cancel", harness.IDStr(id)))
	}
}
