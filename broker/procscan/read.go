package procscan

import (
	"bytes"
	"encoding/binary"
	"slices"
	"strconv"
	"unsafe"

	"github.com/npurun/npurun/internal/fileid"
	"golang.org/x/sys/unix"
)

// How a look reads one process: its descriptors with plain system calls
// (os.Open would also fstat the directory and try to register it with the
// poller, for each of thousands of processes), a stat of each by its name
// in the directory, the name pointing into the batch of entries just
// read; then its maps, parsed in place. Nothing is allocated per
// descriptor or mapping.

// buffers are what a look reuses from one descriptor, mapping and process
// to the next. Each Scan and Tree has its own (the Scanner is shared).
type buffers struct {
	path    []byte     // /proc/PID/fd, /proc/PID/maps, /proc/PID/map_files/START-END
	dirents [8192]byte // a batch of the directory's entries
	maps    []byte     // a batch of lines of maps: 64 KiB, made at the first (Tree reads none)
	st      unix.Statx_t
}

// find is one target found in a process.
type find struct {
	file   fileid.ID
	node   uint64 // a device node's number; 0 for a file
	mapped bool   // found in its maps, not at a descriptor
}

// look is one Scan's or Tree's reading of one process at a time.
type look struct {
	s     *Scanner
	t     Targets
	r     *Result
	b     *buffers
	maps  bool                 // read maps too (Scan)
	left  int                  // work left to the process's user (Scan) or to the Tree
	lines int                  // lines of maps read: every other one is charged to left
	found []find               // what was found in the process being read
	kinds map[fileid.ID]uint64 // the mapped files' kinds (Scanner.kinds): the Scan's, or a Sweep's own
}

// openFDDir opens /proc/PID/fd and returns it with the account its
// reading is charged to (Scan's budgets): the process's effective uid.
// The directory's owner is that uid, but for a process that is not
// dumpable (a set-user-ID program, or one that said so with prctl), whose
// directory is root's: that one is charged to the effective uid its
// status shows, and to Unknown where that cannot be read; never to root,
// whose budget a user could spend so.
func (s *Scanner) openFDDir(pid int, b *buffers) (int, uint32, error) {
	b.path = strconv.AppendInt(append(append(b.path[:0], s.root...), '/'), int64(pid), 10)
	b.path = append(b.path, "/fd\x00"...)
	dir, err := openat(unix.AT_FDCWD, &b.path[0], unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if err != nil {
		return -1, 0, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(dir, &st); err != nil {
		unix.Close(dir)
		return -1, 0, err
	}
	if st.Uid != 0 {
		return dir, st.Uid, nil
	}
	return dir, s.effectiveUID(pid), nil
}

// maxStatus bounds what is read of /proc/PID/status for its Uid line,
// which comes in its first few hundred bytes.
const maxStatus = 1024

// effectiveUID reads the effective uid of process pid from its status
// ("Uid:\treal\teffective\tsaved\tfs"); Unknown where it cannot be read.
func (s *Scanner) effectiveUID(pid int) uint32 {
	var buf [maxStatus]byte
	n, ok := s.readProcFile(pid, "status", buf[:])
	if !ok {
		return Unknown
	}
	data := buf[:n]
	i := bytes.Index(data, []byte("\nUid:"))
	if i < 0 {
		return Unknown
	}
	line := data[i+len("\nUid:"):]
	if j := bytes.IndexByte(line, '\n'); j >= 0 {
		line = line[:j]
	}
	f := bytes.Fields(line)
	if len(f) < 2 {
		return Unknown
	}
	uid, ok := parseUint(f[1], 10)
	if !ok || uid >= uint64(Unknown) {
		return Unknown
	}
	return uint32(uid)
}

// process reads pid's descriptors (dir: its fd directory) from the
// directory offset from, then its maps, while work is left; from mapsNext
// reads its maps alone. It tells whether it read to the end and, if not,
// where to go on.
func (lk *look) process(pid, dir int, from int64) (int64, bool) {
	if from != mapsNext {
		if pos, done := lk.descriptors(dir, from); !done {
			return pos, false
		}
	}
	if !lk.maps {
		return 0, true
	}
	if lk.left <= 0 {
		return mapsNext, false
	}
	lk.mappings(pid)
	return 0, true
}

// record puts what was found in pid into the result, and reads what it
// tells of pid if pid holds anything.
func (lk *look) record(pid int) {
	if len(lk.found) == 0 {
		return
	}
	r := lk.r
	if lk.s.fork(lk.s.info(r, pid)) {
		delete(r.Info, pid) // what it holds is self's
		return
	}
	for _, f := range lk.found {
		if f.node == 0 {
			r.Files[f.file] = appendOnce(r.Files[f.file], pid)
			continue
		}
		r.Nodes[f.node] = appendOnce(r.Nodes[f.node], pid)
		if f.mapped && !slices.Contains(lk.found, find{node: f.node}) {
			r.Mapped[f.node] = appendOnce(r.Mapped[f.node], pid)
		}
	}
}

// add records a target found in the process being read, once.
func (lk *look) add(f find) {
	if !slices.Contains(lk.found, f) {
		lk.found = append(lk.found, f)
	}
}

// descriptors reads the fd directory dir from offset from, a stat of each
// descriptor, until its end or until the work left runs out: then it
// returns the offset of the first descriptor not read.
func (lk *look) descriptors(dir int, from int64) (int64, bool) {
	b := lk.b
	if from > 0 {
		if _, err := unix.Seek(dir, from, 0); err != nil {
			return 0, true // as good as gone
		}
	}
	pos := from
	for {
		n, err := unix.Getdents(dir, b.dirents[:])
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return 0, true
		}
		for off := 0; off < n; {
			// struct linux_dirent64: ino, off (8 bytes each), reclen (2),
			// type (1), then the name, NUL-terminated and padded. Its
			// off is where the entry after it begins.
			if n-off < 19 {
				break
			}
			next := int64(binary.NativeEndian.Uint64(b.dirents[off+8:]))
			reclen := int(binary.NativeEndian.Uint16(b.dirents[off+16:]))
			if reclen < 19 || off+reclen > n {
				break
			}
			name := b.dirents[off+19 : off+reclen]
			off += reclen
			if len(name) > 0 && name[0] != '.' && name[0] != 0 && bytes.IndexByte(name, 0) >= 0 {
				if lk.left <= 0 {
					return pos, false
				}
				lk.left--
				lk.descriptor(dir, &name[0])
			}
			pos = next
		}
	}
}

// descriptor looks at one descriptor (fd: its name in the directory dir,
// NUL-terminated): a stat through its link, which reaches the open file
// itself whatever path the link shows.
func (lk *look) descriptor(dir int, fd *byte) {
	// Cached attributes only (AT_STATX_DONT_SYNC): a file on a FUSE or
	// network file system of a user's is not asked, so that it cannot
	// hold the scan up.
	st := &lk.b.st
	if statx(dir, fd, unix.AT_STATX_DONT_SYNC, unix.STATX_TYPE|unix.STATX_INO, st) != nil {
		return
	}
	switch uint32(st.Mode) & unix.S_IFMT {
	case unix.S_IFREG:
		if id := (fileid.ID{Dev: unix.Mkdev(st.Dev_major, st.Dev_minor), Ino: st.Ino}); lk.t.Files[id] {
			lk.add(find{file: id})
		}
	case unix.S_IFCHR:
		if rdev := unix.Mkdev(st.Rdev_major, st.Rdev_minor); lk.t.Nodes[rdev] {
			lk.add(find{node: rdev})
		}
	}
}

// mappings reads /proc/PID/maps. A mapped file is named there by its
// device and inode, which match a lock file at once; whether it is a
// device node, and which, a stat of /proc/PID/map_files/START-END tells
// (root only), once a scan for each file.
func (lk *look) mappings(pid int) {
	b := lk.b
	b.path = strconv.AppendInt(append(append(b.path[:0], lk.s.root...), '/'), int64(pid), 10)
	b.path = append(b.path, "/maps\x00"...)
	fd, err := openat(unix.AT_FDCWD, &b.path[0], unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if b.maps == nil {
		b.maps = make([]byte, 64<<10)
	}
	have := 0 // bytes of a line the last read cut, moved to the start of b.maps
	for {
		n, err := unix.Read(fd, b.maps[have:])
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return
		}
		data := b.maps[:have+n]
		for {
			nl := bytes.IndexByte(data, '\n')
			if nl < 0 {
				break
			}
			if lk.lines++; lk.lines%2 == 0 {
				lk.left--
			}
			lk.mapping(pid, data[:nl])
			data = data[nl+1:]
		}
		if len(data) == len(b.maps) {
			have = 0 // a line longer than the buffer: a path no mapping has
		} else {
			have = copy(b.maps, data)
		}
	}
}

// mapping looks at one line of maps:
// "START-END PERMS OFFSET MAJOR:MINOR INODE PATH", the numbers in hex but
// the inode.
func (lk *look) mapping(pid int, line []byte) {
	var field [5][]byte
	k := 0
	for i := 0; i < len(line) && k < len(field); {
		for i < len(line) && line[i] == ' ' {
			i++
		}
		j := i
		for j < len(line) && line[j] != ' ' {
			j++
		}
		field[k] = line[i:j]
		k++
		i = j
	}
	if k < len(field) {
		return
	}
	ino, ok := parseUint(field[4], 10)
	if !ok || ino == 0 {
		return // anonymous
	}
	colon := bytes.IndexByte(field[3], ':')
	if colon < 0 {
		return
	}
	major, ok1 := parseUint(field[3][:colon], 16)
	minor, ok2 := parseUint(field[3][colon+1:], 16)
	if !ok1 || !ok2 {
		return
	}
	id := fileid.ID{Dev: unix.Mkdev(uint32(major), uint32(minor)), Ino: ino}
	if lk.t.Files[id] {
		lk.add(find{file: id, mapped: true})
		return
	}
	if len(lk.t.Nodes) == 0 {
		return
	}
	rdev, known := lk.kinds[id]
	if !known {
		rdev, known = lk.kind(pid, field[0])
		if known && len(lk.kinds) < maxKinds {
			lk.kinds[id] = rdev
		}
	}
	if rdev != 0 && lk.t.Nodes[rdev] {
		lk.add(find{node: rdev, mapped: true})
	}
}

// kind stats the file that pid has mapped at span (START-END): its rdev
// if it is a character device, 0 if it is anything else; known is false
// where that cannot be told (the mapping is gone, or no right to look).
func (lk *look) kind(pid int, span []byte) (rdev uint64, known bool) {
	b := lk.b
	b.path = strconv.AppendInt(append(append(b.path[:0], lk.s.root...), '/'), int64(pid), 10)
	b.path = append(append(append(b.path, "/map_files/"...), span...), 0)
	if statx(unix.AT_FDCWD, &b.path[0], unix.AT_STATX_DONT_SYNC, unix.STATX_TYPE, &b.st) != nil {
		return 0, false
	}
	if uint32(b.st.Mode)&unix.S_IFMT != unix.S_IFCHR {
		return 0, true
	}
	return unix.Mkdev(b.st.Rdev_major, b.st.Rdev_minor), true
}

// parseUint parses b, digits of base 10 or 16, without allocating.
func parseUint(b []byte, base uint64) (uint64, bool) {
	if len(b) == 0 || base == 16 && len(b) > 16 || len(b) > 20 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		var d uint64
		switch {
		case c >= '0' && c <= '9':
			d = uint64(c - '0')
		case base == 16 && c >= 'a' && c <= 'f':
			d = uint64(c-'a') + 10
		case base == 16 && c >= 'A' && c <= 'F':
			d = uint64(c-'A') + 10
		default:
			return 0, false
		}
		n = n*base + d
	}
	return n, true
}

// openat and statx are those of package unix for a path already
// NUL-terminated in a buffer of the caller's: unix's copy each path to
// add the NUL, an allocation per descriptor.

func openat(dir int, path *byte, flags int) (int, error) {
	for {
		fd, _, errno := unix.Syscall6(unix.SYS_OPENAT, uintptr(dir), uintptr(unsafe.Pointer(path)), uintptr(flags), 0, 0, 0)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return -1, errno
		}
		return int(fd), nil
	}
}

func statx(dir int, path *byte, flags, mask int, st *unix.Statx_t) error {
	_, _, errno := unix.Syscall6(unix.SYS_STATX, uintptr(dir), uintptr(unsafe.Pointer(path)), uintptr(flags), uintptr(mask), uintptr(unsafe.Pointer(st)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}
