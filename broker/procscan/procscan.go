// Package procscan finds, in /proc, the processes that have given files open: the lock files of leases and the device nodes of accelerators.
package procscan

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// A process holds a lease while it has a descriptor of the lease's lock
// file open: the broker passed it that descriptor, or it inherited it, or
// another process passed it on. /proc/locks cannot tell: it names the
// process that took the lock (the broker), not those holding it now. So a
// holder is found the way fuser(1) finds users of a file: through the
// links in /proc/PID/fd, and a stat of each link that may matter (its
// device and inode, or for a device node its rdev).

// FileID names a file by the device it is on and its inode.
type FileID struct{ Dev, Ino uint64 }

// ID returns the FileID of the file open at fd.
func ID(fd int) (FileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return FileID{}, err
	}
	return FileID{Dev: st.Dev, Ino: st.Ino}, nil
}

// Targets are what a scan looks for.
type Targets struct {
	Files map[FileID]bool // regular files (lock files) by device and inode
	Nodes map[uint64]bool // character device nodes by device number (rdev)
}

func (t Targets) empty() bool { return len(t.Files) == 0 && len(t.Nodes) == 0 }

// Proc is what a scan tells of one process.
type Proc struct {
	PID     int
	PPID    int
	UID     uint32    // effective uid
	Start   uint64    // start time in clock ticks after boot: tells a pid from its reuse
	Started time.Time // the same, as a time
	Comm    string    // the kernel's name of the command (at most 15 bytes)
	Cmdline []string  // nil for a kernel thread or a process that is exiting
	Exe     string    // the executable's path, "" where it cannot be read
}

// Result is what one scan found.
type Result struct {
	At    time.Time     // when the scan started
	Took  time.Duration // how long it took
	Procs int           // processes looked at
	Files map[FileID][]int
	Nodes map[uint64][]int
	// Info has every process named in Files and Nodes, and the ancestors
	// that Ancestors walked through.
	Info map[int]*Proc
	// Cut is set when Tree stopped at its limit with processes left to
	// look at: one it did not look at (see Looked) may hold a target
	// still, and this result cannot tell.
	Cut    bool
	looked map[int]bool // Tree's: the processes it looked at; nil for Scan
}

// Looked tells whether the look read pid's descriptors or found it gone,
// so that its absence from Files and Nodes means it holds none of them: a
// scan looks at every process, Tree at the processes it reached.
func (r *Result) Looked(pid int) bool { return r.looked == nil || r.looked[pid] }

// Scanner reads one /proc tree. It is safe for concurrent use.
type Scanner struct {
	fs       procfs.FS
	root     string
	boot     time.Time
	prefixes []string // link targets worth a stat
	self     int      // a pid left out of every scan (the broker's own)
}

// userHZ is the unit of a process's start time in /proc/PID/stat: clock
// ticks, 100 a second on every Linux architecture npurun runs on.
const userHZ = 100

// New returns a scanner of the proc file system mounted at root. Only
// descriptors whose link names a path under one of prefixes are looked at
// further (lock files live in one directory, device nodes in another); a
// prefix should end in "/". The process self is left out of every scan.
func New(root string, self int, prefixes ...string) (*Scanner, error) {
	fs, err := procfs.NewFS(root)
	if err != nil {
		return nil, err
	}
	s := &Scanner{fs: fs, root: root, self: self, prefixes: prefixes}
	s.boot = bootTime(root, fs)
	return s, nil
}

// bootTime is when the machine booted: now less the uptime, which has
// hundredths of a second, where /proc/stat's btime has whole seconds.
func bootTime(root string, fs procfs.FS) time.Time {
	if data, err := os.ReadFile(filepath.Join(root, "uptime")); err == nil {
		if f := strings.Fields(string(data)); len(f) > 0 {
			if up, err := strconv.ParseFloat(f[0], 64); err == nil {
				return time.Now().Add(-time.Duration(up * float64(time.Second))).Round(10 * time.Millisecond)
			}
		}
	}
	if st, err := fs.Stat(); err == nil {
		return time.Unix(int64(st.BootTime), 0)
	}
	return time.Time{}
}

// Scan looks at every process.
func (s *Scanner) Scan(t Targets) (*Result, error) {
	r := s.result()
	if t.empty() {
		r.Took = time.Since(r.At)
		return r, nil
	}
	procs, err := s.fs.AllProcs()
	if err != nil {
		return nil, err
	}
	b := new(buffers)
	for _, p := range procs {
		if p.PID == s.self {
			continue
		}
		r.Procs++
		s.openFiles(p, t, r, b)
	}
	r.Took = time.Since(r.At)
	return r, nil
}

// Tree looks at the processes roots and their descendants, at most limit
// of them: the cheap look that follows known holders between scans.
func (s *Scanner) Tree(roots []int, t Targets, limit int) *Result {
	r := s.result()
	seen := map[int]bool{s.self: true}
	queue := slices.Clone(roots)
	b := new(buffers)
	for len(queue) > 0 && r.Procs < limit {
		pid := queue[0]
		queue = queue[1:]
		if pid <= 0 || seen[pid] {
			continue
		}
		seen[pid] = true
		p, err := s.fs.Proc(pid)
		if err != nil {
			continue
		}
		r.Procs++
		s.openFiles(p, t, r, b)
		queue = append(queue, s.Children(pid)...)
	}
	for _, pid := range queue {
		if pid > 0 && !seen[pid] {
			r.Cut = true
			break
		}
	}
	delete(seen, s.self)
	r.looked = seen
	r.Took = time.Since(r.At)
	return r
}

func (s *Scanner) result() *Result {
	return &Result{At: time.Now(), Files: map[FileID][]int{}, Nodes: map[uint64][]int{}, Info: map[int]*Proc{}}
}

// buffers are what a look reuses from one descriptor and process to the
// next, so that it allocates nothing per descriptor: thousands of them on
// a busy machine. Each Scan and Tree has its own (the Scanner is shared).
type buffers struct {
	path    []byte             // /proc/PID/fd
	dirents [8192]byte         // a batch of the directory's entries
	link    [unix.PathMax]byte // a descriptor's link target
	st      unix.Statx_t
}

// openFiles records the targets that process p has open, and p itself if
// it has any. It is the scan's most frequent call, so it reads the
// descriptor directory with plain system calls (os.Open would also fstat
// it and try to register it with the poller, for each of thousands of
// processes), and reads each link and stats it by name relative to the
// directory, the name pointing into the batch of entries just read.
func (s *Scanner) openFiles(p procfs.Proc, t Targets, r *Result, b *buffers) {
	b.path = strconv.AppendInt(append(append(b.path[:0], s.root...), '/'), int64(p.PID), 10)
	b.path = append(b.path, "/fd\x00"...)
	dir, err := openat(unix.AT_FDCWD, &b.path[0], unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if err != nil {
		return // gone, or not ours to read
	}
	defer unix.Close(dir)
	found := false
	for {
		n, err := unix.Getdents(dir, b.dirents[:])
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			break
		}
		for off := 0; off < n; {
			// struct linux_dirent64: ino, off (8 bytes each), reclen (2),
			// type (1), then the name, NUL-terminated and padded.
			if n-off < 19 {
				break
			}
			reclen := int(binary.NativeEndian.Uint16(b.dirents[off+16:]))
			if reclen < 19 || off+reclen > n {
				break
			}
			name := b.dirents[off+19 : off+reclen]
			off += reclen
			if len(name) == 0 || name[0] == '.' || name[0] == 0 || bytes.IndexByte(name, 0) < 0 {
				continue
			}
			if s.holdsTarget(dir, &name[0], p.PID, t, r, b) {
				found = true
			}
		}
	}
	if found {
		s.info(r, p.PID)
	}
}

// holdsTarget tells whether a descriptor of process pid (fd: its name in
// the directory dir, NUL-terminated) is a target, and records it in r if
// so.
func (s *Scanner) holdsTarget(dir int, fd *byte, pid int, t Targets, r *Result, b *buffers) bool {
	n, err := readlinkat(dir, fd, b.link[:])
	if err != nil || n == 0 || b.link[0] != '/' || !s.worthStat(b.link[:n]) {
		return false // a socket, a pipe, or a path of no interest
	}
	// Cached attributes only (AT_STATX_DONT_SYNC): a file on a FUSE or
	// network file system of a user's is not asked, so that it cannot
	// hold the scan up.
	st := &b.st
	if statx(dir, fd, unix.AT_STATX_DONT_SYNC, unix.STATX_TYPE|unix.STATX_INO, st) != nil {
		return false
	}
	switch uint32(st.Mode) & unix.S_IFMT {
	case unix.S_IFREG:
		if id := (FileID{Dev: unix.Mkdev(st.Dev_major, st.Dev_minor), Ino: st.Ino}); t.Files[id] {
			r.Files[id] = appendOnce(r.Files[id], pid)
			return true
		}
	case unix.S_IFCHR:
		if rdev := unix.Mkdev(st.Rdev_major, st.Rdev_minor); t.Nodes[rdev] {
			r.Nodes[rdev] = appendOnce(r.Nodes[rdev], pid)
			return true
		}
	}
	return false
}

// openat, readlinkat and statx are those of package unix for a path
// already NUL-terminated in a buffer of the caller's: unix's copy each
// path to add the NUL, an allocation per descriptor.

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

func readlinkat(dir int, path *byte, buf []byte) (int, error) {
	n, _, errno := unix.Syscall6(unix.SYS_READLINKAT, uintptr(dir), uintptr(unsafe.Pointer(path)), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

func statx(dir int, path *byte, flags, mask int, st *unix.Statx_t) error {
	_, _, errno := unix.Syscall6(unix.SYS_STATX, uintptr(dir), uintptr(unsafe.Pointer(path)), uintptr(flags), uintptr(mask), uintptr(unsafe.Pointer(st)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

func (s *Scanner) worthStat(target []byte) bool {
	for _, p := range s.prefixes {
		if len(target) >= len(p) && string(target[:len(p)]) == p {
			return true
		}
	}
	return false
}

func appendOnce(pids []int, pid int) []int {
	if len(pids) > 0 && pids[len(pids)-1] == pid {
		return pids
	}
	return append(pids, pid)
}

// info returns what r knows of pid, reading it the first time; nil when
// the process is gone.
func (s *Scanner) info(r *Result, pid int) *Proc {
	if pi, ok := r.Info[pid]; ok {
		return pi
	}
	pi, err := s.Proc(pid)
	if err != nil {
		pi = nil
	}
	r.Info[pid] = pi
	return pi
}

// Proc reads what a scan tells of process pid.
func (s *Scanner) Proc(pid int) (*Proc, error) {
	p, err := s.fs.Proc(pid)
	if err != nil {
		return nil, err
	}
	st, err := p.Stat()
	if err != nil {
		return nil, err
	}
	pi := &Proc{PID: pid, PPID: st.PPID, Start: st.Starttime, Comm: st.Comm,
		Started: s.boot.Add(time.Duration(st.Starttime) * time.Second / userHZ)}
	if status, err := p.NewStatus(); err == nil {
		pi.UID = uint32(status.UIDs[1])
	} else {
		return nil, err
	}
	pi.Cmdline = s.cmdline(pid)
	if exe, err := p.Executable(); err == nil {
		pi.Exe = exe
	}
	return pi, nil
}

// MaxCmdline bounds what a scan reads of a process's command line, in
// bytes: plenty for the board, which shows 256, where the arguments may
// run to megabytes (procfs's CmdLine reads up to one).
const MaxCmdline = 4096

// cmdline reads the arguments of process pid, their first MaxCmdline
// bytes only, cut at a UTF-8 boundary; nil for a kernel thread, a process
// that is exiting or gone.
func (s *Scanner) cmdline(pid int) []string {
	path := s.root + "/" + strconv.Itoa(pid) + "/cmdline"
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	var buf [MaxCmdline]byte
	n := 0
	for n < len(buf) {
		m, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil || m <= 0 {
			break
		}
		n += m
	}
	data := buf[:n]
	if n == len(buf) {
		data = cutRune(data)
	}
	data = bytes.TrimRight(data, "\x00")
	if len(data) == 0 {
		return nil
	}
	return strings.Split(string(data), "\x00")
}

// cutRune leaves out a rune that b, cut short, ends in the middle of.
func cutRune(b []byte) []byte {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i]
			}
			break
		}
	}
	return b
}

// Start returns the start time of pid in clock ticks after boot, 0 when it
// is gone: with the pid, it names one process for good.
func (s *Scanner) Start(pid int) uint64 { return StartTime(s.fs, pid) }

// StartTime is Start for a /proc of one's own.
func StartTime(fs procfs.FS, pid int) uint64 {
	p, err := fs.Proc(pid)
	if err != nil {
		return 0
	}
	st, err := p.Stat()
	if err != nil {
		return 0
	}
	return st.Starttime
}

// Ancestors returns pid's parent, its parent's, and so on up to (and not
// including) pid 1 or a process that is gone, reading them into r.Info.
func (s *Scanner) Ancestors(r *Result, pid int) []int {
	var out []int
	for range 1024 { // a bound against a loop in a fake tree
		pi := s.info(r, pid)
		if pi == nil || pi.PPID <= 1 {
			return out
		}
		pid = pi.PPID
		out = append(out, pid)
	}
	return out
}

// Children returns the pids of pid's children, from every thread's
// children list (CONFIG_PROC_CHILDREN); nil when it is gone.
func (s *Scanner) Children(pid int) []int {
	dir := filepath.Join(s.root, strconv.Itoa(pid), "task")
	tids, err := readNames(dir)
	if err != nil {
		return nil
	}
	var out []int
	for _, tid := range tids {
		data, err := os.ReadFile(filepath.Join(dir, tid, "children"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(data)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

func readNames(dir string) ([]string, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return names, err
	}
	return names, nil
}

// Signal sends sig to process pid if it is still the process that started
// at start, through a pidfd so that a pid reused in between is never hit.
func (s *Scanner) Signal(pid int, start uint64, sig unix.Signal) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if s.Start(pid) != start {
		return unix.ESRCH
	}
	return unix.PidfdSendSignal(fd, sig, nil, 0)
}
