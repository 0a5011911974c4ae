package tasks

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/testfs"
	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// The hardening of the task life (issue 6): a full disk, numbers that
// overflow, another user's churn, secrets that outlive their task, a
// refused cancel, descriptors running out, ids reused, clock steps, pids
// reused, and a journal that grows without bound.

// mountSmall mounts a tmpfs of size bytes on b's state directory, before
// b starts; it is unmounted once b has stopped.
func mountSmall(t *testing.T, b *harness.Broker, size int) {
	t.Helper()
	harness.NeedRoot(t)
	if err := os.MkdirAll(b.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", size), "npurun-test", b.StateDir).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs on %s: %v: %s", b.StateDir, err, out)
	}
	t.Cleanup(func() {
		b.Stop()
		if out, err := exec.Command("umount", b.StateDir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", b.StateDir, err, out)
		}
	})
}

// protoSub is a small submission for the protocol.
func protoSub(dir string, noDevice bool, argv ...string) *wire.Submission {
	return &wire.Submission{Argv: argv, Cwd: dir, Env: []string{"PATH=/usr/bin:/bin"}, NoDevice: noDevice,
		Log: filepath.Join(dir, "proto.log")}
}

// endAll waits for every task of b to end, so that no supervisor of the
// test's outlives it (one whose broker is gone reports for a day).
func endAll(t *testing.T, b *harness.Broker) {
	t.Helper()
	c := b.Dial()
	ts, err := c.List(true)
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range ts {
		if ti.ExitStatus() >= 0 {
			continue
		}
		if _, err := c.Wait(ti.ID); err != nil {
			var ce *wire.Error
			if !errors.As(err, &ce) || ce.Code != wire.CodeNoSuchTask {
				t.Errorf("wait %d: %v", ti.ID, err)
			}
		}
	}
}

// spoolErr tells whether err is the broker's answer that it could not
// record a change.
func spoolErr(err error) bool {
	var ce *wire.Error
	return errors.As(err, &ce) && ce.Code == wire.CodeSpool
}

// TestTaskFullSpool: on a full disk nothing the journal cannot record
// happens: a submission is refused, a cancel is refused and the task waits
// on (issue 6.9), and a task whose start cannot be recorded stays pending
// while the broker stops starting tasks, leases going on (6.11). Once the
// disk has room again the broker resumes by itself, and every task runs
// once.
func TestTaskFullSpool(t *testing.T) {
	b := harness.NewBroker(t, harness.TaskConfig(1))
	mountSmall(t, b, 512<<10)
	b.Start()
	dir := harness.SharedDir(t)
	marks := filepath.Join(dir, "ran")
	if err := os.Mkdir(marks, 0o755); err != nil {
		t.Fatal(err)
	}
	h := harness.Hold(t, b, "holder")
	script := `set -C; : > "$1/$NPURUN_TASK_ID" || : > "$1/DOUBLE.$NPURUN_TASK_ID"`
	var ids []uint64
	for i := range 5 {
		ids = append(ids, harness.SubmitTask(t, b, nil, dir, "--log", filepath.Join(dir, fmt.Sprintf("t%d.log", i)), "--", "sh", "-c", script, "sh", marks))
	}
	c := b.Dial()
	var pads []uint64
	for range 30 {
		r, err := c.Submit(protoSub(dir, false, "true"))
		if err != nil {
			t.Fatal(err)
		}
		pads = append(pads, r.ID)
	}
	free := testfs.Fill(t, b.StateDir)
	// The journal's last page may have room left: take it with
	// submissions, then with cancels (smaller records), until they fail.
	for i := 0; ; i++ {
		if _, err := c.Submit(protoSub(dir, false, "true")); err != nil {
			if !spoolErr(err) {
				t.Fatalf("submission on a full disk: %v, want the broker's spool error", err)
			}
			break
		}
		if i > 200 {
			t.Fatal("submissions are still recorded on a full disk")
		}
	}
	for i, id := range pads {
		if _, err := c.Cancel(id); err != nil {
			if !spoolErr(err) {
				t.Fatalf("cancel on a full disk: %v, want the broker's spool error", err)
			}
			break
		}
		if i == len(pads)-1 {
			t.Fatal("cancels are still recorded on a full disk")
		}
	}

	r := harness.RunTaskCmd(t, harness.AsUser(b.TaskSubmit("--log", filepath.Join(dir, "x.log"), "--", "true"), nil, dir))
	if r.Code == 0 || !strings.Contains(r.Stderr, "could not record the task") {
		t.Errorf("task-submit on a full disk: %s; want a failure saying the task was not recorded", r)
	}
	victim := ids[len(ids)-1]
	r = harness.RunTaskCmd(t, b.TaskSubmit("cancel", harness.IDStr(victim)))
	if r.Code == 0 || !strings.Contains(r.Stderr, "still waits") {
		t.Errorf("cancel on a full disk: %s; want a failure saying the task still waits", r)
	}
	if ti := harness.ShowTask(t, b, victim); ti.State != wire.StatePending {
		t.Errorf("task %d after a cancel that could not be recorded: %s, want pending", victim, ti.State)
	}

	mark := b.LogLen()
	h.Release()
	b.WaitLog(mark, "task starts paused")
	for _, id := range ids {
		if ti := harness.ShowTask(t, b, id); ti.State != wire.StatePending {
			t.Errorf("task %d whose start could not be recorded: %s (%q), want pending", id, ti.State, ti.Reason)
		}
	}
	if ents, _ := os.ReadDir(marks); len(ents) != 0 {
		t.Errorf("tasks ran although their start could not be recorded: %v", ents)
	}
	// Leases go on: the device the tasks cannot take is leased.
	if code, out := harness.ExitCode(t, b.Npurun("-d", "0", "true")); code != 0 {
		t.Errorf("npurun while task starts are paused: exit %d; output:\n%s", code, out)
	}

	free()
	b.WaitLog(mark, "task starts resume")
	for _, id := range ids {
		if r := harness.WaitTask(t, b, id); r.Code != 0 {
			t.Errorf("task %d after the disk had room again: %s", id, r)
		}
	}
	ents, err := os.ReadDir(marks)
	if err != nil {
		t.Fatal(err)
	}
	var ran []string
	for _, e := range ents {
		ran = append(ran, e.Name())
	}
	var want []string
	for _, id := range ids {
		want = append(want, harness.IDStr(id))
	}
	slices.Sort(ran)
	slices.Sort(want)
	if !slices.Equal(ran, want) {
		t.Errorf("tasks that ran (one marker each, DOUBLE.ID if twice): %v, want %v", ran, want)
	}
	// The journal the failed writes left replays whole.
	b.Kill()
	mark = b.LogLen()
	b.Start()
	if log := b.Log()[mark:]; strings.Contains(log, "damaged") {
		t.Errorf("the journal is damaged after the full disk:\n%s", log)
	}
	for _, id := range ids {
		if ti := harness.ShowTask(t, b, id); ti.State != wire.StateDone {
			t.Errorf("task %d after a restart: %s, want done", id, ti.State)
		}
	}
	endAll(t, b)
}

// TestTaskSpoolFullAtRestart: a broker that restarts on a full disk
// cannot rewrite its journal; it keeps the old one (issue 6.3), serves
// leases and lists the tasks; nothing acknowledged is lost across two such
// restarts.
func TestTaskSpoolFullAtRestart(t *testing.T) {
	b := harness.NewBroker(t, harness.TaskConfig(2))
	mountSmall(t, b, 256<<10)
	b.Start()
	dir := harness.SharedDir(t)
	h := harness.Hold(t, b, "holder", "-d", "0")
	var ids []uint64
	for i := range 30 {
		ids = append(ids, harness.SubmitTask(t, b, nil, dir, "-d", "0", "--log", filepath.Join(dir, fmt.Sprintf("t%d.log", i)), "--", "true"))
	}
	b.Kill()
	free := testfs.Fill(t, b.StateDir)
	for round := range 2 {
		b.Start()
		if code, out := harness.ExitCode(t, b.Npurun("-d", "1", "true")); code != 0 {
			t.Errorf("round %d: npurun on a broker whose disk is full: exit %d; output:\n%s", round, code, out)
		}
		got := harness.ListTasks(t, b, nil, true)
		if len(got) != len(ids) {
			t.Fatalf("round %d: %d tasks after a restart on a full disk, want %d", round, len(got), len(ids))
		}
		for _, ti := range got {
			if ti.State != wire.StatePending {
				t.Errorf("round %d: task %d is %s, want pending", round, ti.ID, ti.State)
			}
		}
		b.Kill()
	}
	free()
	b.Start()
	h.Release()
	for _, id := range ids {
		if r := harness.WaitTask(t, b, id); r.Code != 0 {
			t.Errorf("task %d: %s", id, r)
		}
	}
}

// TestTaskNumbersInRange: a client's numbers are checked before they are
// multiplied (issue 6.5): a time limit that would wrap to a negative one
// is refused, whatever max_time says; so is a negative device count.
func TestTaskNumbersInRange(t *testing.T) {
	b := harness.StartBroker(t, harness.TaskConfig(1)+"max_time = \"1h\"\n")
	dir := t.TempDir()
	for _, sec := range []int64{9223372037, 1 << 62, 100*365*24*3600 + 1} {
		s := protoSub(dir, true, "true")
		s.TimeSec = sec
		if r, err := b.Dial().Submit(s); err == nil {
			t.Errorf("time_sec %d accepted as task %d", sec, r.ID)
		}
	}
	s := protoSub(dir, false, "true")
	s.N = -1
	if r, err := b.Dial().Submit(s); err == nil {
		t.Errorf("n = -1 accepted as task %d", r.ID)
	}
	if ts := harness.ListTasks(t, b, nil, true); len(ts) != 0 {
		t.Errorf("refused submissions left tasks: %+v", ts)
	}
	s = protoSub(dir, true, "true")
	s.TimeSec = 3600
	r, err := b.Dial().Submit(s)
	if err != nil {
		t.Fatalf("a time limit of an hour, max_time 1h: %v", err)
	}
	if ti := harness.ShowTask(t, b, r.ID); ti.TimeSec != 3600 {
		t.Errorf("task's time limit %d s, want 3600", ti.TimeSec)
	}
	endAll(t, b)
}

// TestTaskTrimFair: ended tasks are trimmed fairly (issue 6.6): another
// user's submit-and-cancel churn does not make a victim's result
// forgotten; and with nothing kept, a task after two others still runs.
func TestTaskTrimFair(t *testing.T) {
	t.Run("another user's churn", func(t *testing.T) {
		victim, attacker := harness.NewUser(t), harness.NewUser(t)
		b := harness.StartBroker(t, harness.TaskConfig(1)+"keep_ended = 4\n")
		vdir, adir := harness.UserDir(t, &victim, 0o755), harness.UserDir(t, &attacker, 0o755)
		vid := harness.SubmitTask(t, b, &victim, vdir, "--no-device", "--log", filepath.Join(vdir, "v.log"), "--", "true")
		if r := harness.WaitTask(t, b, vid); r.Code != 0 {
			t.Fatalf("victim's task: %s", r)
		}
		h := harness.Hold(t, b, "holder")
		for range 12 {
			id := harness.SubmitTask(t, b, &attacker, adir, "--log", filepath.Join(adir, "a.log"), "--", "true")
			if r := harness.RunTaskCmd(t, harness.AsUser(b.TaskSubmit("cancel", harness.IDStr(id)), &attacker, adir)); r.Code != 0 {
				t.Fatalf("attacker's cancel: %s", r)
			}
		}
		h.Release()
		endAll(t, b)
		r := harness.RunTaskCmd(t, harness.AsUser(b.TaskSubmit("show", "--json", harness.IDStr(vid)), &victim, vdir))
		if r.Code != 0 || !strings.Contains(r.Stdout, `"state":"done"`) {
			t.Errorf("the victim's task after another user's churn: %s", r)
		}
		kept := 0
		for _, ti := range harness.ListTasks(t, b, nil, true) {
			if ti.UID == attacker.UID {
				kept++
			}
		}
		if kept != 3 {
			t.Errorf("the attacker keeps %d ended tasks, want 3: keep_ended = 4 less the victim's one", kept)
		}
	})
	t.Run("--after with nothing kept", func(t *testing.T) {
		b := harness.StartBroker(t, harness.TaskConfig(1)+"keep_ended = 0\n")
		dir := t.TempDir()
		gateA, gateB := filepath.Join(dir, "gateA"), filepath.Join(dir, "gateB")
		harness.MakeFIFO(t, gateA)
		harness.MakeFIFO(t, gateB)
		m1, m2 := filepath.Join(dir, "m1"), filepath.Join(dir, "m2")
		a := harness.SubmitTask(t, b, nil, dir, "--no-device", "--log", filepath.Join(dir, "a.log"), "--", "sh", "-c", `read x < "$1"`, "sh", gateA)
		w := harness.OpenFIFO(t, gateA, os.O_WRONLY) // a runs
		b1 := harness.SubmitTask(t, b, nil, dir, "--no-device", "--after", harness.IDStr(a), "--log", filepath.Join(dir, "b.log"), "--", "sh", "-c", `read x < "$1"; touch "$2"`, "sh", gateB, m1)
		c := harness.SubmitTask(t, b, nil, dir, "--no-device", "--after", harness.IDStr(a)+","+harness.IDStr(b1), "--log", filepath.Join(dir, "c.log"), "--", "touch", m2)
		waiter := harness.StartProc(t, "wait", b.TaskSubmit("wait", harness.IDStr(c)))
		waitConnected(t, waiter.Cmd.Process.Pid)
		w.Write([]byte("a\n"))
		w.Close()
		w = harness.OpenFIFO(t, gateB, os.O_WRONLY) // b runs: a ended, and is forgotten
		w.Write([]byte("b\n"))
		w.Close()
		if code, _ := waiter.Wait(); code != 0 {
			t.Errorf("wait for the task after two others, nothing kept: exit %d; output:\n%s", code, waiter.Output())
		}
		for _, m := range []string{m1, m2} {
			if _, err := os.Stat(m); err != nil {
				t.Errorf("a task of the chain did not run: %v", err)
			}
		}
	})
	t.Run("--after named twice", func(t *testing.T) {
		b := harness.StartBroker(t, harness.TaskConfig(1))
		dir := t.TempDir()
		h := harness.Hold(t, b, "holder")
		c := b.Dial()
		a, err := c.Submit(protoSub(dir, false, "true"))
		if err != nil {
			t.Fatal(err)
		}
		s := protoSub(dir, false, "true")
		s.After = []uint64{a.ID, a.ID, a.ID}
		d, err := c.Submit(s)
		if err != nil {
			t.Fatal(err)
		}
		if ti := harness.ShowTask(t, b, d.ID); !slices.Equal(ti.After, []uint64{a.ID}) {
			t.Errorf("--after %v kept as %v, want [%d]", s.After, ti.After, a.ID)
		}
		h.Release()
		endAll(t, b)
	})
}

// journalHolds tells whether the broker's journal holds secret.
func journalHolds(t *testing.T, b *harness.Broker, secret string) bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(b.StateDir, "journal"))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Contains(data, []byte(secret))
}

// waitJournalWithout waits, on inotify events of the state directory,
// until the journal no longer holds secret.
func waitJournalWithout(t *testing.T, b *harness.Broker, secret string, within time.Duration) {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, b.StateDir, unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE|unix.IN_MODIFY); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(within)
	buf := make([]byte, 4096)
	for journalHolds(t, b, secret) {
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatalf("the journal still holds an ended task's environment %s after its end", within)
		}
		unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(left/time.Millisecond)+1)
		for {
			if _, err := unix.Read(fd, buf); err != nil {
				break
			}
		}
	}
}

// TestTaskEnvironmentForgotten: an ended task's environment leaves the
// journal by itself within seconds, and does not come back after a
// restart that replays the task's end (issue 6.7).
func TestTaskEnvironmentForgotten(t *testing.T) {
	b := harness.StartBroker(t, harness.TaskConfig(1))
	dir := t.TempDir()
	submit := func(secret string) uint64 {
		cmd := b.TaskSubmit("--json", "--no-device", "--log", filepath.Join(dir, "log"), "--", "true")
		cmd.Env = append(cmd.Env, "NPURUN_TEST_SECRET="+secret)
		r := harness.RunTaskCmd(t, harness.AsUser(cmd, nil, dir))
		var s struct{ ID uint64 }
		if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &s) != nil {
			t.Fatalf("submit: %s", r)
		}
		if w := harness.WaitTask(t, b, s.ID); w.Code != 0 {
			t.Fatalf("wait %d: %s", s.ID, w)
		}
		return s.ID
	}
	secret := randomSecret(t)
	submit(secret)
	waitJournalWithout(t, b, secret, 20*time.Second)

	secret = randomSecret(t)
	id := submit(secret)
	b.Kill() // before the journal is rewritten, most likely: the replay must drop it
	b.Start()
	ti := harness.ShowTask(t, b, id)
	if slices.ContainsFunc(ti.Env, func(kv string) bool { return strings.Contains(kv, secret) }) || len(ti.Env) != 0 {
		t.Errorf("an ended task's environment came back after a restart: %q", ti.Env)
	}
	if journalHolds(t, b, secret) {
		t.Error("the journal rewritten at start holds an ended task's environment")
	}
}

func randomSecret(t *testing.T) string {
	buf := make([]byte, 8)
	rand.Read(buf)
	return "npurun-secret-" + hex.EncodeToString(buf)
}

// TestTaskWaitingCapsApart: max_waiting_per_user counts waiting npurun
// requests, and max_queued_tasks waiting tasks; queued tasks do not keep
// their user from an interactive npurun; npurun.conf(5) says so (issue
// 6.10: it said the opposite of the code).
func TestTaskWaitingCapsApart(t *testing.T) {
	b := harness.StartBroker(t, harness.FakeConfig(1)+"[broker]\nmax_waiting_per_user = 1\n[tasks]\ncpu_slots = 1\n[limits]\nmax_queued_tasks = 3\n")
	dir := t.TempDir()
	h := harness.Hold(t, b, "holder")
	for range 3 {
		harness.SubmitTask(t, b, nil, dir, "--log", filepath.Join(dir, "log"), "--", "true")
	}
	r := harness.RunTaskCmd(t, harness.AsUser(b.TaskSubmit("--log", filepath.Join(dir, "log"), "--", "true"), nil, dir))
	if r.Code != 77 || !strings.Contains(r.Stderr, "3 tasks waiting") {
		t.Errorf("a fourth task with max_queued_tasks = 3: %s; want exit 77", r)
	}
	inline := harness.Queue(t, b, "inline", "true") // waits, beside three waiting tasks
	if code, out := harness.ExitCode(t, b.Npurun("-d", "0", "true")); code != 75 || !strings.Contains(out, "1 request waiting") {
		t.Errorf("a second waiting npurun with max_waiting_per_user = 1: exit %d, want 75 (as npurun.conf(5) says); output:\n%s", code, out)
	}
	h.Release()
	inline.MustSucceed()
	endAll(t, b)

	page, err := os.ReadFile(filepath.Join(harness.Root(), "man", "npurun.conf.5"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(page)
	i := strings.Index(text, ".BR max_waiting_per_user")
	if i < 0 {
		t.Fatal("npurun.conf(5) does not describe max_waiting_per_user")
	}
	para := text[i:]
	if j := strings.Index(para[1:], ".TP"); j >= 0 {
		para = para[:j+1]
	}
	if strings.Contains(para, "pending tasks") || !strings.Contains(para, "max_queued_tasks") || !strings.Contains(para, "status 75") {
		t.Errorf("npurun.conf(5) on max_waiting_per_user does not say what the broker does (tasks are capped by max_queued_tasks):\n%s", para)
	}
}

// prlimitNofile sets process pid's limit on open files.
func prlimitNofile(t *testing.T, pid int, soft, hard uint64) {
	t.Helper()
	lim := fmt.Sprintf("--nofile=%d:%d", soft, hard)
	if out, err := exec.Command("prlimit", "--pid", strconv.Itoa(pid), lim).CombinedOutput(); err != nil {
		t.Fatalf("prlimit %s: %v: %s", lim, err, out)
	}
}

// TestTaskOutOfDescriptors: a broker out of descriptors when a task is to
// start keeps the task pending and tries again, instead of failing it for
// good with "too many open files" (issue 6.14).
func TestTaskOutOfDescriptors(t *testing.T) {
	harness.NeedRoot(t)
	b := harness.StartBroker(t, harness.TaskConfig(1))
	dir := t.TempDir()
	pid := b.Pid()
	var orig unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &orig); err != nil {
		t.Fatal(err)
	}
	h := harness.Hold(t, b, "holder")
	c := b.Dial()
	if _, err := c.List(false); err != nil { // the broker knows who asks from now on
		t.Fatal(err)
	}
	// The limit is the lowest descriptor number free: any new one fails.
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	used := map[int]bool{}
	for _, e := range ents {
		n, _ := strconv.Atoi(e.Name())
		used[n] = true
	}
	low := 0
	for used[low] {
		low++
	}
	// The soft limit only: raising a hard limit again needs
	// CAP_SYS_RESOURCE, which root in a container may lack.
	prlimitNofile(t, pid, uint64(low), orig.Max)
	restored := false
	restore := func() {
		if !restored {
			restored = true
			prlimitNofile(t, pid, orig.Cur, orig.Max)
		}
	}
	t.Cleanup(restore)
	r, err := c.Submit(protoSub(dir, false, "true"))
	if err != nil {
		t.Fatalf("submission with the descriptors at their limit: %v", err)
	}
	mark := b.LogLen()
	h.Release()
	b.WaitLog(mark, "task starts paused")
	ti, err := c.Show(r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ti.State != wire.StatePending {
		t.Errorf("task %d that could not start for want of descriptors: %s (%q), want pending", r.ID, ti.State, ti.Reason)
	}
	restore()
	b.WaitLog(mark, "task starts resume")
	end, err := c.Wait(r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if end.State != wire.StateDone {
		t.Errorf("task %d once descriptors were back: %s (%q), want done", r.ID, end.State, end.Reason)
	}
}

// TestTaskIDsNeverRepeat: with no ended task kept, ids go on across
// restarts (issue 6.15).
func TestTaskIDsNeverRepeat(t *testing.T) {
	b := harness.StartBroker(t, harness.TaskConfig(1)+"keep_ended = 0\n")
	dir := t.TempDir()
	var last uint64
	for round := range 3 {
		c := b.Dial()
		r, err := c.Submit(protoSub(dir, true, "true"))
		if err != nil {
			t.Fatal(err)
		}
		if r.ID <= last {
			t.Fatalf("round %d: task id %d after %d", round, r.ID, last)
		}
		last = r.ID
		// Ended and forgotten, or ended when the wait comes.
		if _, err := c.Wait(r.ID); err != nil {
			var ce *wire.Error
			if !errors.As(err, &ce) || ce.Code != wire.CodeNoSuchTask {
				t.Fatal(err)
			}
		}
		// Two restarts: the first forgets the ended task in its rewrite,
		// the second starts from a journal that holds no task.
		for range 2 {
			b.Stop()
			b.Start()
		}
	}
}

// editJournal rewrites every record of the broker's journal (the broker
// stopped) with edit.
func editJournal(t *testing.T, b *harness.Broker, edit func(rec map[string]any)) {
	t.Helper()
	path := filepath.Join(b.StateDir, "journal")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 8<<20)
	for sc.Scan() {
		d := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		d.UseNumber()
		var rec map[string]any
		if err := d.Decode(&rec); err != nil {
			t.Fatal(err)
		}
		edit(rec)
		line, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		out.Write(line)
		out.WriteByte('\n')
	}
	if err := os.WriteFile(path, out.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

// shift adds d milliseconds to the number under key in m, if any.
func shift(m map[string]any, key string, d int64) {
	if n, ok := m[key].(json.Number); ok {
		v, _ := n.Int64()
		m[key] = json.Number(strconv.FormatInt(v+d, 10))
	}
}

// runningTask submits a --no-device task that runs until the test writes
// to its gate, and returns its id once it runs, with the gate open.
func runningTask(t *testing.T, b *harness.Broker, dir string, extra ...string) (uint64, *os.File) {
	t.Helper()
	gate := filepath.Join(dir, "gate")
	harness.MakeFIFO(t, gate)
	args := append([]string{"--no-device", "--log", filepath.Join(dir, "log")}, extra...)
	args = append(args, "--", "sh", "-c", `echo $PPID > "$2"; read x < "$1"; exit 7`, "sh", gate, filepath.Join(dir, "ppid"))
	id := harness.SubmitTask(t, b, nil, dir, args...)
	return id, harness.OpenFIFO(t, gate, os.O_WRONLY)
}

// TestTaskClockStep: the broker's time-limit backstop measures elapsed
// time on the monotonic clock (issue 6.16): a wall clock stepped forward
// by two hours while the broker was down (as the journal's wall-clock
// times show it) does not make it kill a task that has run seconds.
func TestTaskClockStep(t *testing.T) {
	b := harness.StartBroker(t, harness.TaskConfig(1))
	dir := t.TempDir()
	id, w := runningTask(t, b, dir, "--time", "60s")
	b.Kill()
	const step = -2 * 3600 * 1000 // what was recorded is two hours earlier than "now"
	editJournal(t, b, func(rec map[string]any) {
		shift(rec, "time", step)
		if task, ok := rec["task"].(map[string]any); ok {
			shift(task, "submitted", step)
			shift(task, "started", step)
		}
	})
	mark := b.LogLen()
	b.Start()
	log := b.Log()[mark:] // a broker logs its adoptions before it serves
	i := strings.Index(log, "the broker kills it if it runs ")
	if i < 0 {
		t.Fatalf("the restarted broker does not say when its backstop kills the task; log:\n%s", log)
	}
	left, err := time.ParseDuration(strings.Fields(log[i+len("the broker kills it if it runs "):])[0])
	if err != nil || left < 60*time.Second {
		t.Errorf("the backstop kills the task in %s (%v): fooled by the clock step, want more than its 60s limit", left, err)
	}
	if _, err := w.Write([]byte("go\n")); err != nil {
		t.Fatalf("the task is gone after the restart (killed as overrunning?): %v; log:\n%s", err, b.Log())
	}
	w.Close()
	if r := harness.WaitTask(t, b, id); r.Code != 7 {
		t.Errorf("wait: %s, want the task's own exit 7", r)
	}
	if ti := harness.ShowTask(t, b, id); ti.State != wire.StateFailed || ti.Exit == nil || *ti.Exit != 7 {
		t.Errorf("task %d: %s exit %v (%q), want failed with its exit 7, not killed", id, ti.State, ti.Exit, ti.Reason)
	}
}

// TestTaskStalePID: a running task's recorded supervisor is gone and its
// pid now names an unrelated process of the same user; the restarted
// broker marks the task lost and signals nothing it has not checked
// (issue 6.17): neither a pid whose start time differs, nor one recorded
// in another boot, even where the start time matches.
func TestTaskStalePID(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(rec map[string]any, pid int, start string)
	}{
		{"start time differs", func(rec map[string]any, pid int, start string) {
			rec["pid"] = json.Number(strconv.Itoa(pid))
		}},
		{"another boot", func(rec map[string]any, pid int, start string) {
			rec["pid"] = json.Number(strconv.Itoa(pid))
			rec["pid_start"] = json.Number(start)
			rec["boot"] = "00000000-0000-0000-0000-000000000000"
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := harness.StartBroker(t, harness.TaskConfig(1))
			dir := t.TempDir()
			id, w := runningTask(t, b, dir)
			sup := harness.ReadInt(t, filepath.Join(dir, "ppid")) // the command's parent
			b.Kill()
			// The supervisor is killed; its command ends when the gate closes.
			syscall.Kill(sup, syscall.SIGKILL)
			w.Close()
			if !harness.ProcGone(t, sup, "") {
				t.Fatal("the supervisor does not die")
			}
			// An unrelated process of the same user, leading a session.
			other := exec.Command("setsid", "sleep", "1000")
			if err := other.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { other.Process.Kill(); other.Wait() })
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", other.Process.Pid))
			if err != nil {
				t.Fatal(err)
			}
			fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
			start := fields[19] // starttime, field 22
			editJournal(t, b, func(rec map[string]any) {
				if rec["op"] == "start" {
					c.edit(rec, other.Process.Pid, start)
				}
				if task, ok := rec["task"].(map[string]any); ok && task["state"] == "running" {
					c.edit(task, other.Process.Pid, start)
				}
			})
			b.Start() // a broker kills what it kills before it serves
			if state, _ := harness.ProcState(other.Process.Pid); state == 0 || state == 'Z' || state == 'X' {
				t.Errorf("the restarted broker killed an unrelated process that reused a task's pid; log:\n%s", b.Log())
			}
			if ti := harness.ShowTask(t, b, id); ti.State != wire.StateLost {
				t.Errorf("task %d whose supervisor is gone: %s, want lost", id, ti.State)
			}
		})
	}
}

// rawSubmit sends a submission encoded without escaping <, > and & (as a
// client in another language may), and returns the broker's answer.
func rawSubmit(t *testing.T, b *harness.Broker, sub *wire.Submission) (*wire.Reply, error) {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(&wire.Request{V: wire.Version, Op: wire.OpSubmit, Task: sub}); err != nil {
		t.Fatal(err)
	}
	c := b.Dial()
	if err := wire.SendMsg(c.Fd(), bytes.TrimSpace(buf.Bytes()), nil, 0); err != nil {
		t.Fatal(err)
	}
	r, _, err := c.Recv(harness.EventTimeout)
	return r, err
}

// TestTaskEncodedSize: a submission is checked by its encoded size (issue
// 6.19): a 15 KB command of '<', sent raw, takes 90 KB as the broker
// encodes it and is refused, not accepted to break root's list and end
// lost; a smaller one runs and lists.
func TestTaskEncodedSize(t *testing.T) {
	b := harness.StartBroker(t, harness.TaskConfig(1))
	dir := t.TempDir()
	big := protoSub(dir, true, "true")
	big.Argv = nil
	big.Shell = ": '" + strings.Repeat("<", 15000) + "'"
	if r, err := rawSubmit(t, b, big); err == nil || !strings.Contains(err.Error(), "too large") {
		t.Errorf("a 15 KB command of '<': %+v, %v; want it refused as too large", r, err)
	}
	small := protoSub(dir, true, "true")
	small.Argv = nil
	small.Shell = ": '" + strings.Repeat("<", 4000) + "'"
	r, err := rawSubmit(t, b, small)
	if err != nil {
		t.Fatalf("a 4 KB command of '<': %v", err)
	}
	if w := harness.WaitTask(t, b, r.ID); w.Code != 0 {
		t.Errorf("a 4 KB command of '<': %s", w)
	}
	if ti := harness.FindTask(harness.ListTasks(t, b, nil, true), r.ID); ti == nil || ti.State != wire.StateDone {
		t.Errorf("list --all has the task as %+v, want done", ti)
	}
}

// TestTaskJournalBounded: submit-and-cancel churn does not grow the
// journal without bound (issue 6.19): it is rewritten by size.
func TestTaskJournalBounded(t *testing.T) {
	b := harness.StartBroker(t, harness.TaskConfig(1)+"keep_ended = 50\n")
	dir := t.TempDir()
	h := harness.Hold(t, b, "holder")
	c := b.Dial()
	pad := strings.Repeat("x", 30<<10)
	const cycles = 300
	for range cycles {
		s := protoSub(dir, false, "true")
		s.Env = append(s.Env, "PAD="+pad)
		r, err := c.Submit(s)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Cancel(r.ID); err != nil {
			t.Fatal(err)
		}
	}
	h.Release()
	st, err := os.Stat(filepath.Join(b.StateDir, "journal"))
	if err != nil {
		t.Fatal(err)
	}
	// 300 submissions of 30 KiB each are 8.8 MiB appended; a journal that
	// keeps 50 small ended tasks is rewritten past 4 MiB and some.
	if st.Size() > 5<<20 {
		t.Errorf("journal of %d bytes after %d submit-and-cancel cycles of 30 KiB each, keeping 50: not compacted", st.Size(), cycles)
	}
	t.Logf("journal: %d bytes", st.Size())
}

// TestTaskJournalUnavailable: a journal that cannot be opened (its state
// directory is a file) does not keep the broker from serving leases (issue
// 6.3); task operations say why they are refused, and once the directory
// can be made the broker takes up tasks by itself.
func TestTaskJournalUnavailable(t *testing.T) {
	b := harness.NewBroker(t, harness.TaskConfig(1))
	if err := os.WriteFile(b.StateDir, []byte("not a directory\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mark := b.LogLen()
	b.Start()
	if code, out := harness.ExitCode(t, b.Npurun("true")); code != 0 {
		t.Errorf("npurun on a broker whose journal cannot be opened: exit %d; output:\n%s", code, out)
	}
	dir := t.TempDir()
	r := harness.RunTaskCmd(t, harness.AsUser(b.TaskSubmit("--no-device", "--log", filepath.Join(dir, "log"), "--", "true"), nil, dir))
	if r.Code == 0 || !strings.Contains(r.Stderr, "tasks are unavailable") || !strings.Contains(r.Stderr, "not a directory") {
		t.Errorf("task-submit on a broker whose journal cannot be opened: %s; want it refused, saying why", r)
	}
	if err := os.Remove(b.StateDir); err != nil {
		t.Fatal(err)
	}
	b.WaitLog(mark, "tasks available again")
	id := harness.SubmitTask(t, b, nil, dir, "--no-device", "--log", filepath.Join(dir, "log"), "--", "true")
	if w := harness.WaitTask(t, b, id); w.Code != 0 {
		t.Errorf("a task once the journal could be opened: %s", w)
	}
}
