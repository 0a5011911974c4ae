package main

import (
	"fmt"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// The ways a process may use a device node without showing an open
// descriptor of it, as the unleased-use tests play them. Each says what
// it did with its pid ("mapped PID", …) and then keeps its state: mmap
// until its standard input closes, the others by becoming `sleep 600`.

// mapNode maps path (private, read only: /dev/zero's kind keeps the node
// as the mapping's file), closes its descriptor, says "mapped PID" and
// waits for its standard input to close.
func mapNode(path string) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		fail("open", err)
	}
	if _, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ, unix.MAP_PRIVATE); err != nil {
		fail("mmap", err)
	}
	if err := unix.Close(fd); err != nil {
		fail("close", err)
	}
	fmt.Printf("mapped %d\n", os.Getpid())
	io.Copy(io.Discard, os.Stdin)
}

// dupDescriptors raises its descriptor limit to what the hard limit
// allows, puts n copies of its standard input at descriptors 100 and up,
// says "duped PID" and becomes `sleep 600`, which keeps them.
func dupDescriptors(n int) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		fail("getrlimit", err)
	}
	if lim.Max < uint64(n)+100 {
		fail("dups", fmt.Errorf("%d descriptors wanted, the hard limit is %d", n, lim.Max))
	}
	lim.Cur = lim.Max
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		fail("setrlimit", err)
	}
	for i := range n {
		if err := unix.Dup2(0, 100+i); err != nil {
			fail("dup2", err)
		}
	}
	fmt.Printf("duped %d\n", os.Getpid())
	execSleep()
}

// becomeRoot, run as a set-user-ID copy of this program owned by root,
// makes every uid root's, says "root PID" and becomes `sleep 600`: a
// process that opened a node as its user and is root's now.
func becomeRoot() {
	if err := syscall.Setresuid(0, 0, 0); err != nil {
		fail("setresuid", err)
	}
	fmt.Printf("root %d\n", os.Getpid())
	execSleep()
}

func execSleep() {
	os.Stdout.Sync()
	err := syscall.Exec("/bin/sleep", []string{"sleep", "600"}, os.Environ())
	fail("exec sleep", err)
}
