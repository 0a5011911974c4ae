package npu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
)

// A device node's access ACL, read and written as the kernel's binary
// POSIX ACL extended attribute (system.posix_acl_access; the layout of
// linux/posix_acl_xattr.h): a little-endian version 2 header, then
// entries of tag (16 bits), permissions (16 bits) and id (32 bits), in
// the order user::, user:ID…, group::, group:ID…, mask::, other::.
// No libacl and no setfacl at run time: the broker changes only entries
// of the accounts it manages and leaves every other entry as it found it.

const (
	aclXattr   = "system.posix_acl_access"
	aclVersion = 2
	aclNoID    = ^uint32(0)

	aclUserObj  = 0x01
	aclUser     = 0x02
	aclGroupObj = 0x04
	aclGroup    = 0x08
	aclMask     = 0x10
	aclOther    = 0x20

	aclRead  = 4
	aclWrite = 2
	aclRW    = aclRead | aclWrite

	// maxACLBytes is the most the kernel stores for one ACL (XATTR_SIZE_MAX).
	maxACLBytes = 64 << 10
)

// ErrNoACL means the file system of a device node keeps no POSIX ACLs.
var ErrNoACL = errors.New("the file system does not support POSIX ACLs")

type aclEntry struct {
	tag  uint16
	perm uint16
	id   uint32
}

// acl is an access ACL in the kernel's order.
type acl []aclEntry

// parseACL reads the binary xattr.
func parseACL(b []byte) (acl, error) {
	if len(b) < 4 || (len(b)-4)%8 != 0 {
		return nil, fmt.Errorf("bad ACL of %d bytes", len(b))
	}
	if v := binary.LittleEndian.Uint32(b); v != aclVersion {
		return nil, fmt.Errorf("ACL version %d, want %d", v, aclVersion)
	}
	a := make(acl, 0, (len(b)-4)/8)
	for p := 4; p < len(b); p += 8 {
		a = append(a, aclEntry{
			tag:  binary.LittleEndian.Uint16(b[p:]),
			perm: binary.LittleEndian.Uint16(b[p+2:]),
			id:   binary.LittleEndian.Uint32(b[p+4:]),
		})
	}
	return a, nil
}

// bytes writes the binary xattr, entries sorted as the kernel wants them.
func (a acl) bytes() []byte {
	s := slices.Clone(a)
	slices.SortStableFunc(s, func(x, y aclEntry) int {
		if x.tag != y.tag {
			return int(x.tag) - int(y.tag)
		}
		switch {
		case x.id < y.id:
			return -1
		case x.id > y.id:
			return 1
		}
		return 0
	})
	b := make([]byte, 4, 4+8*len(s))
	binary.LittleEndian.PutUint32(b, aclVersion)
	for _, e := range s {
		b = binary.LittleEndian.AppendUint16(b, e.tag)
		b = binary.LittleEndian.AppendUint16(b, e.perm)
		b = binary.LittleEndian.AppendUint32(b, e.id)
	}
	return b
}

// fromMode is the ACL a file without one has: its mode bits.
func fromMode(mode uint32) acl {
	return acl{
		{aclUserObj, uint16(mode>>6) & 7, aclNoID},
		{aclGroupObj, uint16(mode>>3) & 7, aclNoID},
		{aclOther, uint16(mode) & 7, aclNoID},
	}
}

// withMask recomputes the mask as setfacl does: the union of the named
// entries' and the owning group's permissions, present only while there is
// a named entry (an ACL without one needs none, and the kernel then keeps
// the mode alone).
func (a acl) withMask() acl {
	var out acl
	var mask uint16
	named := false
	for _, e := range a {
		switch e.tag {
		case aclMask:
			continue
		case aclUser, aclGroup:
			named = true
			mask |= e.perm
		case aclGroupObj:
			mask |= e.perm
		}
		out = append(out, e)
	}
	if named {
		out = append(out, aclEntry{aclMask, mask, aclNoID})
	}
	return out
}

// folded applies the ACL's mask (if any) to the group class, the owning
// group and the named entries: each keeps only what the mask lets it have
// now. The broker folds before it adds or removes its entry, so that the
// mask recomputed after gives nobody else more than before: otherwise a
// mask narrowed by an administrator (chmod g-rw, or 0600, on a node with
// an ACL) would be widened again to the owning group's and every named
// entry's full permissions, and for good once the last named entry goes
// (the group bits are then the owning group's entry).
func (a acl) folded() acl {
	mask, ok := uint16(0), false
	for _, e := range a {
		if e.tag == aclMask {
			mask, ok = e.perm, true
		}
	}
	out := slices.Clone(a)
	if !ok {
		return out
	}
	for i, e := range out {
		switch e.tag {
		case aclUser, aclGroup, aclGroupObj:
			out[i].perm &= mask
		}
	}
	return out
}

// users returns the uids of the named user entries.
func (a acl) users() []uint32 {
	var uids []uint32
	for _, e := range a {
		if e.tag == aclUser {
			uids = append(uids, e.id)
		}
	}
	return uids
}

// node is an open device node: a descriptor that reaches the node itself
// (O_PATH: the driver's open is never called, a symlink is never
// followed), and the path through which its xattrs are read and written.
type node struct {
	fd   int
	path string // /proc/self/fd/N: the node opened, whatever its name names now
	mode uint32
}

func openNode(path string) (*node, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: not a character device", path)
	}
	return &node{fd: fd, path: "/proc/self/fd/" + strconv.Itoa(fd), mode: st.Mode}, nil
}

func (n *node) close() { unix.Close(n.fd) }

// openACL opens the device node at path and reads its ACL: the one read
// of AllowUser, RemoveUsers and ACLUsers. The caller closes the node; on
// an error there is none.
func openACL(path string) (*node, acl, error) {
	n, err := openNode(path)
	if err != nil {
		return nil, nil, err
	}
	a, err := n.read()
	if err != nil {
		n.close()
		return nil, nil, fmt.Errorf("read ACL of %s: %w", path, err)
	}
	return n, a, nil
}

// read returns the node's ACL: its xattr, or its mode bits where it has
// none.
func (n *node) read() (acl, error) {
	buf := make([]byte, 4+8*16)
	for {
		sz, err := unix.Getxattr(n.path, aclXattr, buf)
		switch {
		case err == nil:
			return parseACL(buf[:sz])
		case err == unix.ENODATA:
			return fromMode(n.mode), nil
		case err == unix.ERANGE && len(buf) < maxACLBytes:
			buf = make([]byte, maxACLBytes)
			continue
		case err == unix.EOPNOTSUPP:
			return nil, ErrNoACL
		case err == unix.EINTR:
			continue
		}
		return nil, err
	}
}

// write sets the node's ACL, the mask recomputed. The kernel sets the
// mode's group bits from the mask, and drops the xattr altogether when the
// ACL says no more than the mode.
func (n *node) write(a acl) error {
	err := unix.Setxattr(n.path, aclXattr, a.withMask().bytes(), 0)
	if err == unix.EOPNOTSUPP {
		return ErrNoACL
	}
	return err
}

// AllowUser gives uid read and write access to the device node at path
// with an ACL entry user:UID:rw, and leaves every other entry as it was.
// It does nothing where the entry is there already.
func AllowUser(path string, uid uint32) error {
	n, a, err := openACL(path)
	if err != nil {
		return err
	}
	defer n.close()
	found := false
	for _, e := range a {
		if e.tag == aclUser && e.id == uid && e.perm&aclRW == aclRW && a.maskAllows(aclRW) {
			return nil // the mask as it is, not as it would be recomputed
		}
	}
	a = a.folded()
	for i, e := range a {
		if e.tag == aclUser && e.id == uid {
			a[i].perm |= aclRW
			found = true
		}
	}
	if !found {
		a = append(a, aclEntry{aclUser, aclRW, uid})
	}
	if err := n.write(a); err != nil {
		return fmt.Errorf("add user %d to the ACL of %s: %w", uid, path, err)
	}
	return nil
}

// maskAllows tells whether the ACL's mask (if any) lets perm through.
func (a acl) maskAllows(perm uint16) bool {
	for _, e := range a {
		if e.tag == aclMask {
			return e.perm&perm == perm
		}
	}
	return true
}

// RemoveUsers removes from the ACL of the device node at path the named
// user entries whose uid managed returns true for, and returns those uids.
// Every other entry stays.
func RemoveUsers(path string, managed func(uid uint32) bool) ([]uint32, error) {
	n, a, err := openACL(path)
	if err != nil {
		return nil, err
	}
	defer n.close()
	var removed []uint32
	kept := a[:0:0]
	for _, e := range a.folded() {
		if e.tag == aclUser && managed(e.id) {
			removed = append(removed, e.id)
			continue
		}
		kept = append(kept, e)
	}
	if len(removed) == 0 {
		return nil, nil
	}
	if err := n.write(kept); err != nil {
		return nil, fmt.Errorf("remove users %v from the ACL of %s: %w", removed, path, err)
	}
	return removed, nil
}

// ACLUsers returns the uids that the ACL of the device node at path names.
func ACLUsers(path string) ([]uint32, error) {
	n, a, err := openACL(path)
	if err != nil {
		return nil, err
	}
	defer n.close()
	return a.users(), nil
}
