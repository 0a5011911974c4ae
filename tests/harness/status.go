package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/wire"
)

// DrainCmd runs `npubroker ARGS` (drain, undrain) against the broker and
// returns its status, standard output and standard error.
func DrainCmd(t testing.TB, b *Broker, as func(*exec.Cmd) *exec.Cmd, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(b.Bin.Broker, args...)
	cmd.Env = b.Env()
	if as != nil {
		cmd = as(cmd)
	}
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return code, out.String(), errb.String()
}

// WaitBoard waits for a board that satisfies ok, through a status watch.
func WaitBoard(t testing.TB, b *Broker, ok func(*wire.Board) bool) *wire.Board {
	t.Helper()
	w := WatchBoards(t, b, nil) // ended at the test's end
	got, _ := w.Next("the board wanted", ok)
	return got
}

// Status runs `npubroker status ARGS` against the broker and returns its
// output, failing the test unless it exits 0.
func (b *Broker) Status(t testing.TB, args ...string) string {
	t.Helper()
	cmd := exec.Command(b.Bin.Broker, append([]string{"status"}, args...)...)
	cmd.Env = b.Env()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("npubroker status %s: %v\n%s", strings.Join(args, " "), err, StderrOf(err))
	}
	return string(out)
}

func StderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}

// Board runs `npubroker status --json` and parses what it printed.
func (b *Broker) Board(t testing.TB) *wire.Board {
	t.Helper()
	var board wire.Board
	out := b.Status(t, "--json")
	if err := json.Unmarshal([]byte(out), &board); err != nil {
		t.Fatalf("status --json printed what does not parse: %v\n%s", err, out)
	}
	return &board
}

// watcher is an `npubroker status --watch --json`: one board a line.
type watcher struct {
	*Proc
	seen int // lines read so far
}

// WatchBoards starts a status watch against the broker.
func WatchBoards(t testing.TB, b *Broker, as func(*exec.Cmd) *exec.Cmd) *watcher {
	t.Helper()
	cmd := exec.Command(b.Bin.Broker, "status", "--watch", "--json")
	cmd.Env = b.Env()
	if as != nil {
		cmd = as(cmd)
	}
	return &watcher{Proc: StartProc(t, "status --watch", cmd)}
}

// Next waits for the next board of the watch that satisfies ok and
// returns it, with every board before it (those that did not).
func (w *watcher) Next(what string, ok func(*wire.Board) bool) (*wire.Board, []*wire.Board) {
	w.t.Helper()
	return w.NextWithin(EventTimeout, what, ok)
}

// NextWithin is next with a time limit of its own, for events that come
// slowly by design (a background scan on a machine with many processes).
func (w *watcher) NextWithin(limit time.Duration, what string, ok func(*wire.Board) bool) (*wire.Board, []*wire.Board) {
	w.t.Helper()
	var before []*wire.Board
	deadline := time.After(limit)
	for {
		w.mu.Lock()
		lines, ch := w.lines, w.notify
		w.mu.Unlock()
		for ; w.seen < len(lines); w.seen++ {
			var b wire.Board
			if err := json.Unmarshal([]byte(lines[w.seen]), &b); err != nil {
				w.t.Fatalf("status --watch --json printed a line that does not parse: %v\n%s", err, lines[w.seen])
			}
			if ok(&b) {
				w.seen++
				return &b, before
			}
			before = append(before, &b)
		}
		select {
		case <-ch:
		case <-w.OutDone:
			w.t.Fatalf("status --watch ended before %s:\n%s", what, w.Output())
		case <-deadline:
			last := "no board"
			if n := len(before); n > 0 {
				j, _ := json.Marshal(before[n-1])
				last = string(j)
			}
			w.t.Fatalf("no board with %s within %s; last one:\n%s", what, limit, last)
		}
	}
}

// Device returns the board's device id.
func Device(t testing.TB, b *wire.Board, id int) wire.DeviceState {
	t.Helper()
	for _, d := range b.Devices {
		if d.ID == id {
			return d
		}
	}
	t.Fatalf("no device %d on the board", id)
	return wire.DeviceState{}
}

// HolderPIDs are the pids the board shows holding device id.
func HolderPIDs(b *wire.Board, id int) []int {
	for _, d := range b.Devices {
		if d.ID == id && d.Lease != nil {
			var pids []int
			for _, h := range d.Lease.Holders {
				pids = append(pids, h.PID)
			}
			slices.Sort(pids)
			return pids
		}
	}
	return nil
}

// HolderOf returns the board's holder pid of device id, or fails.
func HolderOf(t testing.TB, b *wire.Board, id, pid int) wire.Holder {
	t.Helper()
	d := Device(t, b, id)
	if d.Lease == nil {
		t.Fatalf("npu %d has no lease: %+v", id, d)
	}
	for _, h := range d.Lease.Holders {
		if h.PID == pid {
			return h
		}
	}
	t.Fatalf("npu %d: pid %d is not among the holders %v", id, pid, HolderPIDs(b, id))
	return wire.Holder{}
}

// UnleasedPIDs are the pids reported using device id without a lease.
func UnleasedPIDs(b *wire.Board, id int) []int {
	var pids []int
	for _, u := range b.Unleased {
		if u.Device == id {
			pids = append(pids, u.PID)
		}
	}
	return pids
}

// FakeDev makes a device directory of real character nodes davinci0..n-1
// (n at most 4) and Ascend's control nodes (mknod; root only), each with a
// device number of its own, as real ones have: the broker knows a node by
// its number, whatever path a process reached it by. davinci0..3 are
// memory devices that anyone may open and no daemon keeps open (full,
// zero, random, urandom, in turn: davinci1, /dev/zero's kind, may be
// mapped); the control nodes take those the devices leave, davinci_manager
// first, then numbers of major 60 (local use: no driver, so they cannot
// be opened).
func FakeDev(t testing.TB, n int) string {
	t.Helper()
	openable := []uint64{unix.Mkdev(1, 7), unix.Mkdev(1, 5), unix.Mkdev(1, 8), unix.Mkdev(1, 9)}
	if n > len(openable) {
		t.Fatalf("fakeDev: %d devices, at most %d have numbers of their own", n, len(openable))
	}
	nodes := map[string]uint64{}
	for i := range n {
		nodes["davinci"+strconv.Itoa(i)] = openable[i]
	}
	spare := openable[n:]
	for i, name := range []string{"davinci_manager", "devmm_svm", "hisi_hdc"} {
		if i < len(spare) {
			nodes[name] = spare[i]
		} else {
			nodes[name] = unix.Mkdev(60, uint32(i))
		}
	}
	return MkNodes(t, nodes)
}

// MkNodes makes a device directory of character nodes, mode 0666, by name
// and device number (mknod; root only).
func MkNodes(t testing.TB, nodes map[string]uint64) string {
	t.Helper()
	NeedRoot(t)
	dir := filepath.Join(SharedDir(t), "dev")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, number := range nodes {
		p := filepath.Join(dir, name)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(number)); err != nil {
			t.Fatalf("mknod %s: %v", p, err)
		}
		if err := os.Chmod(p, 0o666); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// AscendConfig is a configuration for the fake device tree dev: vendor
// ascend, n devices, no npu-smi, and extra appended.
func AscendConfig(dev string, n int, extra string) string {
	return fmt.Sprintf("[devices]\nvendor = \"ascend\"\nids = \"0-%d\"\ndev_dir = %q\nnpu_smi = \"/nonexistent/npu-smi\"\n%s", n-1, dev, extra)
}

// PIDOf reads a "WORD PID" line that a shell script printed.
func PIDOf(t testing.TB, line string) int {
	t.Helper()
	f := strings.Fields(line)
	pid, err := strconv.Atoi(f[len(f)-1])
	if err != nil {
		t.Fatalf("no pid in %q", line)
	}
	return pid
}

// Me is the name of the user the tests run as.
func Me(t testing.TB) string {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	return u.Username
}

// LineWith returns the line of text that contains substr.
func LineWith(text, substr string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			return l
		}
	}
	return ""
}

// LineWithField returns the first line of text that has field as one of
// its whitespace-separated fields: a table's row of a pid, which a path
// or an id elsewhere in the table may hold among its digits.
func LineWithField(text, field string) string {
	for _, l := range strings.Split(text, "\n") {
		if slices.Contains(strings.Fields(l), field) {
			return l
		}
	}
	return ""
}
