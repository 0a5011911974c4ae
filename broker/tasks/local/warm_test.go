package local

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/npurun/npurun/broker/tasks"
	"github.com/npurun/npurun/broker/tasks/journal"
	"github.com/npurun/npurun/wire"
)

// testHost is a room as the runner sees it (tasks.Host) that knows every
// task and is never paused.
type testHost struct {
	sync.Mutex
	gone []uint64
}

func (h *testHost) Gone(t *tasks.Task, _ int)    { h.gone = append(h.gone, t.ID) }
func (h *testHost) Paused() bool                 { return false }
func (h *testHost) Known(uint64) bool            { return true }
func (h *testHost) Lookup(uint32) *tasks.Account { return nil }

// TestWarmStartsASupervisor: Warm, for each task the room warms (the
// first unheld task of each pool: the room's side is tasks'
// TestWarmFirstTaskOfEachPool), starts a real supervisor, which is ready
// with a pid and no error, and exits having run nothing once its socket
// closes.
func TestWarmStartsASupervisor(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, wire.SupervisorName)
	build := exec.Command("go", "build", "-o", bin, "../../../cmd/npurun-supervise")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the supervisor: %v\n%s", err, out)
	}
	sb, err := findSupervisor(filepath.Join(dir, "npubroker"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.f.Close() })
	h := &testHost{}
	l := newLocal(h, "", "", nil)
	l.supBin, l.unpriv = sb, true

	names := []string{"firstC", "firstI", "firstQ"}
	byName := map[string]*tasks.Task{}
	var readies []func()
	h.Lock()
	for i, name := range names {
		tk := &journal.Task{ID: uint64(i + 1), UID: uint32(os.Geteuid()), User: name, Slot: -1,
			Argv: []string{"/bin/true"}, Log: filepath.Join(dir, name+".log"), Sub: wire.Submission{Cwd: "/"}}
		task := &tasks.Task{Task: tk}
		byName[name] = task
		spec := &wire.Spec{ID: tk.ID, UID: tk.UID, Argv: tk.Argv, Cwd: "/", Log: tk.Log}
		ready, ok := l.Warm(task, func() *wire.Spec { return spec })
		if !ok {
			t.Fatalf("%s: not warmed", name)
		}
		readies = append(readies, ready)
	}
	warm := len(l.warm)
	sups := map[*tasks.Task]*supervisor{}
	for tk, sup := range l.warm {
		sups[tk] = sup
	}
	h.Unlock()
	for _, ready := range readies {
		go ready()
	}

	var got []string
	for _, name := range names {
		sup := sups[byName[name]]
		if sup == nil {
			continue
		}
		got = append(got, name)
		<-sup.ready
		if sup.err != nil || sup.pid <= 0 {
			t.Errorf("%s: supervisor pid %d: %v", name, sup.pid, sup.err)
		}
		if sup.sock != nil {
			sup.sock.Close() // it exits having run nothing
		}
		<-sup.exited
	}
	slices.Sort(got)
	if !slices.Equal(got, names) || warm != len(names) {
		t.Errorf("warmed %v (count %d), want %v", got, warm, names)
	}
}
