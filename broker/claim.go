package broker

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// claimName is the file in the run and state directories whose flock a
// broker holds for its life, and which holds its pid.
const claimName = "broker.pid"

// ErrClaimed means another broker uses the directory.
var ErrClaimed = errors.New("another broker uses it")

// claimWait is how long a starting broker waits for a claim to be let go:
// a broker that was just killed may have left a child between fork and
// exec, holding its descriptors for a moment.
const claimWait = 2 * time.Second

// Claim takes dir for this broker for as long as the returned file stays
// open: an exclusive flock on dir/broker.pid, which then holds this
// process's pid. Two brokers on one run directory would fight over its
// socket and lock files; on one state directory, both would run the same
// queued task. If another broker holds the claim, the error names its pid
// and wraps ErrClaimed.
func Claim(dir string) (*os.File, error) {
	path := filepath.Join(dir, claimName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("claim %s: %w", dir, err)
	}
	err = flockPatiently(int(f.Fd()))
	switch {
	case errors.Is(err, unix.EWOULDBLOCK):
		defer f.Close()
		if pid := readPID(f); pid > 0 {
			return nil, fmt.Errorf("%s: %w (pid %d); stop it first, or give this one other directories", dir, ErrClaimed, pid)
		}
		return nil, fmt.Errorf("%s: %w; stop it first, or give this one other directories", dir, ErrClaimed)
	case err != nil:
		f.Close()
		return nil, fmt.Errorf("claim %s: %w", dir, err)
	}
	// The pid is for people and for the message above; the flock is the
	// claim, so a full disk that keeps the pid out does not stop the broker.
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// flockPatiently takes an exclusive flock without blocking, trying again
// for claimWait while another holds it; EWOULDBLOCK once that has passed.
func flockPatiently(fd int) error {
	deadline := time.Now().Add(claimWait)
	for {
		err := flock(fd, true)
		if err == nil || !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func readPID(f *os.File) int {
	buf := make([]byte, 32)
	n, _ := f.ReadAt(buf, 0)
	pid, err := strconv.Atoi(string(bytes.TrimSpace(buf[:n])))
	if err != nil {
		return 0
	}
	return pid
}

// claimState takes the state directory for this broker's life, once: two
// brokers replaying one journal would run the same task twice.
func (s *Server) claimState(dir string) error {
	if s.stateClaim != nil {
		return nil
	}
	if err := prepareLockDir(dir); err != nil {
		return err
	}
	claim, err := Claim(dir)
	if err != nil {
		return err
	}
	s.stateClaim = claim
	return nil
}
