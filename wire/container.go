package wire

// Containers: a lease handed into a container (package container,
// npurun-runtime) is held by the container's processes, which are the
// engine's, not the broker's client's. npurun-runtime (root, called by
// the engine for a container's create) tells the broker whose container
// a lease is, and asks for leases on a container's behalf when it starts
// again (--restart, docker start) or was started without npurun:
//
//	npurun-runtime (uid 0)                      npubroker
//	  │ ── {"op":"acquire","devices":[3],       │ "user" (root only, as ever): the container's
//	  │     "user":"alice","container":{        │ owner (its first npurun's uid, as the runtime
//	  │      "engine":"docker","id":"…",        │ recorded it); waits as any acquire; the lease's
//	  │      "name":"train"}} ────────────────▶ │ kind is "container" (a broker that predates it
//	  │ ◀── queued … grant + SCM_RIGHTS ─────── │ ignores the field: an inline lease for alice)
//	  │                                         │
//	  │ ── {"op":"container","container":{…},   │ the lease whose descriptors come with it (one
//	  │     "devices":[3,5]} + SCM_RIGHTS ────▶ │ a device, in that order) is this container's
//	  │ ◀── {"type":"ok"} ──────────────────── │ now: a label; the broker matches them to its
//	  │                                         │ grants by the lock files' device and inode and
//	  │                                         │ closes them. Root labels any lease, another uid
//	  │                                         │ (a rootless engine's runtime) its own; without
//	  │                                         │ descriptors (root only): the container exists
//
// The broker names a holder's container from /proc/PID/cgroup
// (container.FromCgroup) and the names the runtime told it. The broker's
// side is specified in the containers-broker spec; this file is the wire.

import (
	"fmt"
	"strings"
	"time"
)

// OpContainer tells the broker of a container and the lease it holds.
const OpContainer = "container"

// KindContainer is a lease held by a container's processes, granted to
// npurun-runtime on the owner's behalf or handed into the container by
// npurun.
const KindContainer = "container"

// DeviceContainer is a device on the board whose lease a container holds.
const DeviceContainer = "container"

// ContainerRef names a container.
type ContainerRef struct {
	Engine string `json:"engine"`         // "docker", "podman", or the cgroup's word for another
	ID     string `json:"id"`             // the engine's full id
	Name   string `json:"name,omitempty"` // the engine's name for it, where known

	// What root's runtime saw of the container once made (op container
	// after runc create), and what the broker reads of a process
	// (container.FromCgroup): the control group that names the container
	// (its path, up to that group: "/system.slice/docker-ID.scope"), and
	// the pid of its first process. The broker keeps them for itself
	// (Label): a process is this container's only in the group the
	// runtime saw it made in, and the first process is where status looks
	// for the lease's holders at once.
	Cgroup string `json:"cgroup,omitempty"`
	PID    int    `json:"pid,omitempty"`
}

// Label is ref as status and the accounting log show it: engine, id and
// name.
func (c *ContainerRef) Label() *ContainerRef {
	if c == nil {
		return nil
	}
	return &ContainerRef{Engine: c.Engine, ID: c.ID, Name: c.Name}
}

// Short is the container's name, or its id's first 12 characters.
func (c *ContainerRef) Short() string {
	if c.Name != "" {
		return c.Name
	}
	if len(c.ID) > 12 {
		return c.ID[:12]
	}
	return c.ID
}

// Contain tells the broker that container ref holds the lease whose
// descriptors are fds (of devices, in that order; none: the container
// exists, and holds no lease), and waits for its word.
func (c *Conn) Contain(ref *ContainerRef, devices, fds []int) error {
	return c.ContainFor(ref, "", devices, fds)
}

// ContainFor is Contain where the lease must be owner's (a user's name,
// or uid as a number; "" for anyone's): the broker refuses another's
// (denied). Root's runtime says whose lease it expects, by the uid that
// handed it over.
func (c *Conn) ContainFor(ref *ContainerRef, owner string, devices, fds []int) error {
	req := &Request{V: Version, Op: OpContainer, Container: ref, Devices: devices, User: owner}
	b, err := Encode(req)
	if err != nil {
		return err
	}
	if c.asked.IsZero() {
		c.asked = time.Now()
	}
	if err := SendMsg(c.fd, b, fds, 0); err != nil {
		return err
	}
	r, _, err := c.Recv(FirstAnswer)
	if err != nil {
		return err
	}
	if r.Type != TypeOK {
		return fmt.Errorf("unexpected reply %q to container", r.Type)
	}
	return nil
}

// Check tells what is wrong with ref, as the broker sees it: engine at
// most 32 bytes of [a-z0-9-], id 1 to 128 bytes of [0-9a-zA-Z_.-], name
// as CheckName says (it is shown in tables, as a task's name is).
func (c *ContainerRef) Check() error {
	if len(c.Engine) > 32 || strings.IndexFunc(c.Engine, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-')
	}) >= 0 {
		return fmt.Errorf("container engine %q: at most 32 characters of a-z, 0-9 and -", c.Engine)
	}
	if len(c.ID) == 0 || len(c.ID) > 128 || strings.IndexFunc(c.ID, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-')
	}) >= 0 {
		return fmt.Errorf("container id %q: 1 to 128 characters of a-z, A-Z, 0-9, _, . and -", c.ID)
	}
	if len(c.Cgroup) > 4096 || c.PID < 0 {
		return fmt.Errorf("container cgroup of %d bytes, pid %d: at most 4096 bytes, a pid", len(c.Cgroup), c.PID)
	}
	return CheckName("container", c.Name, MaxContainerName)
}
