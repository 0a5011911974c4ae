package tasks

import (
	"bytes"
	"log"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
)

// revokes records the devices whose restricted entries a lease's end
// removed.
type revokes struct {
	mu  sync.Mutex
	ids []int
}

func (r *revokes) Revoke(id int, _ []uint32) error {
	r.mu.Lock()
	r.ids = append(r.ids, id)
	r.mu.Unlock()
	return nil
}

// syncBuffer is a log's buffer, written by the goroutine that signals;
// wrote hears of each write.
type syncBuffer struct {
	mu    sync.Mutex
	b     bytes.Buffer
	wrote chan struct{}
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case s.wrote <- struct{}{}:
	default:
	}
	return s.b.Write(p)
}

// await waits until the log holds each of want, and tells whether it
// came to.
func (s *syncBuffer) await(want ...string) bool {
	deadline := time.After(10 * time.Second)
	for {
		all := true
		for _, w := range want {
			all = all && strings.Contains(s.String(), w)
		}
		if all {
			return true
		}
		select {
		case <-s.wrote:
		case <-deadline:
			return false
		}
	}
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestEndLease: a lease that is not a task's (as a Slurm job's, whose
// Epilog came) is ended by EndLease as a task's is at its end: the
// restricted entry of its device goes at once, and a process that holds
// its lock file still (a real one, found in /proc) is sent SIGTERM, the
// log naming why. A lease that holds nothing any more is left alone.
func TestEndLease(t *testing.T) {
	locks := t.TempDir()
	owner := &lineOwner{}
	freed := make(chan struct{}, 8)
	table, err := lease.Open(lease.Config{Dir: locks, IDs: []int{0}, Pools: []lease.Pool{{Name: "default"}}, DefaultPool: "default",
		Vendor: npu.Fake, Owner: &freeOwner{line: owner, freed: freed}})
	if err != nil {
		t.Fatal(err)
	}
	table.Start(nil)
	w, err := table.Admit(lease.Request{Holder: lease.Holder{Kind: lease.Inline, UID: uint32(os.Geteuid()), User: "alice"}, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	table.Add(w)
	hs := table.Schedule(nil)
	if len(hs) != 1 {
		t.Fatalf("%d grants for one request on a free device", len(hs))
	}
	l := table.Commit(hs[0])
	fd := hs[0].FDs()[0]
	holder := exec.Command("sleep", "60")
	lockFile := os.NewFile(uintptr(fd), "lock")
	holder.ExtraFiles = []*os.File{lockFile}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	lockFile.Close() // the holder's alone now
	exited := make(chan error, 1)
	go func() { exited <- holder.Wait() }()
	t.Cleanup(func() { holder.Process.Kill() })

	scanner, err := procscan.New("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	scanner.UserBudget = 1 << 30 // the holder is root's, as are the machine's many processes: look at all
	acc := &revokes{}
	logs := &syncBuffer{wrote: make(chan struct{}, 1)}
	rt := New(Config{Policy: &policy.Config{Tasks: policy.Tasks{KillGrace: time.Minute}}, Inventory: &npu.Inventory{Vendor: npu.Fake, IDs: []int{0}},
		Table: table, Owner: owner, Accounts: &testAccounts{}, Access: acc, Holders: scanner, Log: log.New(logs, "", 0),
		Runner: &testRunner{}})
	owner.rt = rt
	rt.EndLease(l, "job 5 has ended")
	acc.mu.Lock()
	if len(acc.ids) != 1 || acc.ids[0] != 0 {
		t.Errorf("devices revoked: %v; want npu 0", acc.ids)
	}
	acc.mu.Unlock()
	select {
	case err := <-exited:
		var ws syscall.WaitStatus
		if ee, ok := err.(*exec.ExitError); ok {
			ws = ee.Sys().(syscall.WaitStatus)
		}
		if !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
			t.Errorf("the lease's holder ended with %v; want SIGTERM", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the lease's holder still runs after EndLease; the log says %q", logs.String())
	}
	want := "job 5 has ended: pid " + strconv.Itoa(holder.Process.Pid) + " ("
	if !logs.await(want, "still holds its lease of npu 0: sent SIGTERM") {
		got := logs.String()
		t.Errorf("the log says %q; want %q… still holds its lease of npu 0: sent SIGTERM", got, want)
	}

	// Its device free again, the lease holds nothing: nothing to end.
	for table.Snapshot().Devices[0].State != lease.Free {
		select {
		case <-freed:
		case <-time.After(10 * time.Second):
			t.Fatal("npu 0 not freed after its lease's holder ended")
		}
	}
	n := len(logs.String())
	rt.EndLease(l, "job 5 has ended")
	acc.mu.Lock()
	if len(acc.ids) != 1 {
		t.Errorf("devices revoked for a lease that holds nothing: %v", acc.ids[1:])
	}
	acc.mu.Unlock()
	if got := logs.String()[n:]; got != "" {
		t.Errorf("a lease that holds nothing ended with %q in the log", got)
	}
}
