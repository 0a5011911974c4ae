package broker

// Containers (issue 17): npurun-runtime, the OCI runtime in front of runc,
// names the container a lease is handed into (op container, with the
// lease's descriptors as proof), and asks for leases on a container's
// behalf (acquire with Request.Container: a lease of kind container). The
// wire is wire/container.go; what status makes of it (the lease
// re-kinded, holders and unleased use named by their cgroup) is the
// status room's (broker/status/containers.go). Neither op touches /proc or the disk before its answer: the
// runtime asks on a container's create path.

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/internal/fileid"
	"github.com/npurun/npurun/wire"
)

// closeAll closes descriptors received.
func closeAll(fds []int) {
	for _, f := range fds {
		unix.Close(f)
	}
}

// passedFiles are the files of the descriptors that req came with: op
// container's, the lease it names (the caller closes them all; the broker
// keeps none). Any other request comes with none.
func passedFiles(req *wire.Request, fds []int) ([]fileid.ID, error) {
	if len(fds) == 0 {
		return nil, nil
	}
	if req.Op != wire.OpContainer {
		return nil, &badRequest{"clients send no descriptors"}
	}
	files := make([]fileid.ID, len(fds))
	for i, fd := range fds {
		id, err := fileid.Of(fd)
		if err != nil {
			return nil, &badRequest{fmt.Sprintf("descriptor %d: %v", i, err)}
		}
		files[i] = id
	}
	return files, nil
}

// containerKind is the kind of a lease asked for with req: container where
// it names one (checked: bad-request otherwise), else inline.
func containerKind(req *wire.Request) (lease.Kind, *wire.Reply) {
	if req.Container == nil {
		return lease.Inline, nil
	}
	if err := req.Container.Check(); err != nil {
		return "", errReply(wire.CodeBadRequest, err.Error(), "")
	}
	return lease.Container, nil
}

// containerOp serves op container: the lease whose descriptors came with
// the request is container req.Container's (a label: its user stays who
// it was granted to); without descriptors, root tells of a container that
// holds no lease, whose name status then knows.
func (s *Server) containerOp(c *conn, req *wire.Request) bool {
	files := c.passed
	c.passed = nil
	reply := func(r *wire.Reply) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return c.sendLocked(r) == nil && r.Code != wire.CodeBadRequest
	}
	ref := req.Container
	if ref == nil {
		return reply(errReply(wire.CodeBadRequest, "op container names no container", ""))
	}
	if err := ref.Check(); err != nil {
		return reply(errReply(wire.CodeBadRequest, err.Error(), ""))
	}
	if c.uid != 0 {
		// What the runtime saw the container made in (its group, its
		// first process) is root's runtime's word alone.
		ref = ref.Label()
		if req.User != "" {
			return reply(errReply(wire.CodeDenied, "only root names the user whose lease a container's must be", ""))
		}
	}
	if len(req.Devices) != len(files) {
		return reply(errReply(wire.CodeBadRequest, fmt.Sprintf("%d devices named, %d descriptors sent", len(req.Devices), len(files)), ""))
	}
	if len(files) == 0 {
		if c.uid != 0 {
			return reply(errReply(wire.CodeDenied, fmt.Sprintf("uid %d may name only its own leases' containers, with their descriptors", c.uid), ""))
		}
		s.status.ContainerNamed(ref)
		return reply(&wire.Reply{Type: wire.TypeOK})
	}
	// Under the broker's lock, as grants are delivered: the ledger has
	// heard of the lease's start (Started) by now.
	s.mu.Lock()
	defer s.mu.Unlock()
	rep := s.status.Contain(c.uid, ref, req.Devices, files, req.User)
	return c.sendLocked(rep) == nil && rep.Code != wire.CodeBadRequest
}
