package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/wire"
)

// contain plays npurun-runtime's op container: it tells the broker at
// $NPURUN_SOCKET that container ENGINE/ID/NAME (spec) holds the lease of
// NPURUN_LEASE, sending its descriptors; with file set, the descriptor of
// that file instead of the lease's first (not a lease: refused); with none
// set, no descriptor at all; with owner set, the lease must be that user's.
// It prints the broker's answer ("ok", or the
// code and message), then keeps the lease until standard input closes.
func contain(spec, file string, none bool, owner string) {
	parts := strings.SplitN(spec, "/", 3)
	for len(parts) < 3 {
		parts = append(parts, "")
	}
	ref := &wire.ContainerRef{Engine: parts[0], ID: parts[1], Name: parts[2]}
	var devices, fds []int
	if !none {
		for _, e := range strings.Split(os.Getenv(wire.LeaseVar), ",") {
			dev, fd, ok := strings.Cut(e, ":")
			d, err1 := strconv.Atoi(dev)
			f, err2 := strconv.Atoi(fd)
			if !ok || err1 != nil || err2 != nil {
				fmt.Fprintf(os.Stderr, "workload: NPURUN_LEASE %q\n", os.Getenv(wire.LeaseVar))
				os.Exit(4)
			}
			devices, fds = append(devices, d), append(fds, f)
		}
		if file != "" {
			fd, err := unix.Open(file, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				fmt.Fprintln(os.Stderr, "workload:", err)
				os.Exit(4)
			}
			fds[0] = fd
		}
	}
	c, err := wire.Dial(wire.SocketPath(""))
	if err != nil {
		fmt.Fprintln(os.Stderr, "workload:", err)
		os.Exit(4)
	}
	err = c.ContainFor(ref, owner, devices, fds)
	c.Close()
	var be *wire.Error
	switch {
	case errors.As(err, &be):
		fmt.Printf("%s: %s\n", be.Code, be.Message)
	case err != nil:
		fmt.Fprintln(os.Stderr, "workload:", err)
		os.Exit(4)
	default:
		fmt.Println(wire.TypeOK)
	}
	done := make(chan struct{})
	go func() {
		var b [1]byte
		os.Stdin.Read(b[:])
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
	}
}
