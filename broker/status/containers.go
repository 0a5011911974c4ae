package status

// What status knows of containers (issue 17): the lease a container holds
// (re-kinded by the runtime's word, op container, or of kind container
// from its grant), and the names the runtime told, for the containers
// that /proc/PID/cgroup finds holders and unleased use in (procscan reads
// it with each process it reports). The broker never talks to an engine:
// a container it was told no name of is shown by its id's first 12
// characters.

import (
	"cmp"
	"container/list"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/internal/fileid"
	"github.com/npurun/npurun/wire"
)

// maxContainerNames bounds the names kept: the least recently told or
// shown go first.
const maxContainerNames = 4096

// containerNames is container id -> name, as the runtime told them, under
// the ledger's lock.
type containerNames struct {
	byID  map[string]*list.Element // of *namedContainer
	order list.List                // most recently used first
}

// namedContainer is a container's name and who told it.
type namedContainer struct {
	ref wire.ContainerRef
	by  uint32 // the uid that told it: root (the runtime), or the owner of a rootless engine's container
}

// put keeps ref's name and the control group it was made in (a ref
// without either keeps none), told by uid: root names any container,
// another uid only one that no other uid has named (a container is its
// owner's to name: one user must not wear another's container's name, nor
// rename it). False where uid may not.
func (c *containerNames) put(ref *wire.ContainerRef, uid uint32) bool {
	if !c.mayName(ref, uid) {
		return false
	}
	if ref == nil || ref.Name == "" && ref.Cgroup == "" {
		return true
	}
	if c.byID == nil {
		c.byID = map[string]*list.Element{}
	}
	n := &namedContainer{ref: *ref, by: uid}
	if e := c.byID[ref.ID]; e != nil {
		if old := e.Value.(*namedContainer).ref; n.ref.Cgroup == "" || n.ref.Name == "" {
			// A word without the group (a label at the hand-over, before
			// runc made the container) keeps the group told; one without
			// a name keeps the name.
			n.ref.Cgroup = cmp.Or(n.ref.Cgroup, old.Cgroup)
			n.ref.Name = cmp.Or(n.ref.Name, old.Name)
		}
		e.Value = n
		c.order.MoveToFront(e)
		return true
	}
	c.byID[ref.ID] = c.order.PushFront(n)
	for c.order.Len() > maxContainerNames {
		last := c.order.Back()
		delete(c.byID, last.Value.(*namedContainer).ref.ID)
		c.order.Remove(last)
	}
	return true
}

// mayName tells whether uid may name container ref: root may, another uid
// where no other uid named it.
func (c *containerNames) mayName(ref *wire.ContainerRef, uid uint32) bool {
	if ref == nil || uid == 0 {
		return true
	}
	e := c.byID[ref.ID]
	return e == nil || e.Value.(*namedContainer).by == uid
}

// named is ref as the board shows it: a copy (its Label), with the name
// the runtime told where ref has none, and no name where show is false (a
// container's name can say what it runs, as a command does). nil for nil,
// and for a process's ref (from its control group) in another group than
// the one root's runtime saw the container made in: that is not the
// container, whatever its group's name says.
func (c *containerNames) named(ref *wire.ContainerRef, show bool) *wire.ContainerRef {
	if ref == nil || !c.inItsGroup(ref) {
		return nil
	}
	r := ref.Label()
	if e := c.byID[r.ID]; e != nil && r.Name == "" {
		r.Name = e.Value.(*namedContainer).ref.Name
		c.order.MoveToFront(e)
	}
	if !show {
		r.Name = ""
	}
	return r
}

// inItsGroup tells whether ref, a process's container as its control group
// names it, is in the group root's runtime saw that container made in
// (true where the runtime told none, or ref has none: a lease's label).
func (c *containerNames) inItsGroup(ref *wire.ContainerRef) bool {
	e := c.byID[ref.ID]
	if e == nil || ref.Cgroup == "" {
		return true
	}
	n := e.Value.(*namedContainer)
	return n.by != 0 || n.ref.Cgroup == "" || n.ref.Cgroup == ref.Cgroup
}

// MayNameContainer tells whether uid may name container ref (a lease asked
// for on its behalf): root any, another uid one that no other uid named.
func (g *Ledger) MayNameContainer(ref *wire.ContainerRef, uid uint32) bool {
	g.mu.Lock()
	defer g.unlock()
	return g.containers.mayName(ref, uid)
}

// ContainerNamed keeps the name of a container the runtime told of
// without a lease (op container from root, no descriptors).
func (g *Ledger) ContainerNamed(ref *wire.ContainerRef) {
	g.mu.Lock()
	defer g.unlock()
	g.containers.put(ref, 0)
	g.changedLocked()
}

// Contain makes the lease whose lock files are files (one a device
// of devices, in that order) container ref's, at the word of uid: root
// names any lease, another uid only those granted to it. Its user stays
// who it was granted to. An inline lease, or one found at start, becomes
// of kind container; a task's, a session's or a Slurm job's keeps its kind
// and is named only. No /proc and no disk: the runtime waits for the
// answer on a container's create path (the accounting record goes through
// the log's queue).
//
// owner, where not "", is the user (a name, or a uid as a number) whose
// lease it must be: root's runtime says whom it took the lease from (the
// hand-over's peer), and another's lease is refused (denied).
func (g *Ledger) Contain(uid uint32, ref *wire.ContainerRef, devices []int, files []fileid.ID, owner string) *wire.Reply {
	v := g.inv.Vendor
	g.mu.Lock()
	defer g.unlock()
	var e *entry
	for i, f := range files {
		id := devices[i]
		l := g.leases[id]
		if l != nil && l.held[id] {
			if lf, ok := l.fileOf(id); !ok || lf != f {
				l = nil
			}
		}
		if l == nil {
			// A share's lease: its own lock file (npuN.sK.lock).
			for _, sh := range g.shares[id] {
				if sf, ok := sh.fileOf(id); ok && sf == f && sh.held[id] {
					l = sh
					break
				}
			}
		}
		if l == nil {
			return refusal(wire.CodeBadRequest, fmt.Sprintf("descriptor %d is not %s's current lease", i, v.Format([]int{id})))
		}
		if e != nil && l != e {
			return refusal(wire.CodeBadRequest, fmt.Sprintf("descriptors 0 and %d are of two leases", i))
		}
		e = l
	}
	for _, id := range heldIDs(e) {
		if !slices.Contains(devices, id) {
			return refusal(wire.CodeBadRequest, fmt.Sprintf("the lease of %s holds %s too, whose descriptor was not sent", v.Format(devices), v.Format([]int{id})))
		}
	}
	if uid != 0 && e.UID != uid {
		return refusal(wire.CodeDenied, fmt.Sprintf("uid %d may name only its own leases' containers", uid))
	}
	if owner != "" && owner != e.User && owner != strconv.FormatUint(uint64(e.UID), 10) {
		return refusal(wire.CodeDenied, fmt.Sprintf("the lease of %s is %s's, not %s's", v.Format(heldIDs(e)), e.User, owner))
	}
	if !g.containers.put(ref, uid) {
		return refusal(wire.CodeDenied, fmt.Sprintf("uid %d may not name container %.12s: it is another user's", uid, ref.ID))
	}
	e.container = ref.Label()
	if ref.PID > 0 {
		e.containerPID = ref.PID // root's runtime's word (broker/containers.go)
	}
	r := *e.container
	if !e.contained && (e.Kind == lease.Inline || e.Kind == lease.Found) {
		e.contained = true
		if e.logged {
			g.usage.add(usageRec{T: time.Now().UnixMilli(), Ev: "kind", Lease: e.ID, Kind: wire.KindContainer, Container: &r})
		}
	}
	g.changedLocked()
	return &wire.Reply{Type: wire.TypeOK}
}

// oneContainer is the container that every one of pids (in res) is in,
// nil if any is in none or another: a lease found held at start by a
// container's processes alone is that container's. Podman's conmon, which
// keeps a copy of the descriptors it passed on, is outside the container
// and does not count.
func oneContainer(res *procscan.Result, pids []int) *wire.ContainerRef {
	var ref *wire.ContainerRef
	for _, pid := range pids {
		pi := res.Info[pid]
		switch {
		case pi == nil:
		case pi.Container == nil && pi.Comm == "conmon":
		case pi.Container == nil, ref != nil && pi.Container.ID != ref.ID:
			return nil
		case ref == nil:
			ref = pi.Container
		}
	}
	return ref
}

// containerID is the id of the container pi is in; "" for none.
func containerID(pi *procscan.Proc) string {
	if pi.Container == nil {
		return ""
	}
	return pi.Container.ID
}

// inHolderContainer tells whether pi is in a container that one of
// holders (pids, in res) is in: a process that docker exec started in a
// container holding the lease, or a child that lost the descriptor, uses
// the container's lease. in caches the holders' containers, read at the
// first use (nil until then).
func inHolderContainer(res *procscan.Result, holders map[int]bool, in *map[string]bool, pi *procscan.Proc) bool {
	if pi.Container == nil || len(holders) == 0 {
		return false
	}
	key := func(c *wire.ContainerRef) string { return c.ID + "\x00" + c.Cgroup }
	if *in == nil {
		*in = map[string]bool{}
		for pid := range holders {
			if h := res.Info[pid]; h != nil && h.Container != nil {
				(*in)[key(h.Container)] = true
			}
		}
	}
	// The same group, not only the same id: a group is named by whoever
	// made it (FromCgroup trusts no user's place; this is the second word).
	return (*in)[key(pi.Container)]
}

// inContainerLocked says, for a log line, which container a process is in.
func (g *Ledger) inContainerLocked(ref *wire.ContainerRef) string {
	if ref == nil {
		return ""
	}
	return fmt.Sprintf(" in %s container %s", ref.Engine, g.containers.named(ref, true).Short())
}

// refusal is the answer to an op the ledger refuses.
func refusal(code, msg string) *wire.Reply {
	return &wire.Reply{Type: wire.TypeError, Code: code, Message: msg}
}

// nameContainersLocked gives the containers that lease li and its holders
// name the names the runtime told, each a copy: hidden where show hides
// the commands of its process's user (the lease's user for the lease's).
func (g *Ledger) nameContainersLocked(li *wire.LeaseInfo, show func(uint32) bool) {
	if li == nil {
		return
	}
	li.Container = g.containers.named(li.Container, show(li.UID))
	for i := range li.Holders {
		h := &li.Holders[i]
		h.Container = g.containers.named(h.Container, show(h.UID))
	}
}
