package tasks

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// The first task waiting for a device is armed (broker/tasks/journal): its warm
// supervisor is ready and a durable arm record names this boot, so that
// its start record, when the device frees, need only be written, not
// synced, before the go-ahead. These tests restart the broker with such a
// task waiting behind a running one and check that it runs at most once:
// after a crash of the machine (the arm record's boot edited to another)
// it fails without running; after the broker's own crash, or a clean stop
// followed by a crash of the machine, it waits and then runs.
func TestTaskArmedRestart(t *testing.T) {
	for _, c := range []struct {
		name   string
		stop   func(b *harness.Broker)
		reboot bool // the arm records are edited to name another boot
		runs   bool // B runs after the restart
	}{
		{"machine crash", (*harness.Broker).Kill, true, false},
		{"broker crash", (*harness.Broker).Kill, false, true},
		{"clean stop, then machine crash", (*harness.Broker).Stop, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := harness.StartBroker(t, harness.TaskConfig(1))
			dir := t.TempDir()
			gate, mark := filepath.Join(dir, "gate"), filepath.Join(dir, "b-ran")
			harness.MakeFIFO(t, gate)
			a := harness.SubmitTask(t, b, nil, dir, "--log", filepath.Join(dir, "a.log"), "--", "sh", "-c", `read x < "$1"`, "sh", gate)
			w := harness.OpenFIFO(t, gate, os.O_WRONLY) // A holds the only device
			bid := harness.SubmitTask(t, b, nil, dir, "--log", filepath.Join(dir, "b.log"), "--", "sh", "-c", `echo ran >> "$1"`, "sh", mark)
			awaitArmed(t, b, bid)
			c.stop(b)
			if c.reboot {
				editJournal(t, b, func(rec map[string]any) {
					const other = "00000000-0000-0000-0000-000000000000"
					if rec["op"] == "arm" {
						rec["boot"] = other
					}
					if task, ok := rec["task"].(map[string]any); ok && task["arm_boot"] != nil {
						task["arm_boot"] = other
					}
				})
			}
			b.Start()
			if !c.runs {
				ti := harness.ShowTask(t, b, bid)
				if ti.State != wire.StateFailed || !strings.Contains(ti.Reason, "may have been starting") {
					t.Errorf("task B armed before the machine's crash: %s (%q), want failed: it may have started", ti.State, ti.Reason)
				}
			}
			if _, err := w.Write([]byte("go\n")); err != nil {
				t.Fatalf("task A is gone after the restart: %v", err)
			}
			w.Close() // A ends; its device goes to B, if B still waits
			if r := harness.WaitTask(t, b, a); r.Code != 0 {
				t.Errorf("wait A: %s", r)
			}
			r := harness.WaitTask(t, b, bid)
			data, err := os.ReadFile(mark)
			switch {
			case c.runs && (r.Code != 0 || string(data) != "ran\n"):
				t.Errorf("task B: wait %s; its command wrote %q (%v), want it run once", r, data, err)
			case !c.runs && !errors.Is(err, fs.ErrNotExist):
				t.Errorf("task B ran after the machine's crash though it may have started before: %q %v", data, err)
			}
		})
	}
}

// awaitArmed waits until the journal arms task id: an arm record, or the
// task's own (a task first in line when submitted is armed in it).
func awaitArmed(t *testing.T, b *harness.Broker, id uint64) {
	t.Helper()
	arm := []byte(`"op":"arm","id":` + harness.IDStr(id) + `,`)
	task := regexp.MustCompile(`"op":"task","task":\{"id":` + harness.IDStr(id) + `,[^\n]*"arm_boot":"[^"]`)
	deadline := time.Now().Add(harness.EventTimeout)
	for {
		data, err := os.ReadFile(filepath.Join(b.StateDir, "journal"))
		if err == nil && (bytes.Contains(data, arm) || task.Match(data)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %d, first in line with its supervisor started ahead, is not armed within %s; journal:\n%s", id, harness.EventTimeout, data)
		}
		time.Sleep(10 * time.Millisecond) // the journal file says nothing when it changes
	}
}
