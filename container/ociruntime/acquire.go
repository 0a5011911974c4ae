package ociruntime

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/wire"
	_ "github.com/npurun/npurun/wire/jsoncodec" // a request naming a container goes as JSON

	"golang.org/x/sys/unix"
)

// acquire asks the broker at socket for exactly devices, on behalf of
// user ("" for the runtime's own uid, root), for container ref, and waits
// in line as any request does: at most wait, where wait is not 0. It
// returns the descriptors in the order of devices.
func acquire(socket, user string, devices []int, ref *wire.ContainerRef, wait time.Duration) ([]int, error) {
	c, err := wire.Dial(socket)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ids := slices.Sorted(slices.Values(devices))
	if err := c.Send(&wire.Request{Op: wire.OpAcquire, Devices: ids, User: user, Container: ref}); err != nil {
		return nil, fmt.Errorf("ask the broker: %w", err)
	}
	timeout := time.Duration(-1)
	deadline := time.Time{}
	if wait > 0 {
		deadline = time.Now().Add(wait)
	}
	for {
		if !deadline.IsZero() {
			timeout = max(time.Until(deadline), 0)
		}
		r, fds, err := c.Recv(timeout)
		var be *wire.Error
		switch {
		case errors.As(err, &be):
			if be.Hint != "" {
				return nil, fmt.Errorf("%s (%s)", be.Message, be.Hint)
			}
			return nil, errors.New(be.Message)
		case errors.Is(err, wire.ErrTimeout):
			return nil, fmt.Errorf("still waiting after %s ([containers] restart_wait)", quantity.Duration(wait))
		case err != nil:
			return nil, err
		case r.Type == wire.TypeQueued:
			continue
		case r.Type != wire.TypeGrant:
			return nil, fmt.Errorf("unexpected reply %q from the broker", r.Type)
		}
		if len(fds) != len(r.Devices) {
			closeAll(fds)
			return nil, fmt.Errorf("a grant of %d devices with %d descriptors", len(r.Devices), len(fds))
		}
		out := make([]int, len(devices))
		for i, id := range devices {
			k := slices.Index(r.Devices, id)
			if k < 0 {
				closeAll(fds)
				return nil, fmt.Errorf("granted %v, not %v", r.Devices, devices)
			}
			out[i] = fds[k]
		}
		return out, nil
	}
}

func closeAll(fds []int) {
	for _, fd := range fds {
		closeFD(fd)
	}
}

func closeFD(fd int) { unix.Close(fd) }

// tellBroker tells the broker that container ref holds the lease of
// devices at fds (none: ref exists, holding no lease). The container
// starts whatever the broker says: the broker finds it by its holders'
// control groups all the same, only later; a failure (a broker that
// predates op container refuses it as a bad request) is the caller's to
// log.
func tellBroker(socket string, ref *wire.ContainerRef, devices, fds []int) error {
	return tellBrokerFor(socket, ref, "", devices, fds)
}

// tellBrokerFor is tellBroker where the lease must be owner's ("" for
// anyone's): a *wire.Error where the broker refuses.
func tellBrokerFor(socket string, ref *wire.ContainerRef, owner string, devices, fds []int) error {
	c, err := wire.Dial(socket)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.ContainFor(ref, owner, devices, fds); err != nil {
		return fmt.Errorf("tell the broker of container %.12s: %w", ref.ID, err)
	}
	return nil
}
