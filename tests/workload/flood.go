package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/npurun/npurun/wire"
)

// The attacks of BenchmarkFlood, each run by one user against the broker at
// $NPURUN_SOCKET until standard input closes:
//
//	fill      record n ended tasks with 15 KB commands (they fail at once,
//	          --after a cancelled task), then exit
//	list      conns connections asking for listings and reading nothing
//	churn     conns connections submitting tasks and cancelling them
//	oversize  conns connections sending messages over the size cap and
//	          submissions over the command cap
//	idle      conns connections that ask nothing
//
// Device 1 is held by the attacker throughout (fill and churn queue tasks
// for it, so that none runs). "flooding" is printed once the attack is
// under way.
func flood(mode string, conns, n int) {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil {
		lim.Cur = lim.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	sock := wire.SocketPath("")
	switch mode {
	case "fill":
		hold1(sock)
		fill(sock, n)
		fmt.Println("filled")
		return
	case "churn":
		hold1(sock)
	}
	var stop sync.WaitGroup
	stop.Add(1)
	ready := make(chan struct{}, conns)
	for i := 0; i < conns; i++ {
		go func() {
			switch mode {
			case "list":
				floodList(sock, ready)
			case "churn":
				floodChurn(sock, ready)
			case "oversize":
				floodOversize(sock, ready, i)
			case "idle":
				c := mustDial(sock)
				defer c.Close()
				ready <- struct{}{}
				stop.Wait()
			default:
				fail("flood", fmt.Errorf("unknown mode %q", mode))
			}
		}()
	}
	for i := 0; i < conns; i++ {
		<-ready
	}
	fmt.Println("flooding")
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

func mustDial(sock string) *wire.Conn {
	for {
		c, err := wire.Dial(sock)
		if err == nil {
			return c
		}
		// The broker may refuse for a moment (its caps): the attack goes on.
		time.Sleep(10 * time.Millisecond)
	}
}

// hold1 takes a lease on device 1 and keeps it for the process's life.
func hold1(sock string) {
	c := mustDial(sock)
	if err := c.Send(&wire.Request{Op: wire.OpAcquire, N: 1, Devices: []int{1}}); err != nil {
		fail("acquire npu 1", err)
	}
	r, fds, err := c.Recv(30 * time.Second)
	if err != nil || r.Type != wire.TypeGrant || len(fds) != 1 {
		fail("acquire npu 1", fmt.Errorf("%v %v", r, err))
	}
	// Kept open: the lease lasts until the process exits.
}

// sub is a task for device 1 with a command of size bytes.
func sub(size int, after ...uint64) *wire.Submission {
	cwd, _ := os.Getwd()
	return &wire.Submission{Argv: []string{"echo", strings.Repeat("x", size)}, Cwd: cwd, Env: []string{"PATH=/usr/bin:/bin"},
		N: 1, Devices: []int{1}, Log: "/tmp/npurun-flood.log", After: after}
}

// fill records n ended tasks with 15 KB commands.
func fill(sock string, n int) {
	c := mustDial(sock)
	r, err := c.Submit(sub(10))
	if err != nil {
		fail("submit", err)
	}
	if _, err := c.Cancel(r.ID); err != nil {
		fail("cancel", err)
	}
	c.Close()
	var wg sync.WaitGroup
	per := (n + 15) / 16
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := mustDial(sock)
			defer c.Close()
			for i := 0; i < per && w*per+i < n; i++ {
				if _, err := c.Submit(sub(15000, r.ID)); err != nil {
					fail("submit", err)
				}
			}
		}()
	}
	wg.Wait()
}

// floodList asks for the first page of the user's listing again and again
// and reads nothing; when the broker drops the connection, it connects again.
func floodList(sock string, ready chan<- struct{}) {
	req, _ := wire.Encode(&wire.Request{V: wire.Version, Op: wire.OpList})
	first := true
	for {
		c := mustDial(sock)
		fd := connFD(c)
		if first {
			ready <- struct{}{}
			first = false
		}
		for wire.SendMsg(fd, req, nil, 0) == nil {
		}
		c.Close()
	}
}

// floodChurn submits a task and cancels it, again and again.
func floodChurn(sock string, ready chan<- struct{}) {
	c := mustDial(sock)
	ready <- struct{}{}
	for {
		r, err := c.Submit(sub(100))
		if err != nil {
			c.Close()
			c = mustDial(sock)
			continue
		}
		if _, err := c.Cancel(r.ID); err != nil {
			c.Close()
			c = mustDial(sock)
		}
	}
}

// floodOversize sends, on a new connection each time, a message over the
// protocol's cap or a submission over the command cap, and reads the
// refusal.
func floodOversize(sock string, ready chan<- struct{}, i int) {
	big := bytes.Repeat([]byte("x"), wire.MaxMessage+wire.MaxMessage/2)
	huge, _ := wire.Encode(&wire.Request{V: wire.Version, Op: wire.OpSubmit, Task: sub(60000)})
	first := true
	for k := i; ; k++ {
		c := mustDial(sock)
		if first {
			ready <- struct{}{}
			first = false
		}
		msg := big
		if k%2 == 1 {
			msg = huge
		}
		if wire.SendMsg(connFD(c), msg, nil, 0) == nil {
			c.Recv(10 * time.Second)
		}
		c.Close()
	}
}

// connFD is a connection's descriptor.
func connFD(c *wire.Conn) int { return c.Fd() }
