// Package claim takes the flocks by which a broker claims what it must not
// share with another broker for its life: its state directory, its devices,
// the parent of its tasks' control groups. It imports only the standard
// library and x/sys/unix; a claim is a flock held on a descriptor for the
// broker's life, never a file's content.
package claim

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"
)

// Wait is how long a starting broker waits for a claim to be let go: a
// broker just stopped (or killed) may have left a child between clone and
// exec holding its descriptors for a moment.
const Wait = 2 * time.Second

// Lock takes an exclusive flock on fd without blocking, trying again for
// Wait while another holds it; EWOULDBLOCK once that has passed.
func Lock(fd int) error {
	deadline := time.Now().Add(Wait)
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == unix.EINTR {
			continue
		}
		if err == nil || !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
