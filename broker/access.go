package broker

import (
	"errors"
	"slices"

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
	return a != nil && a.known && s.cfg.Restricted(a.name, a.groups)
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
	return a != nil && (!a.known || s.cfg.Restricted(a.name, a.groups))
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
// broker manages (its lease has ended, or it is free at start), and the
// shared control nodes to those of them left with no device.
func (s *Server) revokeLocked(id int) {
	if !s.aclsManaged() {
		return
	}
	var removed []uint32
	for _, p := range s.inv.Nodes(id) {
		uids, err := npu.RemoveUsers(p, s.managed)
		if err != nil {
			s.log.Printf("npu %d: %v", id, err)
			continue
		}
		removed = append(removed, uids...)
	}
	if len(removed) > 0 {
		s.sweepSharedLocked()
	}
}

// sweepSharedLocked removes from the shared control nodes the managed
// entries of users who hold an entry on no device node.
func (s *Server) sweepSharedLocked() {
	var holding []uint32
	for _, id := range s.inv.IDs {
		for _, p := range s.inv.Nodes(id) {
			uids, err := npu.ACLUsers(p)
			if err != nil {
				// Unknown: keep every control node entry rather than take
				// one from a lease.
				s.log.Printf("npu %d: %v; control nodes left as they are", id, err)
				return
			}
			holding = append(holding, uids...)
		}
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
// nodes keep an entry only for users with a device node's entry.
func (s *Server) startAccessLocked(free []int) {
	if !s.aclsManaged() {
		return
	}
	for _, id := range free {
		for _, p := range s.inv.Nodes(id) {
			if uids, err := npu.RemoveUsers(p, s.managed); err != nil {
				s.log.Printf("npu %d: %v", id, err)
			} else if len(uids) > 0 {
				s.log.Printf("npu %d is free: removed the ACL entries of %s left from before this start", id, quantity.List("uid", "uids", uids))
			}
		}
	}
	s.sweepSharedLocked()
}
