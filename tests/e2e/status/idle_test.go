package status

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// idleConf is the [idle] policy of the tests: reclaim after 3s idle, a
// warning 2s ahead, SIGKILL 1s after SIGTERM.
const idleConf = "\n[idle]\nafter = \"3s\"\naction = \"reclaim\"\nwarn_before = \"2s\"\n\n[tasks]\nkill_grace = \"1s\"\n"

// ttyProc is a process on a terminal of its own (a pty whose master the
// test reads), as a user's command on their ssh terminal.
type ttyProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error

	mu  sync.Mutex
	out bytes.Buffer
	got chan struct{} // closed and replaced at each read
}

// startOnTTY starts cmd in a session of its own, with a new pty as its
// controlling terminal and standard streams.
func startOnTTY(t *testing.T, cmd *exec.Cmd) *ttyProc {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = s, s, s
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	err = cmd.Start()
	s.Close()
	if err != nil {
		t.Fatal(err)
	}
	p := &ttyProc{cmd: cmd, done: make(chan struct{}), got: make(chan struct{})}
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := m.Read(buf)
			p.mu.Lock()
			p.out.Write(buf[:k])
			close(p.got)
			p.got = make(chan struct{})
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// output is what the terminal showed so far.
func (p *ttyProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// wait waits for the terminal to show text matching re, and returns the
// match's groups.
func (p *ttyProc) wait(t *testing.T, re string) []string {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.After(harness.EventTimeout)
	for {
		p.mu.Lock()
		m, ch := rx.FindStringSubmatch(p.out.String()), p.got
		p.mu.Unlock()
		if m != nil {
			return m
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("the terminal did not show %s; it shows:\n%s", re, p.output())
		}
	}
}

// signal waits for the process to exit and returns the signal that ended
// it (0: it exited).
func (p *ttyProc) signal(t *testing.T) syscall.Signal {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(harness.EventTimeout):
		t.Fatalf("%s did not exit; terminal:\n%s", p.cmd.Path, p.output())
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		if ws := ee.Sys().(syscall.WaitStatus); ws.Signaled() {
			return ws.Signal()
		}
	}
	return 0
}

// gone tells whether process pid has gone, waiting for it a while.
func gone(pid int) bool {
	harness.AwaitReaped(pid, time.Now().Add(harness.EventTimeout))
	return unix.Kill(pid, 0) == unix.ESRCH
}

// metricsOf scrapes broker b's metrics endpoint.
func metricsOf(t *testing.T, b *harness.Broker) string {
	t.Helper()
	m := regexp.MustCompile(`metrics on (http://\S+/metrics)`).FindStringSubmatch(b.Log())
	if m == nil {
		t.Fatalf("no metrics address in the broker log:\n%s", b.Log())
	}
	resp, err := http.Get(m[1])
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// TestIdleReclaim: with [idle] after = 3s, action = "reclaim",
// warn_before = 2s, a lease whose device every sample finds idle is
// warned once, on its terminal and in the log, at after - warn_before,
// marked in status, and reclaimed at after: its processes, a setsid
// child included, SIGTERM'd, npurun's command killed by it (the shell's
// 143), the log saying why and the metric counting it. Beside it, in the
// same time: a busy lease, a lease of one busy and one idle device, a
// lease of a device whose utilization is unknown and a task's lease on
// an idle device ([idle] kinds: inline and login by default) are not
// touched.
func TestIdleReclaim(t *testing.T) {
	u := newUtilFiles(t)
	u.set(0, "0")
	u.set(1, "90")
	u.set(2, "1")
	u.set(3, "60")
	// npu4: no file: unknown
	u.set(5, "0")
	b := harness.StartBroker(t, harness.FakeConfig(6)+u.conf()+"\n[broker]\nmetrics_listen = \"127.0.0.1:0\"\n"+idleConf)

	busy := harness.Hold(t, b, "busy", "-d", "1")
	mixed := harness.Hold(t, b, "mixed", "-d", "2,3")
	unknown := harness.Hold(t, b, "unknown", "-d", "4")
	sub, err := b.TaskSubmit("-d", "5", "--json", "--", "sleep", "1000").Output()
	if err != nil {
		t.Fatalf("task-submit: %v\n%s", err, harness.StderrOf(err))
	}
	var task struct{ ID uint64 }
	if err := json.Unmarshal(sub, &task); err != nil || task.ID == 0 {
		t.Fatalf("task-submit --json: %v\n%s", err, sub)
	}
	harness.WaitBoard(t, b, func(x *wire.Board) bool { l := leaseOn(x, 5); return l != nil && l.Kind == wire.KindTask })

	idle := startOnTTY(t, b.Npurun("-d", "0", "sh", "-c", `setsid sleep 1000 & echo "child $!"; wait`))
	child, _ := strconv.Atoi(idle.wait(t, `child ([0-9]+)`)[1])

	// The warning: once, at after - warn_before, on the terminal and in
	// the log; status marks when the lease ends.
	b.WaitLog(0, "been idle (under 5%) for ")
	warned := idle.wait(t, `npurun: npu0 has been idle \(under 5%\) for [0-9]+s; its lease ends at ([0-9:]+) unless it is used \(npurun\.conf: \[idle\]\)`)
	bd := b.Board(t)
	if l := leaseOn(bd, 0); l != nil && l.Reclaimed == 0 && (l.IdleAction != "reclaim" || !l.Warned || l.IdleEnds == 0 ||
		time.UnixMilli(l.IdleEnds).Format("15:04:05") != warned[1]) {
		t.Errorf("the warned lease on the board: action %q, warned %v, ends %d; the warning said %s", l.IdleAction, l.Warned, l.IdleEnds, warned[1])
	}

	if out := b.Status(t); !regexp.MustCompile(`(?m)^npu0 +default +(leased .* idle [0-9]+s, reclaim(ed)? at [0-9:]+|free .*)$`).MatchString(out) {
		t.Errorf("status does not mark the warned lease:\n%s", out)
	}

	// The reclaim: the log says why, the processes get SIGTERM.
	b.WaitLog(0, "on npu0 for ")
	b.WaitLog(0, "is reclaimed ([idle] after = 3s)")
	if sig := idle.signal(t); sig != syscall.SIGTERM {
		t.Errorf("npurun's command ended by signal %v, want SIGTERM (a shell's 143); terminal:\n%s", sig, idle.output())
	}
	if !gone(child) {
		t.Errorf("the setsid child %d outlived the reclaim", child)
	}
	idle.wait(t, `npurun: npu0 has been idle \(under 5%\) for [0-9]+s: its lease is reclaimed and its processes ended \(npurun\.conf: \[idle\]\)`)
	if n := strings.Count(idle.output(), "its lease ends at"); n != 1 {
		t.Errorf("warned %d times on the terminal, want once:\n%s", n, idle.output())
	}
	if n := strings.Count(b.Log(), "its holders are warned"); n != 1 {
		t.Errorf("warned %d times in the log, want once:\n%s", n, b.Log())
	}
	if !regexp.MustCompile(`is reclaimed \(\[idle\] after = 3s\): pid [0-9]+ \(.*\) still holds its lease of npu 0: sent SIGTERM`).MatchString(b.Log()) {
		t.Errorf("the log does not say whom the reclaim signalled, and why:\n%s", b.Log())
	}
	if out := b.Status(t); !regexp.MustCompile(`(?m)^npu0 +default +free `).MatchString(out) {
		t.Errorf("npu0 not free after the reclaim:\n%s", out)
	}

	// Two more samples: the others are held still, never warned.
	nextSamples(t, b, b.Board(t), 2)
	for _, h := range []harness.Holder{busy, mixed, unknown} {
		if h.Exited() {
			t.Errorf("%s's lease ended: %s", h.Name, h.Output())
		}
	}
	bd = b.Board(t)
	if l := leaseOn(bd, 5); l == nil || l.Kind != wire.KindTask {
		t.Errorf("the task's lease on idle npu5 is gone: %+v", l)
	}
	for _, id := range []int{1, 2, 4, 5} {
		if l := leaseOn(bd, id); l != nil && (l.Warned || l.Reclaimed != 0 || l.IdleEnds != 0) {
			t.Errorf("npu%d's lease under the policy: %+v", id, l)
		}
	}
	if n := len(regexp.MustCompile(`(?m)is reclaimed \(\[idle\] after = 3s\)$`).FindAllString(b.Log(), -1)); n != 1 {
		t.Errorf("%d reclaims logged, want 1:\n%s", n, b.Log())
	}
	if !regexp.MustCompile(`(?m)^npurun_idle_reclaimed_total\{user="root"\} 1$`).MatchString(metricsOf(t, b)) {
		t.Errorf("metrics lack npurun_idle_reclaimed_total{user=\"root\"} 1:\n%s", metricsOf(t, b))
	}
	busy.Release()
	mixed.Release()
	unknown.Release()
	harness.ExitCode(t, b.TaskSubmit("cancel", strconv.FormatUint(task.ID, 10)))
}

// TestIdleBusyRestarts: a lease whose device turns busy before after is
// not reclaimed for the idle run before: its clock starts again, and so
// does its warning.
func TestIdleBusyRestarts(t *testing.T) {
	u := newUtilFiles(t)
	u.set(0, "0")
	b := harness.StartBroker(t, harness.FakeConfig(1)+u.conf()+idleConf)
	h := harness.Hold(t, b, "h", "-d", "0")
	mark := b.WaitLog(0, "its holders are warned")
	u.set(0, "80")
	harness.WaitBoard(t, b, func(x *wire.Board) bool { l := leaseOn(x, 0); return l != nil && is(l.Util, 80) })
	// Busy for as long as after: no reclaim.
	bd := nextSamples(t, b, b.Board(t), 4)
	if l := leaseOn(bd, 0); l == nil || l.IdleSince != 0 || l.Warned {
		t.Fatalf("busy lease: %+v", l)
	}
	if strings.Contains(b.Log(), "is reclaimed") || h.Exited() {
		t.Fatalf("a lease busy since its warning was reclaimed:\n%s", b.Log())
	}
	// Idle again: a new run, warned again.
	u.set(0, "0")
	b.WaitLog(mark, "its holders are warned")
	b.WaitLog(mark, "is reclaimed")
	if code, sig := h.Wait(); sig != syscall.SIGTERM {
		t.Errorf("holder: exit %d, signal %v; want SIGTERM", code, sig)
	}
}

// TestIdleReloadAfter: a reload that changes [idle] after applies to a
// lease held: idle under after = 1h, it is reclaimed once after is 3s.
func TestIdleReloadAfter(t *testing.T) {
	u := newUtilFiles(t)
	u.set(0, "0")
	conf := func(after string) string {
		return harness.FakeConfig(1) + u.conf() + strings.Replace(idleConf, `after = "3s"`, `after = "`+after+`"`, 1)
	}
	b := harness.StartBroker(t, conf("1h"))
	h := harness.Hold(t, b, "h", "-d", "0")
	bd := harness.WaitBoard(t, b, func(x *wire.Board) bool { l := leaseOn(x, 0); return l != nil && l.IdleEnds > 0 })
	l := leaseOn(bd, 0)
	if got := time.UnixMilli(l.IdleEnds).Sub(time.UnixMilli(l.IdleSince)); got != time.Hour {
		t.Errorf("ends %v after its idle start, want 1h", got)
	}
	if l.Warned {
		t.Errorf("warned 1h ahead of a 2s warn_before")
	}
	harness.WriteConf(t, b, conf("3s"))
	if code, _, out := harness.Reload(t, b); code != 0 {
		t.Fatalf("reload: exit %d: %s", code, out)
	}
	b.WaitLog(0, "is reclaimed ([idle] after = 3s)")
	if _, sig := h.Wait(); sig != syscall.SIGTERM {
		t.Errorf("holder not ended by SIGTERM: %v", sig)
	}
}

// TestIdleReclaimLogin: a restricted account's login lease reclaimed
// loses the device (its ACL entry goes, the device is free) and keeps
// the login (its shell runs on); a device whose npu-smi fails is never
// reclaimed.
func TestIdleReclaimLogin(t *testing.T) {
	dev := harness.NewDevTree(t, 2)
	student := harness.NewUser(t)
	dir := harness.SharedDir(t)
	busy, err := os.ReadFile(filepath.Join(harness.Root(), "npu", "testdata", "usages", "910b-busy.txt"))
	if err != nil {
		t.Fatal(err)
	}
	// The 910B's layout, its compute (AI Core, AI Vector) at 0%.
	idleOut := regexp.MustCompile(`(Ai(core|vector) Usage Rate\(%\) *: )[0-9]+`).ReplaceAllString(string(busy), "${1}0")
	if strings.Count(idleOut, ": 0\n") < 2 {
		t.Fatalf("no AI Core and Vector lines to change in 910b-busy.txt:\n%s", idleOut)
	}
	if err := os.WriteFile(filepath.Join(dir, "idle.txt"), []byte(idleOut), 0o644); err != nil {
		t.Fatal(err)
	}
	smi := filepath.Join(dir, "npu-smi")
	script := `#!/bin/sh
[ "$1 $2 $3 $4 $6 $7" = "info -t usages -i -c 0" ] || exit 2
case $5 in
0) exec cat ` + filepath.Join(dir, "idle.txt") + ` ;;
*) echo "dcmi module initialize failed" >&2; exit 1 ;;
esac
`
	if err := os.WriteFile(smi, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	conf := dev.Config("0-1", fmt.Sprintf("[restrict]\nusers = [%q]\nlogin_devices = 1\n\n[status]\nutil_interval = \"1s\"\n", student.Name)+idleConf)
	conf = strings.Replace(conf, filepath.Join(dev.Dir, "no-npu-smi"), smi, 1)
	b := harness.StartBroker(t, conf)

	// npu1's npu-smi fails: an inline lease of it is never reclaimed.
	other := harness.Hold(t, b, "unknown", "-d", "1")
	defer other.Release()

	cmd := student.As(b.Npurun("--login"), b.Dir)
	cmd.Env = append(cmd.Env, "SHELL=/bin/sh", "HOME=/", "USER="+student.Name)
	login := harness.StartProc(t, "login", cmd)
	if _, err := login.Stdin.Write([]byte("echo \"in $NPURUN_DEVICES\"; read x; echo \"still here\"; exit 0\n")); err != nil {
		t.Fatal(err)
	}
	login.WaitLine("in 0")
	if !harness.CanOpen(t, student, dev.Node("davinci0")) {
		t.Fatal("the login's lease does not open davinci0")
	}
	b.WaitLog(0, "is reclaimed ([idle] after = 3s)")
	harness.WaitFree(t, b, 0)
	if harness.CanOpen(t, student, dev.Node("davinci0")) {
		t.Error("davinci0 opens for the student after its login's lease was reclaimed")
	}
	if _, err := login.Stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	login.WaitLine("still here")
	login.MustSucceed()
	nextSamples(t, b, b.Board(t), 2)
	if other.Exited() || len(regexp.MustCompile(`(?m)is reclaimed \(\[idle\] after = 3s\)$`).FindAllString(b.Log(), -1)) != 1 {
		t.Errorf("the lease of npu1, whose utilization is unknown, was reclaimed:\n%s", b.Log())
	}
}

// TestIdleUsage: npubroker usage sums what the samples said: a lease at
// 40% and a lease idle until it is reclaimed give a busy share between
// them, idle device-hours of at least the reclaimed one's window, one
// lease reclaimed; the accounting log's end says "reclaimed".
func TestIdleUsage(t *testing.T) {
	u := newUtilFiles(t)
	u.set(0, "40")
	u.set(1, "0")
	b := harness.StartBroker(t, harness.FakeConfig(2)+u.conf()+idleConf)
	busy := harness.Hold(t, b, "busy", "-d", "0")
	idle := harness.Hold(t, b, "idle", "-d", "1")
	b.WaitLog(0, "is reclaimed ([idle] after = 3s)")
	if _, sig := idle.Wait(); sig != syscall.SIGTERM {
		t.Errorf("the idle lease's holder: signal %v, want SIGTERM", sig)
	}
	harness.WaitBoard(t, b, func(x *wire.Board) bool { return leaseOn(x, 1) == nil })
	busy.Release()
	harness.WaitBoard(t, b, func(x *wire.Board) bool { return leaseOn(x, 0) == nil })

	rep := usageReport(t, b, "--since", "1h")
	if len(rep.Rows) != 1 || !rep.Sampled {
		t.Fatalf("usage: %+v", rep)
	}
	r := rep.Rows[0]
	if r.Leases != 2 || r.Reclaimed != 1 || r.Busy == nil || !(*r.Busy > 0 && *r.Busy < 40) || r.IdleDeviceHours < 3.0/3600 || r.IdleDeviceHours > r.DeviceHours {
		t.Errorf("usage row: %+v (busy %v); want 2 leases, 1 reclaimed, busy between 0 and 40%%, idle at least 3s", r, r.Busy)
	}
	log, err := os.ReadFile(filepath.Join(b.StateDir, "usage.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`"ev":"end".*"device":1,"how":"reclaimed".*"util":0,"idle_ms":[0-9]+`).Match(log) ||
		!regexp.MustCompile(`"ev":"end".*"device":0,"how":"released".*"util":40[,}]`).Match(log) {
		t.Errorf("usage.log's ends lack the figures and how:\n%s", log)
	}
	out, err := exec.Command(b.Bin.Broker, "usage", "--since", "1h", "--socket", b.Socket).Output()
	if err != nil {
		t.Fatalf("npubroker usage: %v", err)
	}
	if !regexp.MustCompile(`(?m)^USER +KIND +POOL +LEASES +DEVICE-HOURS +BUSY +IDLE-HOURS +RECLAIMED$`).Match(out) ||
		!regexp.MustCompile(`(?m)^\S+ +inline +default +2 +[0-9.]+ +[0-9]+% +[0-9.]+ +1$`).Match(out) {
		t.Errorf("usage table:\n%s", out)
	}

	// --by device: the same figures, per device, adding up to the user's.
	dev := usageReport(t, b, "--since", "1h", "--by", "device")
	if dev.By != wire.UsageByDevice || len(dev.Rows) != 2 || !dev.Sampled {
		t.Fatalf("usage --by device: %+v", dev)
	}
	d0, d1 := dev.Rows[0], dev.Rows[1]
	if d0.Device != "npu0" || d0.User != "" || d0.Leases != 1 || d0.Reclaimed != 0 || !is(d0.Busy, 40) || d0.IdleDeviceHours != 0 {
		t.Errorf("npu0's row: %+v (busy %v); want 1 lease, 40%% busy, not idle, not reclaimed", d0, d0.Busy)
	}
	if d1.Device != "npu1" || d1.Leases != 1 || d1.Reclaimed != 1 || !is(d1.Busy, 0) || d1.IdleDeviceHours < 3.0/3600 {
		t.Errorf("npu1's row: %+v (busy %v); want 1 lease, 0%% busy, idle at least 3s, reclaimed", d1, d1.Busy)
	}
	if sum := d0.DeviceSeconds + d1.DeviceSeconds; sum < r.DeviceSeconds*0.99 || sum > r.DeviceSeconds*1.01+1 {
		t.Errorf("by device %v s, by user %v s", sum, r.DeviceSeconds)
	}
	out, err = exec.Command(b.Bin.Broker, "usage", "--since", "1h", "--by", "device", "--socket", b.Socket).Output()
	if err != nil {
		t.Fatalf("npubroker usage --by device: %v", err)
	}
	if !regexp.MustCompile(`(?m)^DEVICE +POOL +LEASES +DEVICE-HOURS +BUSY +IDLE-HOURS +RECLAIMED$`).Match(out) ||
		!regexp.MustCompile(`(?m)^npu0 +default +1 +[0-9.]+ +40% +0\.00 +0$`).Match(out) ||
		!regexp.MustCompile(`(?m)^npu1 +default +1 +[0-9.]+ +0% +[0-9.]+ +1$`).Match(out) ||
		!regexp.MustCompile(`(?m)^TOTAL +2 +[0-9.]+ +[0-9.]+ +1$`).Match(out) {
		t.Errorf("usage --by device table:\n%s", out)
	}
	cmd := exec.Command(b.Bin.Broker, "usage", "--by", "pool", "--socket", b.Socket)
	if code, msg := harness.ExitCode(t, cmd); code != 2 || !strings.Contains(msg, `npubroker: bad value "pool" for --by: want user or device`) {
		t.Errorf("usage --by pool: exit %d, %q; want 2 and the values", code, msg)
	}
}

// TestIdleWarnOnly: [user.NAME] idle_action = "warn" overrides [idle]
// action = "reclaim" for that user: the lease is warned once, logged
// once past after, marked, and never ended.
func TestIdleWarnOnly(t *testing.T) {
	u := newUtilFiles(t)
	u.set(0, "0")
	b := harness.StartBroker(t, harness.FakeConfig(1)+u.conf()+idleConf+"\n[user.root]\nidle_action = \"warn\"\n")
	h := harness.Hold(t, b, "h", "-d", "0")
	b.WaitLog(0, "its holders are warned")
	b.WaitLog(0, "([idle] after = 3s, action = warn)")
	bd := nextSamples(t, b, b.Board(t), 3)
	if l := leaseOn(bd, 0); l == nil || l.IdleAction != "warn" || !l.Warned || l.IdleEnds != 0 || l.Reclaimed != 0 {
		t.Errorf("the warned lease: %+v", l)
	}
	if !regexp.MustCompile(`(?m)^npu0 +default +leased .* idle [0-9]+s, warned$`).MatchString(b.Status(t)) {
		t.Errorf("status does not mark the lease warned:\n%s", b.Status(t))
	}
	if h.Exited() || strings.Contains(b.Log(), "is reclaimed") || strings.Count(b.Log(), "its holders are warned") != 1 || strings.Count(b.Log(), "action = warn)") != 1 {
		t.Errorf("a lease under action = \"warn\" was ended, or warned or logged more than once:\n%s", b.Log())
	}
	h.Release()
}
