package broker

import (
	"fmt"
	"net"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Activated returns the socket systemd passed to this process (socket
// activation: LISTEN_PID is ours and LISTEN_FDS is 1), or nil.
func Activated() (*net.UnixListener, error) {
	if os.Getenv("LISTEN_PID") != strconv.Itoa(os.Getpid()) {
		return nil, nil
	}
	defer os.Unsetenv("LISTEN_PID")
	defer os.Unsetenv("LISTEN_FDS")
	defer os.Unsetenv("LISTEN_FDNAMES")
	if n, _ := strconv.Atoi(os.Getenv("LISTEN_FDS")); n != 1 {
		return nil, fmt.Errorf("socket activation: %q sockets passed, want 1", os.Getenv("LISTEN_FDS"))
	}
	const fd = 3 // SD_LISTEN_FDS_START
	unix.CloseOnExec(fd)
	f := os.NewFile(fd, "systemd-socket")
	defer f.Close()
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("socket activation: %w", err)
	}
	ul, ok := ln.(*net.UnixListener)
	if !ok {
		ln.Close()
		return nil, fmt.Errorf("socket activation: passed socket is not a Unix socket")
	}
	return ul, nil
}

// Notify tells systemd the daemon's state (e.g. "READY=1") when it runs
// under a service of Type=notify; otherwise it does nothing.
func Notify(state string) error {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil
	}
	if path[0] == '@' {
		path = "\x00" + path[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("notify systemd: %w", err)
	}
	defer c.Close()
	_, err = c.Write([]byte(state))
	return err
}
