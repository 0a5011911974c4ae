// Package procscan finds, in /proc, the processes that have given files
// open: the lock files of leases and the device nodes of accelerators. It
// only reads /proc: it names a file by what it is (fileid), never by its
// path, and must never change a lease or take a room's lock.
package procscan

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/container"
	"github.com/npurun/npurun/internal/fileid"
	"github.com/npurun/npurun/wire"
)

// A process holds a lease while it has a descriptor of the lease's lock
// file open: the broker passed it that descriptor, or it inherited it, or
// another process passed it on. /proc/locks cannot tell: it names the
// process that took the lock (the broker), not those holding it now. So a
// holder is found the way fuser(1) finds users of a file: through the
// links in /proc/PID/fd, a stat of each (which follows the link to the
// open file itself, whatever path it shows), and the lines of
// /proc/PID/maps (a file mapped and its descriptor closed is still open).
//
// What names a target is what the file is, never its path: a lock file is
// its device and inode, a device node its device number (rdev), whatever
// path the process reached it by (a bind mount in a namespace of its own,
// a container's /dev, a link).
//
// A scan costs a stat a descriptor and a line of maps a mapping, a few
// microseconds each. One user with hundreds of thousands of descriptors
// would make every scan slow, and the scan's pacing would then delay the
// finding of everyone's use: so a scan does at most UserBudget of that
// work for the processes of one user, and the next scan goes on where it
// stopped (see Scan). The look that ends a lease (Sweep) has no budget:
// it must see every holder.

// Targets are what a scan looks for.
type Targets struct {
	Files map[fileid.ID]bool // regular files (lock files) by device and inode
	Nodes map[uint64]bool    // character device nodes by device number (rdev)
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

	// Container is the container the process is in, from its
	// /proc/PID/cgroup (container.FromCgroup; no name: the engine's names
	// are the broker's to add); nil for a process in none, or in the
	// broker's own (a broker run in a container tags the others only).
	Container *wire.ContainerRef
}

// Result is what one scan found.
type Result struct {
	At    time.Time     // when the scan started
	Took  time.Duration // how long it took
	Procs int           // processes looked at
	Files map[fileid.ID][]int
	Nodes map[uint64][]int // at a descriptor or in a mapping
	// Mapped has, of the processes in Nodes, those that have the node
	// mapped and no descriptor of it open.
	Mapped map[uint64][]int
	// Info has every process named in Files and Nodes, and the ancestors
	// that Ancestors walked through.
	Info map[int]*Proc
	// Cut is set when Tree stopped at its limit with processes left to
	// look at: one it did not look at (see Looked) may hold a target
	// still, and this result cannot tell.
	Cut    bool
	looked map[int]bool // Tree's: the processes it looked at; nil for Scan
	// Scan's: the processes it did not read to the end, their user's work
	// being spent (a target found in them is in Files and Nodes all the
	// same), and the users of those.
	skipped  map[int]bool
	deferred map[uint32]bool
}

// Looked tells whether the look read all of pid's descriptors (and, for a
// scan, its maps) or found it gone, so that its absence from Files and
// Nodes means it holds none of them: Tree looks at the processes it
// reached, a scan at every process but those of a user whose work it cut
// short.
func (r *Result) Looked(pid int) bool {
	if r.looked != nil {
		return r.looked[pid]
	}
	return !r.skipped[pid]
}

// Deferred tells whether the scan left processes of user uid (by the
// owner of /proc/PID/fd: see Scan) unread or read in part.
func (r *Result) Deferred(uid uint32) bool { return r.deferred[uid] }

// AnyDeferred tells whether the scan left any user's processes unread or
// read in part.
func (r *Result) AnyDeferred() bool { return len(r.deferred) > 0 }

// Scanner reads one /proc tree. It is safe for concurrent use.
type Scanner struct {
	fs   procfs.FS
	root string
	boot time.Time
	self int // a pid left out of every scan (the broker's own), with its forks not yet exec'd (fork)
	// own is the container self is in (a broker run in a container), nil
	// for none: its fellows are where the broker is, not in a container
	// of their own, and are told as in none.
	own *wire.ContainerRef

	// UserBudget bounds the work of one scan for the processes of one
	// user, and of one Tree: descriptors stat'ed, and lines of maps read
	// (two to one: a line costs about half a stat). Set it before the
	// first scan.
	UserBudget int

	mu      sync.Mutex           // one Scan at a time: the fields below are its own
	cursors map[uint32]*cursor   // per user whose work the last scan cut short: where to go on
	kinds   map[fileid.ID]uint64 // mapped files the scan stat'ed: the rdev of a character device, else 0
}

// DefaultUserBudget is UserBudget unless set: some milliseconds of a scan
// for one user's processes on a machine where a stat costs a microsecond,
// tens where it costs several (a virtual machine). A large training job,
// whose processes have hundreds of descriptors and thousands of mappings
// each, is read over a few scans.
const DefaultUserBudget = 8192

// maxKinds bounds the mapped files one scan keeps the kind of.
const maxKinds = 1 << 16

// cursor is where the next scan goes on with one user's processes: the
// process the last one stopped in (or before), how far it had read that
// process, and what it had found there.
type cursor struct {
	pid   int
	start uint64 // pid's start time; 0 where pid was not begun
	pos   int64  // the offset in pid's fd directory to read on from; mapsNext: its maps are left
	found []find
}

// mapsNext is a cursor's pos where a process's descriptors are all read
// and its maps are not.
const mapsNext = -1

// userHZ is the unit of a process's start time in /proc/PID/stat: clock
// ticks, 100 a second on every Linux architecture npurun runs on.
const userHZ = 100

// New returns a scanner of the proc file system mounted at root, which
// leaves the process self out of every scan, and its children that share
// its memory: a child between its fork and its exec (Go starts a program
// with vfork) has a copy of every descriptor self holds, those it may not
// keep closed only at the exec, and is self for what it holds. Path
// prefixes, which earlier
// versions looked at descriptors under only, are taken and not used: a
// target is found by what it is, whatever its path.
func New(root string, self int, _ ...string) (*Scanner, error) {
	fs, err := procfs.NewFS(root)
	if err != nil {
		return nil, err
	}
	s := &Scanner{fs: fs, root: root, self: self, UserBudget: DefaultUserBudget,
		cursors: map[uint32]*cursor{}, kinds: map[fileid.ID]uint64{}}
	s.boot = bootTime(root, fs)
	s.own = s.container(self)
	return s, nil
}

// kcmpVM is kcmp(2)'s KCMP_VM (linux/kcmp.h): whether two processes share
// their memory.
const kcmpVM = 1

// fork tells whether pi is self between a fork and an exec: a child of
// self that shares its memory (kcmp(2)). A child of the broker that holds
// a lease (npurun-supervise) has exec'd: its memory is its own. Where
// kcmp cannot tell (a kernel without it), nobody is.
func (s *Scanner) fork(pi *Proc) bool {
	if pi == nil || pi.PPID != s.self {
		return false
	}
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(s.self), uintptr(pi.PID), kcmpVM, 0, 0, 0)
	return errno == 0 && r == 0
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

// Unknown is the account a process is charged to (Scan's budgets,
// Deferred) when its effective uid cannot be read: not a uid (it is
// (uid_t)-1, which no process has).
const Unknown = ^uint32(0)

// Scan looks at every process: its descriptors, then its maps.
//
// It does at most UserBudget of that work for the processes of one user:
// the process's effective uid (the owner of /proc/PID/fd, or, for a
// process that is not dumpable, whose directory is root's, the effective
// uid its status shows; Unknown where that cannot be read). Where a user's work runs out, the rest of
// that user's processes wait for the next scan, which begins that user's
// work where this one stopped (in the middle of a process, if need be)
// and goes on in pid order, round to the first. A process read over
// several scans counts as looked at in the one that reads its end, with
// all that was found in it along the way; each scan before that reports
// what it found there, and that the process was not looked at (Looked,
// Deferred). So one user with a great many descriptors delays the finding
// of that user's own use, not everyone's.
func (s *Scanner) Scan(t Targets) (*Result, error) { return s.everyProcess(t, s.scan) }

// everyProcess is what Scan and Sweep share: a result with its Looked and
// Deferred records, which look fills from the processes of /proc (unless
// t has nothing to look for), and the time it took.
func (s *Scanner) everyProcess(t Targets, look func(t Targets, r *Result, procs []procfs.Proc)) (*Result, error) {
	r := s.result()
	r.skipped, r.deferred = map[int]bool{}, map[uint32]bool{}
	if !t.empty() {
		procs, err := s.fs.AllProcs()
		if err != nil {
			return nil, err
		}
		look(t, r, procs)
	}
	r.Took = time.Since(r.At)
	return r, nil
}

// scan is Scan's look, at procs for t, into r.
func (s *Scanner) scan(t Targets, r *Result, procs []procfs.Proc) {
	slices.SortFunc(procs, func(a, b procfs.Proc) int { return a.PID - b.PID })
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.kinds) // one scan's: an inode may be reused
	b := new(buffers)
	lk := &look{s: s, t: t, r: r, b: b, maps: true, kinds: s.kinds}
	spent := map[uint32]int{}
	last := s.cursors
	s.cursors = map[uint32]*cursor{}
	var later []int // processes before their user's cursor: after all others
	one := func(pid int, second bool) {
		dir, uid, err := s.openFDDir(pid, b)
		if err != nil {
			return // gone, or not ours to read
		}
		defer unix.Close(dir)
		c := last[uid]
		if c != nil && pid < c.pid && !second {
			later = append(later, pid)
			return
		}
		if spent[uid] >= s.UserBudget {
			r.skipped[pid], r.deferred[uid] = true, true
			if s.cursors[uid] == nil {
				s.cursors[uid] = &cursor{pid: pid}
			}
			return
		}
		var from int64
		lk.found = nil
		if c != nil && pid == c.pid && c.start != 0 && s.Start(pid) == c.start {
			from, lk.found = c.pos, c.found
		}
		r.Procs++
		lk.left = s.UserBudget - spent[uid]
		pos, done := lk.process(pid, dir, from)
		spent[uid] = s.UserBudget - lk.left
		lk.record(pid)
		if !done {
			r.skipped[pid], r.deferred[uid] = true, true
			s.cursors[uid] = &cursor{pid: pid, start: s.Start(pid), pos: pos, found: lk.found}
		}
	}
	for _, p := range procs {
		if p.PID != s.self {
			one(p.PID, false)
		}
	}
	for _, pid := range later {
		one(pid, true)
	}
}

// Sweep looks at every process, its descriptors and its maps, whatever
// the budgets: the look that ends a lease, which must see every holder of
// its lock files (a user's many descriptors elsewhere may slow it, never
// hide one). It leaves Scan's cursors as they are, and runs beside a Scan.
// Every process it could open is looked at (Looked); Deferred is never
// set.
func (s *Scanner) Sweep(t Targets) (*Result, error) { return s.everyProcess(t, s.sweep) }

// sweep is Sweep's look, at procs for t, into r.
func (s *Scanner) sweep(t Targets, r *Result, procs []procfs.Proc) {
	b := new(buffers)
	lk := &look{s: s, t: t, r: r, b: b, maps: true, kinds: map[fileid.ID]uint64{}}
	for _, p := range procs {
		if p.PID == s.self {
			continue
		}
		dir, _, err := s.openFDDir(p.PID, b)
		if err != nil {
			continue // gone
		}
		r.Procs++
		lk.found, lk.left = nil, math.MaxInt
		lk.process(p.PID, dir, 0)
		unix.Close(dir)
		lk.record(p.PID)
	}
}

// Tree looks at the processes roots and their descendants, at most limit
// of them and at most UserBudget of work (as a scan does for one user):
// the cheap look that follows known holders between scans. It reads
// descriptors only, not maps: a holder that has a lock file mapped, its
// descriptor closed, is found by the next scan.
func (s *Scanner) Tree(roots []int, t Targets, limit int) *Result {
	r := s.result()
	seen := map[int]bool{s.self: true}
	looked := map[int]bool{}
	queue := slices.Clone(roots)
	b := new(buffers)
	lk := &look{s: s, t: t, r: r, b: b, left: s.UserBudget}
	for len(queue) > 0 && r.Procs < limit && lk.left > 0 {
		pid := queue[0]
		queue = queue[1:]
		if pid <= 0 || seen[pid] {
			continue
		}
		seen[pid] = true
		dir, _, err := s.openFDDir(pid, b)
		if err != nil {
			looked[pid] = true // gone
			continue
		}
		r.Procs++
		lk.found = nil
		_, done := lk.process(pid, dir, 0)
		unix.Close(dir)
		lk.record(pid)
		looked[pid] = done
		queue = append(queue, s.Children(pid)...)
	}
	for _, pid := range queue {
		if pid > 0 && !seen[pid] {
			r.Cut = true
			break
		}
	}
	r.looked = looked
	r.Took = time.Since(r.At)
	return r
}

func (s *Scanner) result() *Result {
	return &Result{At: time.Now(), Files: map[fileid.ID][]int{}, Nodes: map[uint64][]int{}, Mapped: map[uint64][]int{}, Info: map[int]*Proc{}}
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
	if c := s.container(pid); c != nil && (s.own == nil || c.ID != s.own.ID) {
		pi.Container = c
	}
	return pi, nil
}

// maxCgroup bounds what is read of a process's /proc/PID/cgroup: a line a
// hierarchy, a dozen on a hybrid machine.
const maxCgroup = 8192

// container reads the container process pid is in; nil for none, or where
// its control groups cannot be read.
func (s *Scanner) container(pid int) *wire.ContainerRef {
	var buf [maxCgroup]byte
	n, ok := s.readProcFile(pid, "cgroup", buf[:])
	if !ok {
		return nil
	}
	return container.FromCgroup(buf[:n])
}

// readProcFile reads the first len(buf) bytes of /proc/PID/name into buf
// (a process's files there are read to their end or to the buffer's, never
// past it): how many, and false where the file cannot be opened (the
// process gone, or not ours to read).
func (s *Scanner) readProcFile(pid int, name string, buf []byte) (int, bool) {
	path := s.root + "/" + strconv.Itoa(pid) + "/" + name
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return 0, false
	}
	defer unix.Close(fd)
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
	return n, true
}

// MaxCmdline bounds what a scan reads of a process's command line, in
// bytes: plenty for the board, which shows 256, where the arguments may
// run to megabytes (procfs's CmdLine reads up to one).
const MaxCmdline = 4096

// cmdline reads the arguments of process pid, their first MaxCmdline
// bytes only, cut at a UTF-8 boundary; nil for a kernel thread, a process
// that is exiting or gone.
func (s *Scanner) cmdline(pid int) []string {
	var buf [MaxCmdline]byte
	n, ok := s.readProcFile(pid, "cmdline", buf[:])
	if !ok {
		return nil
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
