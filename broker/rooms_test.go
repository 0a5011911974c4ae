package broker

import (
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/testfs"
	"github.com/npurun/npurun/wire"
)

// TestRoomsLockOrder: a real broker on a real socket, its clients asking
// for and releasing fake devices as fast as they are granted, and
// submitting tasks that take the same devices (and a CPU slot), waiting
// for their ends, cancelling some and listing them, while status boards
// are drawn: the broker serves its line under Server.mu, taking the task
// room's lock and the lease table's within it, and tells the status room
// of each grant (its lock last); the table's watchers report releases to
// the status room and ask for the line to be served (Server.mu, holding
// neither of the others'); the task room starts tasks under real
// supervisors, records their ends, and tells the connections that wait
// for them (Server.mu, once its own lock is let go); the boards are drawn
// by the status room from the table's snapshot and the task room's view
// holding none of its own. Run with -race, it shows the rooms' locks free
// of races and of deadlock (broker/status's TestRoomLockOrder runs the
// status room's side with tasks, metrics and scans as well). Mutual
// exclusion is checked by the workload: each client and each task marks
// every device it is granted with a file made O_EXCL, removed before it
// lets the lease go. The configuration is reloaded meanwhile, two in
// turn (the rooms handed theirs one at a time, the line checked again
// under Server.mu and the task room's lock). As root, npu2 is drained and undrained meanwhile
// (the drain file written outside every room's lock, the line served on
// undrain without Server.mu held).
func TestRoomsLockOrder(t *testing.T) {
	const devices, clients, rounds = 3, 8, 20
	const submitters, tasksEach = 3, 8
	// A deadlock would hang the test (and its cleanup, which takes
	// Server.mu): it fails with every goroutine's stack instead.
	watchdog := time.AfterFunc(2*time.Minute, func() {
		debug.SetTraceback("all")
		panic("TestRoomsLockOrder still runs after 2 minutes: the rooms' locks deadlock")
	})
	defer watchdog.Stop()
	confText := fmt.Sprintf("[devices]\nvendor = \"fake\"\nids = \"0-%d\"\n[tasks]\ncpu_slots = 1\n", devices-1)
	// The supervisor program, beside the broker's executable as a build
	// directory has it.
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(bin, wire.SupervisorName), "../cmd/npurun-supervise")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the supervisor: %v\n%s", err, out)
	}
	s, sock, confFile := startServer(t, confText, bin)

	marks := t.TempDir()
	done := make(chan struct{})
	var boards sync.WaitGroup
	boards.Add(1)
	go func() { // status, meanwhile
		defer boards.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			b, _ := s.status.Board(0)
			if len(b.Devices) != devices {
				t.Errorf("board of %d devices", len(b.Devices))
				return
			}
		}
	}()
	boards.Add(1)
	go func() { // reload, meanwhile: two configurations in turn (reload.go)
		defer boards.Done()
		for n := 0; ; n++ {
			select {
			case <-done:
				return
			default:
			}
			text := confText
			if n%2 == 1 {
				text += fmt.Sprintf("[limits]\nmax_devices = %d\n[status]\nscan_interval = \"7s\"\n", devices)
			}
			if err := os.WriteFile(confFile, []byte(text), 0o644); err != nil {
				t.Error(err)
				return
			}
			if _, err := s.Reload(); err != nil {
				t.Errorf("reload: %v", err)
				return
			}
		}
	}()
	if os.Getuid() == 0 { // drain and undrain npu2, meanwhile (root's)
		boards.Add(1)
		go func() {
			defer boards.Done()
			c, err := wire.Dial(sock)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			for n := 0; ; n++ {
				select {
				case <-done:
					if _, err := c.Undrain("npu2"); err != nil {
						t.Errorf("undrain: %v", err)
					}
					return
				default:
				}
				var err error
				if n%2 == 0 {
					_, err = c.Drain("npu2", fmt.Sprintf("round %d", n))
				} else {
					_, err = c.Undrain("2")
				}
				if err != nil {
					t.Errorf("drain round %d: %v", n, err)
					return
				}
			}
		}()
	}
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := wire.Dial(sock)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			// Every fourth client asks with --no-wait, again while it is
			// refused: it waits for the ends under way (lease.Table.Ending)
			// with Server.mu let go, while the watchers take it.
			noWait := i%4 == 3
			for r := 0; r < rounds; {
				if err := c.Send(&wire.Request{Op: wire.OpAcquire, N: 1 + (i+r)%2, NoWait: noWait}); err != nil {
					t.Error(err)
					return
				}
				var rep *wire.Reply
				var fds []int
				var we *wire.Error
				for rep == nil || rep.Type == wire.TypeQueued {
					if rep, fds, err = c.Recv(20 * time.Second); noWait && errors.As(err, &we) && we.Code == wire.CodeBusy {
						break
					}
					if err != nil {
						t.Errorf("client %d round %d: %v", i, r, err)
						return
					}
				}
				if err != nil {
					continue // refused: nothing free this moment
				}
				if rep.Type != wire.TypeGrant || len(fds) != len(rep.Devices) {
					t.Errorf("client %d round %d: %+v with %d descriptors", i, r, rep, len(fds))
					return
				}
				testfs.Mark(t, marks, fmt.Sprintf("client %d", i), rep.Devices)()
				for _, fd := range fds {
					unix.Close(fd) // the lease ends
				}
				r++
			}
		}()
	}
	// Tasks, meanwhile: device tasks and --no-device ones, each waited
	// for on its submitter's connection; every third device task is
	// cancelled, whether it waits or runs by then.
	logs := t.TempDir()
	cwd, _ := os.Getwd()
	// A task cancelled while it runs is sent SIGTERM: it removes its
	// marks then too (else the next holder of its devices would find them
	// and be taken for a second grant).
	mark := `set -C; devs=$(echo "$NPURUN_DEVICES" | tr , " "); trap 'for d in $devs; do rm -f "$0/npu$d"; done; exit 143' TERM; ` +
		`for d in $devs; do : > "$0/npu$d" || exit 3; done; sleep 0.01; for d in $devs; do rm "$0/npu$d"; done`
	for i := range submitters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := wire.Dial(sock)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			type sent struct {
				id       uint64
				cancel   bool
				noDevice bool
				log      string
			}
			var all []sent
			for k := range tasksEach {
				sub := &wire.Submission{Argv: []string{"/bin/sh", "-c", mark, marks}, Cwd: cwd,
					Env: []string{"PATH=/usr/bin:/bin"}, Log: filepath.Join(logs, fmt.Sprintf("%d-%d.log", i, k)),
					N: 1 + k%2, NoDevice: k%4 == 3}
				if sub.NoDevice {
					sub.N = 0
				}
				r, err := c.Submit(sub)
				if err != nil {
					t.Errorf("submitter %d: task %d: %v", i, k, err)
					return
				}
				all = append(all, sent{r.ID, !sub.NoDevice && k%3 == 0, sub.NoDevice, sub.Log})
				if k%3 == 0 && !sub.NoDevice {
					if _, err := c.Cancel(r.ID); err != nil {
						t.Errorf("submitter %d: cancel task %d: %v", i, r.ID, err)
					}
				}
			}
			if _, err := c.List(false); err != nil {
				t.Errorf("submitter %d: list: %v", i, err)
			}
			for _, st := range all {
				ti, err := c.Wait(st.id)
				switch {
				case err != nil:
					t.Errorf("submitter %d: wait for task %d: %v", i, st.id, err)
				case ti.State == wire.StateCancelled && st.cancel:
				case ti.State != wire.StateDone || ti.Exit == nil || *ti.Exit != 0:
					out, _ := os.ReadFile(st.log)
					t.Errorf("submitter %d: task %d (no device: %v) ended %s, exit %v, signal %q (%s); want done, exit 0; its log:\n%s",
						i, st.id, st.noDevice, ti.State, ti.Exit, ti.Signal, ti.Reason, out)
				}
			}
		}()
	}
	wg.Wait()
	close(done)
	boards.Wait()
	// Every lease has ended: the devices come free, each on a fresh file
	// (and so nothing is written in the run directory any more). Each
	// comes free in a scheduling pass, which tells the board's watchers.
	deadline := time.After(20 * time.Second)
	for {
		_, changed := s.status.Watch(0)
		states := s.status.States()
		free := 0
		for _, st := range states {
			if st == wire.DeviceFree {
				free++
			}
		}
		if free == devices {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("devices after every lease ended: %v", states)
		}
	}
}

// failLog is a broker's log kept for the test's failure: shown then, and
// never otherwise.
func failLog(t *testing.T) *log.Logger {
	var mu sync.Mutex
	var buf []byte
	t.Cleanup(func() {
		if t.Failed() {
			mu.Lock()
			t.Logf("the broker's log:\n%s", buf)
			mu.Unlock()
		}
	})
	return log.New(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		if len(buf) < 1<<20 {
			buf = append(buf, p...)
		}
		return len(p), nil
	}), "", log.Lmicroseconds)
}

// writerFunc is a function as an io.Writer.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
