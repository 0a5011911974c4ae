package broker

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
)

// TestRoomsLockOrder: a real broker on a real socket, its clients asking
// for and releasing fake devices as fast as they are granted, while status
// boards are drawn: the broker serves its line under Server.mu, taking
// the lease table's lock within it and telling the status room of each
// grant (its lock last), while the table's watchers report releases to
// the status room and ask for the line to be served (Server.mu, holding
// none of the table's), and the boards are drawn by the status room from
// the table's snapshot and the tasks' view (Server.mu) holding none of
// its own. Run with -race, it shows the rooms' locks free of races and of
// deadlock (broker/status's TestRoomLockOrder runs the status room's side
// with tasks, metrics and scans as well). Mutual exclusion is checked by the clients: each
// marks every device it is granted with a file made O_EXCL, removed
// before it lets the lease go.
func TestRoomsLockOrder(t *testing.T) {
	const devices, clients, rounds = 3, 8, 20
	// A deadlock would hang the test (and its cleanup, which takes
	// Server.mu): it fails with every goroutine's stack instead.
	watchdog := time.AfterFunc(2*time.Minute, func() {
		debug.SetTraceback("all")
		panic("TestRoomsLockOrder still runs after 2 minutes: the rooms' locks deadlock")
	})
	defer watchdog.Stop()
	cfg, err := policy.Parse("npurun.conf", fmt.Appendf(nil, "[devices]\nvendor = \"fake\"\nids = \"0-%d\"\n", devices-1))
	if err != nil {
		t.Fatal(err)
	}
	inv, err := npu.Discover(npu.Vendor(cfg.Vendor), cfg.IDs, cfg.DevDir, cfg.NPUSmi)
	if err != nil {
		t.Fatal(err)
	}
	run := t.TempDir()
	sock := filepath.Join(run, "broker.sock")
	ln, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Config: cfg, Inventory: inv, RunDir: run, StateDir: filepath.Join(run, "spool"),
		Socket: sock, Cgroup: "off", Log: log.New(io.Discard, "", 0)})
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		stop()
		<-served
	})

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
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := client.Dial(sock)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			for r := range rounds {
				if err := c.Send(&client.Request{Op: client.OpAcquire, N: 1 + (i+r)%2}); err != nil {
					t.Error(err)
					return
				}
				var rep *client.Reply
				var fds []int
				for rep == nil || rep.Type == client.TypeQueued {
					if rep, fds, err = c.Recv(20 * time.Second); err != nil {
						t.Errorf("client %d round %d: %v", i, r, err)
						return
					}
				}
				if rep.Type != client.TypeGrant || len(fds) != len(rep.Devices) {
					t.Errorf("client %d round %d: %+v with %d descriptors", i, r, rep, len(fds))
					return
				}
				var made []string
				for _, id := range rep.Devices {
					m := filepath.Join(marks, fmt.Sprintf("npu%d", id))
					f, err := os.OpenFile(m, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
					if err != nil {
						t.Errorf("client %d granted npu%d while another holds it: %v", i, id, err)
						continue
					}
					f.Close()
					made = append(made, m)
				}
				for _, m := range made {
					os.Remove(m)
				}
				for _, fd := range fds {
					unix.Close(fd) // the lease ends
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
			if st == client.DeviceFree {
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
