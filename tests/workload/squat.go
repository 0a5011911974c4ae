package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/wire"
)

// squat binds addr (a container's NPURUN_HANDOVER, once the npurun that
// served it is gone: the address is in /proc/net/unix for everyone) and
// answers every runtime that connects as npurun would, with the lease of
// NPURUN_LEASE: what a user would do to slip her own lease into another's
// container, or to make root's runtime wait on her. It prints
// "squatting", then "served MSG" for each request answered, or "dropped"
// for a connection closed before any request, and goes on until standard
// input closes.
func squat(addr string) {
	var devices []string
	var fds []int
	for _, e := range strings.Split(os.Getenv(wire.LeaseVar), ",") {
		dev, fd, ok := strings.Cut(e, ":")
		f, err := strconv.Atoi(fd)
		if !ok || err != nil {
			fail("squat", fmt.Errorf("NPURUN_LEASE %q", os.Getenv(wire.LeaseVar)))
		}
		devices, fds = append(devices, dev), append(fds, f)
	}
	ln, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fail("squat", err)
	}
	if err := unix.Bind(ln, &unix.SockaddrUnix{Name: addr}); err != nil {
		fail("squat: bind "+addr, err)
	}
	if err := unix.Listen(ln, 4); err != nil {
		fail("squat", err)
	}
	go func() {
		var b [1]byte
		os.Stdin.Read(b[:])
		os.Exit(0)
	}()
	fmt.Println("squatting")
	for {
		c, _, err := unix.Accept4(ln, unix.SOCK_CLOEXEC)
		if err != nil {
			continue
		}
		buf := make([]byte, 4096)
		n, _, _, _, err := unix.Recvmsg(c, buf, nil, 0)
		if err != nil || n == 0 {
			fmt.Println("dropped")
			unix.Close(c)
			continue
		}
		reply := "lease 1 ascend " + strings.Join(devices, ",")
		if err := unix.Sendmsg(c, []byte(reply), unix.UnixRights(fds...), nil, 0); err == nil {
			fmt.Printf("served %s\n", buf[:n])
		}
		unix.Close(c)
	}
}
