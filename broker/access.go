package broker

import (
	"errors"
	"fmt"
	"log"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
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
//
// access is the lease table's gate (lease.Gate): the table opens a
// device before a lease's descriptors leave the broker and closes it
// after the lease, before the device can be granted again.

// access changes the ACLs of the device nodes. Its lock serialises the
// changes: a sweep of the control nodes reads every device node's ACL,
// and an entry added meanwhile would be swept. It is taken under
// Server.mu (a grant opens its devices in the scheduling pass), never the
// other way round, and never under the lease table's lock.
type access struct {
	pol   atomic.Pointer[accessPolicy] // replaced, never changed, by setPolicy
	inv   *npu.Inventory
	users *accounts
	log   *log.Logger
	rlog  *rateLog

	mu sync.Mutex
	// removeUsers removes the managed ACL entries from a node
	// (npu.RemoveUsers): a test makes it fail.
	removeUsers func(path string, managed func(uid uint32) bool) ([]uint32, error)
}

func newAccess(s *Server) *access {
	a := &access{inv: s.inv, users: &s.users, log: s.log, rlog: s.rlog, removeUsers: npu.RemoveUsers}
	a.setPolicy(s.policy())
	return a
}

// accessPolicy is what access decides from: the policy now (cfg: who
// gets an entry with a lease), and ever, whose [restrict] names every
// account and group that any policy of this broker's life restricted
// (whose entries are the broker's to remove). A reload that lifts a
// restriction so leaves no entry of a lease it granted behind.
type accessPolicy struct {
	cfg  *policy.Config
	ever *policy.Config
}

// setPolicy takes up cfg (at start, and at each reload).
func (a *access) setPolicy(cfg *policy.Config) {
	ever := &policy.Config{Restrict: cfg.Restrict}
	if old := a.pol.Load(); old != nil {
		ever.Restrict.Users = union(old.ever.Restrict.Users, cfg.Restrict.Users)
		ever.Restrict.Groups = union(old.ever.Restrict.Groups, cfg.Restrict.Groups)
	}
	a.pol.Store(&accessPolicy{cfg: cfg, ever: ever})
}

func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, s := range b {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// aclsManaged tells whether the broker manages device ACLs at all: only
// for a policy that restricts someone (or did, before a reload), and a
// vendor with device nodes.
func (a *access) aclsManaged() bool {
	return a.pol.Load().ever.Restrict.Active() && a.inv.Vendor != npu.Fake
}

// cachedAccount is what the broker knows of uid from its cache, whatever
// the entry's age; nil where uid was never looked up. Code under a lock
// (Server.mu, a.mu) asks no user database: NSS (LDAP, sssd) and the getent
// it runs can take seconds, and every client waits meanwhile. The accounts
// it needs are looked up before: a client's when it asks, a task's when
// it is loaded, and those that an ACL names by resolveNodeUsers.
func (a *access) cachedAccount(uid uint32) *account {
	a.users.mu.Lock()
	defer a.users.mu.Unlock()
	return a.users.m[uid]
}

// resolveNodeUsers looks up the accounts of the uids named in the ACLs of
// devices ids' nodes and of the control nodes that the cache does not know
// (a known account is taken whatever its age, as a lease's holder was
// looked up when it asked), so that Revoke and sweepSharedLocked
// find them cached. It is called holding no lock, before them.
func (a *access) resolveNodeUsers(ids []int) {
	if !a.aclsManaged() {
		return
	}
	var paths []string
	for _, id := range ids {
		paths = append(paths, a.inv.Nodes(id)...)
	}
	for _, p := range append(paths, a.inv.SharedNodes()...) {
		uids, err := npu.ACLUsers(p)
		if err != nil {
			continue // Revoke says so
		}
		for _, uid := range uids {
			if acct := a.cachedAccount(uid); uid != 0 && (acct == nil || !acct.known) {
				a.users.lookup(uid)
			}
		}
	}
}

// restricted tells whether uid is a restricted account. An account the
// broker has not looked up is not (it gets no entry).
func (a *access) restricted(uid uint32) bool {
	if uid == 0 || !a.aclsManaged() {
		return false
	}
	acct := a.cachedAccount(uid)
	return acct != nil && acct.known && restrictedAccountOf(a.pol.Load().cfg, acct)
}

// managed tells whether an ACL entry for uid is the broker's: a restricted
// account's, or a uid that no account has. An entry of a uid the broker
// has not looked up (added after resolveNodeUsers ran, so not by the
// broker) is left.
func (a *access) managed(uid uint32) bool {
	if uid == 0 {
		return false
	}
	acct := a.cachedAccount(uid)
	return acct != nil && (!acct.known || restrictedAccountOf(a.pol.Load().ever, acct))
}

// restrictedAccountOf tells whether account acct is restricted, by cfg, for its
// device access. An account the user database gave no full answer about
// (account.unanswered: its groups, or its name, could not be read) is,
// where [restrict] names a group (or, for an account without a name, a
// user): it may be in that group, and taking it for unrestricted would
// leave its entry on a device that is then granted to someone else. Fail
// closed: its entries are removed, and a lease adds one.
func restrictedAccountOf(cfg *policy.Config, acct *account) bool {
	if cfg.Restricted(acct.name, acct.groups) {
		return true
	}
	if acct.unanswered() == nil || acct.name == "root" {
		return false
	}
	return len(cfg.Restrict.Groups) > 0 || (!acct.known && len(cfg.Restrict.Users) > 0)
}

// allowUser adds an ACL entry for uid to one node (npu.AllowUser); a test
// counts the calls through it.
var allowUser = npu.AllowUser

// Allow opens devices ids, and the shared control nodes, to uid if uid is
// a restricted account. It is called before the lease's descriptors leave
// the broker; adding an entry that is there already writes nothing.
func (a *access) Allow(uid uint32, ids []int) error {
	if !a.restricted(uid) {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, id := range ids {
		for _, p := range a.inv.Nodes(id) {
			if err := allowUser(p, uid); err != nil {
				return err
			}
		}
	}
	for _, p := range a.inv.SharedNodes() {
		if err := allowUser(p, uid); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // not every driver makes every control node
			}
			return err
		}
	}
	return nil
}

// Revoke closes device id's node to every account whose entry the broker
// manages (its lease has ended) but for keep (the users of the device's
// shares that hold on), and the shared control nodes to those of them
// left with no device: one try, with the accounts cached. An error
// means that an entry may be left on the device's node: the device must
// not be granted until a later try succeeds (Close).
func (a *access) Revoke(id int, keep []uint32) error {
	if !a.aclsManaged() {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	removed, err := a.removeManagedLocked(id, keep)
	if len(removed) > 0 {
		a.sweepSharedLocked()
	}
	return err
}

// removeManagedLocked removes the managed entries from device id's nodes
// and returns the uids whose entries it removed.
func (a *access) removeManagedLocked(id int, keep []uint32) ([]uint32, error) {
	var removed []uint32
	var errs []error
	managed := a.managed
	if len(keep) > 0 {
		managed = func(uid uint32) bool { return !slices.Contains(keep, uid) && a.managed(uid) }
	}
	for _, p := range a.inv.Nodes(id) {
		uids, err := a.removeUsers(p, managed)
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

// Close closes device id after its lease has ended, or a grant that was
// not delivered opened it: the accounts its node's ACL names are looked
// up, then Revoke is tried, and tried again with a growing wait until it
// succeeds (failed: why a try made already failed, nil if none was).
// Until then an account whose lease of id has ended may still open its
// node, so the device stays out of service (the lease table grants it to
// nobody meanwhile). It is called holding no lock.
func (a *access) Close(id int, keep []uint32, failed error) {
	if failed == nil {
		a.resolveNodeUsers([]int{id})
		failed = a.Revoke(id, keep)
	}
	if failed != nil {
		a.revokeUntilDone(id, keep, failed)
	}
}

// revokeUntilDone tries device id's revoke again, with a growing wait,
// until it succeeds. err is why the last try failed.
func (a *access) revokeUntilDone(id int, keep []uint32, err error) {
	for wait := 50 * time.Millisecond; err != nil; wait = min(2*wait, revokeRetryMax) {
		a.rlog.Printf("%v; npu %d is out of service until the ACL entries of its node can be removed", err, id)
		time.Sleep(wait)
		a.resolveNodeUsers([]int{id})
		err = a.Revoke(id, keep)
	}
	a.log.Printf("npu %d: the ACL entries of its node are removed; back in service", id)
}

// sweepSharedLocked removes from the shared control nodes the managed
// entries of users who hold an entry on no device node of the machine:
// the devices of another broker of the machine (one broker per device,
// not per machine) count, as their leases need the control nodes too.
func (a *access) sweepSharedLocked() {
	var holding []uint32
	for _, p := range a.inv.MachineNodes() {
		uids, err := npu.ACLUsers(p)
		if err != nil {
			// Unknown: keep every control node entry rather than take
			// one from a lease.
			a.log.Printf("%s: %v; control nodes left as they are", p, err)
			return
		}
		holding = append(holding, uids...)
	}
	for _, p := range a.inv.SharedNodes() {
		_, err := npu.RemoveUsers(p, func(uid uint32) bool {
			return !slices.Contains(holding, uid) && a.managed(uid)
		})
		if err != nil && !errors.Is(err, unix.ENOENT) {
			a.log.Printf("%v", err)
		}
	}
}

// startShared is start for device id, which holds shares from before
// the start of users keep only (closeToSharers): its node loses the
// managed entries of others. One try: an entry left stays until the
// device's next share ends.
func (a *access) startShared(id int, keep []uint32) {
	if !a.aclsManaged() {
		return
	}
	a.resolveNodeUsers([]int{id})
	a.mu.Lock()
	defer a.mu.Unlock()
	uids, err := a.removeManagedLocked(id, keep)
	if err != nil {
		a.log.Printf("%v; entries of users whose shares ended before this start may stay until its next share ends", err)
	}
	if len(uids) > 0 {
		a.log.Printf("npu %d holds shares: removed the ACL entries of %s, whose shares ended before this start", id, quantity.List("uid", "uids", uids))
		a.sweepSharedLocked()
	}
}

// start is the broker's start: the accounts the ACLs name are looked up,
// the nodes of free devices lose the managed entries, those of held
// devices keep them, and the control nodes keep an entry only for users
// with a device node's entry. It returns the free devices whose entries
// could not all be removed, with why: those are not put in service until
// they are (Close). It is called holding no lock.
func (a *access) start(free []int) map[int]error {
	if !a.aclsManaged() {
		return nil
	}
	a.resolveNodeUsers(a.inv.IDs)
	a.mu.Lock()
	defer a.mu.Unlock()
	failed := map[int]error{}
	for _, id := range free {
		uids, err := a.removeManagedLocked(id, nil)
		if err != nil {
			failed[id] = err
		}
		if len(uids) > 0 {
			a.log.Printf("npu %d is free: removed the ACL entries of %s left from before this start", id, quantity.List("uid", "uids", uids))
		}
	}
	a.sweepSharedLocked()
	return failed
}
