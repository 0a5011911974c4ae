package broker

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
)

// Device access of restricted accounts. They are in no group that may open
// the device nodes; the broker adds an ACL entry user:NAME:rw to a
// device's node before it hands a lease of that device to one of them, and
// to the vendor's shared control nodes while they hold an entry on any
// device node. It removes the device node's entries when the lease ends
// (the watcher wakes), and a control node's entry when its user holds no
// device node's entry any more.
//
// The ACLs are the record: the broker keeps no list of them. The entries
// it manages are those of restricted accounts, and of uids that no account
// has any more (a removed account's entry would otherwise pass to whoever
// gets its uid next); every other entry is an administrator's and stays.
// At start, a free device's node loses the managed entries (a broker
// killed during a lease leaves none behind), a held device's node keeps
// them until that lease ends.

// aclsManaged tells whether the broker manages device ACLs at all: only
// for a policy that restricts someone, and a vendor with device nodes.
func (s *Server) aclsManaged() bool {
	return s.cfg.Restrict.Active() && s.inv.Vendor != npu.Fake
}

// cachedAccount is what the broker knows of uid from its cache, whatever
// the entry's age; nil where uid was never looked up. Code under s.mu asks
// no user database: NSS (LDAP, sssd) and the getent it runs can take
// seconds, and every client waits on s.mu meanwhile. The accounts it needs
// are looked up before: a client's when it asks, a task's when it is
// loaded, and those that an ACL names by resolveNodeUsers.
func (s *Server) cachedAccount(uid uint32) *account {
	s.users.mu.Lock()
	defer s.users.mu.Unlock()
	return s.users.m[uid]
}

// resolveNodeUsers looks up the accounts of the uids named in the ACLs of
// devices ids' nodes and of the control nodes that the cache does not know
// (a known account is taken whatever its age, as a lease's holder was
// looked up when it asked), so that revokeLocked and sweepSharedLocked
// find them cached. It is called without s.mu, before them.
func (s *Server) resolveNodeUsers(ids []int) {
	if !s.aclsManaged() {
		return
	}
	var paths []string
	for _, id := range ids {
		paths = append(paths, s.inv.Nodes(id)...)
	}
	for _, p := range append(paths, s.inv.SharedNodes()...) {
		uids, err := npu.ACLUsers(p)
		if err != nil {
			continue // revokeLocked says so
		}
		for _, uid := range uids {
			if a := s.cachedAccount(uid); uid != 0 && (a == nil || !a.known) {
				s.users.lookup(uid)
			}
		}
	}
}

// restricted tells whether uid is a restricted account. An account the
// broker has not looked up is not (it gets no entry).
func (s *Server) restricted(uid uint32) bool {
	if uid == 0 || !s.aclsManaged() {
		return false
	}
	a := s.cachedAccount(uid)
	return a != nil && a.known && s.restrictedAccountOf(a)
}

// managed tells whether an ACL entry for uid is the broker's: a restricted
// account's, or a uid that no account has. An entry of a uid the broker
// has not looked up (added after resolveNodeUsers ran, so not by the
// broker) is left.
func (s *Server) managed(uid uint32) bool {
	if uid == 0 {
		return false
	}
	a := s.cachedAccount(uid)
	return a != nil && (!a.known || s.restrictedAccountOf(a))
}

// restrictedAccountOf tells whether account a is restricted for its
// device access. An account the user database gave no full answer about
// (account.unanswered: its groups, or its name, could not be read) is,
// where [restrict] names a group (or, for an account without a name, a
// user): it may be in that group, and taking it for unrestricted would
// leave its entry on a device that is then granted to someone else. Fail
// closed: its entries are removed, and a lease adds one.
func (s *Server) restrictedAccountOf(a *account) bool {
	if s.cfg.Restricted(a.name, a.groups) {
		return true
	}
	if a.unanswered() == nil || a.name == "root" {
		return false
	}
	return len(s.cfg.Restrict.Groups) > 0 || (!a.known && len(s.cfg.Restrict.Users) > 0)
}

// allowUser adds an ACL entry for uid to one node (npu.AllowUser); a test
// counts the calls through it.
var allowUser = npu.AllowUser

// allowLocked opens devices ids, and the shared control nodes, to uid if
// uid is a restricted account. It is called before the lease's descriptors
// leave the broker; adding an entry that is there already writes nothing.
func (s *Server) allowLocked(uid uint32, ids []int) error {
	if !s.restricted(uid) {
		return nil
	}
	for _, id := range ids {
		for _, p := range s.inv.Nodes(id) {
			if err := allowUser(p, uid); err != nil {
				return err
			}
		}
	}
	for _, p := range s.inv.SharedNodes() {
		if err := allowUser(p, uid); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // not every driver makes every control node
			}
			return err
		}
	}
	return nil
}

// revokeLocked closes device id's node to every account whose entry the
// broker manages (its lease has ended), and the shared control nodes to
// those of them left with no device. An error means that an entry may be
// left on the device's node: the device must not be granted until a later
// try succeeds (revokeUntilDone).
func (s *Server) revokeLocked(id int) error {
	if !s.aclsManaged() {
		return nil
	}
	removed, err := s.removeManagedLocked(id)
	if len(removed) > 0 {
		s.sweepSharedLocked()
	}
	return err
}

// removeManagedLocked removes the managed entries from device id's nodes
// and returns the uids whose entries it removed.
func (s *Server) removeManagedLocked(id int) ([]uint32, error) {
	var removed []uint32
	var errs []error
	for _, p := range s.inv.Nodes(id) {
		uids, err := s.removeUsers(p, s.managed)
		switch {
		case errors.Is(err, npu.ErrNoACL):
			continue // no ACLs there, so no entry to remove
		case err != nil:
			errs = append(errs, err)
			continue
		}
		removed = append(removed, uids...)
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("npu %d: %w", id, err)
	}
	return removed, nil
}

// revokeRetryMax bounds the wait between two tries of a revoke that
// failed.
const revokeRetryMax = 5 * time.Second

// revokeUntilDone tries device d's revoke again, with a growing wait,
// until it succeeds: until then an account whose lease of d has ended may
// still open its node, so d stays out of service (it is neither free nor
// leased: nobody is granted it). err is why the last try failed.
func (s *Server) revokeUntilDone(d *device, err error) {
	for wait := 50 * time.Millisecond; err != nil; wait = min(2*wait, revokeRetryMax) {
		s.rlog.Printf("%v; npu %d is out of service until the ACL entries of its node can be removed", err, d.id)
		time.Sleep(wait)
		s.resolveNodeUsers([]int{d.id})
		s.mu.Lock()
		err = s.revokeLocked(d.id)
		s.mu.Unlock()
	}
	s.log.Printf("npu %d: the ACL entries of its node are removed; back in service", d.id)
}

// sweepSharedLocked removes from the shared control nodes the managed
// entries of users who hold an entry on no device node of the machine:
// the devices of another broker of the machine (one broker per device,
// not per machine) count, as their leases need the control nodes too.
func (s *Server) sweepSharedLocked() {
	var holding []uint32
	for _, p := range s.inv.MachineNodes() {
		uids, err := npu.ACLUsers(p)
		if err != nil {
			// Unknown: keep every control node entry rather than take
			// one from a lease.
			s.log.Printf("%s: %v; control nodes left as they are", p, err)
			return
		}
		holding = append(holding, uids...)
	}
	for _, p := range s.inv.SharedNodes() {
		_, err := npu.RemoveUsers(p, func(uid uint32) bool {
			return !slices.Contains(holding, uid) && s.managed(uid)
		})
		if err != nil && !errors.Is(err, unix.ENOENT) {
			s.log.Printf("%v", err)
		}
	}
}

// startAccessLocked is the broker's start: the nodes of free devices lose
// the managed entries, those of held devices keep them, and the control
// nodes keep an entry only for users with a device node's entry. It
// returns the free devices whose entries could not all be removed, with
// why: those are not put in service until they are (revokeUntilDone).
func (s *Server) startAccessLocked(free []int) map[int]error {
	if !s.aclsManaged() {
		return nil
	}
	failed := map[int]error{}
	for _, id := range free {
		uids, err := s.removeManagedLocked(id)
		if err != nil {
			failed[id] = err
		}
		if len(uids) > 0 {
			s.log.Printf("npu %d is free: removed the ACL entries of %s left from before this start", id, quantity.List("uid", "uids", uids))
		}
	}
	s.sweepSharedLocked()
	return failed
}
