package leaseend

import (
	"bytes"
	"log"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/internal/fileid"
	"github.com/npurun/npurun/internal/testfd"
	"github.com/npurun/npurun/npu"
)

// The ender in process: a real lease table on lock files in a temporary
// directory, the real /proc, real processes and a real socket's queue.

// eventWait bounds every wait in these tests.
const eventWait = 20 * time.Second

// revokes records the devices whose restricted entries a lease's end
// removed.
type revokes struct {
	mu  sync.Mutex
	ids []int
}

func (r *revokes) Revoke(id int, _ []uint32) error {
	r.mu.Lock()
	r.ids = append(r.ids, id)
	r.mu.Unlock()
	return nil
}

func (r *revokes) got() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.ids...)
}

// syncBuffer is a log's buffer; wrote hears of each write.
type syncBuffer struct {
	mu    sync.Mutex
	b     bytes.Buffer
	wrote chan struct{}
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case s.wrote <- struct{}{}:
	default:
	}
	return s.b.Write(p)
}

// await waits until the log holds each of want, and tells whether it
// came to.
func (s *syncBuffer) await(want ...string) bool {
	deadline := time.After(eventWait)
	for {
		all := true
		for _, w := range want {
			all = all && strings.Contains(s.String(), w)
		}
		if all {
			return true
		}
		select {
		case <-s.wrote:
		case <-deadline:
			return false
		}
	}
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// freeOwner hears of the table's releases and free devices.
type freeOwner struct{ freed chan struct{} }

func (o *freeOwner) Released(*lease.Lease, int, time.Time, bool) {}
func (o *freeOwner) Freed()                                      { o.freed <- struct{}{} }

// fixture is a table of one device, npu 0, a lease granted on it (its
// locked descriptor the test's), and an ender.
type fixture struct {
	table *lease.Table
	dir   string
	l     *lease.Lease
	fd    int
	freed chan struct{}
	acc   *revokes
	logs  *syncBuffer
	ender *Ender
}

func newFixture(t *testing.T, holder lease.Holder) *fixture {
	t.Helper()
	f := &fixture{dir: t.TempDir(), freed: make(chan struct{}, 16), acc: &revokes{}, logs: &syncBuffer{wrote: make(chan struct{}, 1)}}
	table, err := lease.Open(lease.Config{Dir: f.dir, IDs: []int{0}, Pools: []lease.Pool{{Name: "default"}}, DefaultPool: "default",
		Vendor: npu.Fake, Owner: &freeOwner{freed: f.freed}})
	if err != nil {
		t.Fatal(err)
	}
	table.Start(nil)
	f.table = table
	w, err := table.Admit(lease.Request{Holder: holder, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	table.Add(w)
	hs := table.Schedule(nil)
	if len(hs) != 1 {
		t.Fatalf("%d grants for one request on a free device", len(hs))
	}
	f.l = table.Commit(hs[0])
	f.fd = hs[0].FDs()[0]
	scanner, err := procscan.New("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	scanner.UserBudget = 1 // a sweep ignores it
	f.ender = New(Config{Table: table, Access: f.acc, Holders: scanner, Vendor: npu.Fake,
		Grace: func() time.Duration { return time.Minute }, Log: log.New(f.logs, "", 0)})
	return f
}

// waitFree waits until npu 0 is free again.
func (f *fixture) waitFree(t *testing.T, what string) {
	t.Helper()
	for f.table.Snapshot().Devices[0].State != lease.Free {
		select {
		case <-f.freed:
		case <-time.After(eventWait):
			t.Fatalf("%s: npu 0 not freed; the log says %q", what, f.logs.String())
		}
	}
}

// fileOf is the lock file open at fd.
func fileOf(t *testing.T, fd int) fileid.ID {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return fileid.ID{Dev: st.Dev, Ino: st.Ino}
}

// TestEndLease: a lease that is not a task's (as a Slurm job's, whose
// Epilog came) is ended as a task's is at its end: the restricted entry of
// its device goes at once, and a process that holds its lock file still
// (a real one, found in /proc) is sent SIGTERM, the log naming why. A
// lease that holds nothing any more is left alone.
func TestEndLease(t *testing.T) {
	f := newFixture(t, lease.Holder{Kind: lease.Inline, UID: uint32(os.Geteuid()), User: "alice"})
	holder := exec.Command("sleep", "60")
	lockFile := os.NewFile(uintptr(f.fd), "lock")
	holder.ExtraFiles = []*os.File{lockFile}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	lockFile.Close() // the holder's alone now
	exited := make(chan error, 1)
	go func() { exited <- holder.Wait() }()
	t.Cleanup(func() { holder.Process.Kill() })

	f.ender.End(f.table.HeldBy(f.l), "job 5 has ended")
	if ids := f.acc.got(); len(ids) != 1 || ids[0] != 0 {
		t.Errorf("devices revoked: %v; want npu 0", ids)
	}
	select {
	case err := <-exited:
		var ws syscall.WaitStatus
		if ee, ok := err.(*exec.ExitError); ok {
			ws = ee.Sys().(syscall.WaitStatus)
		}
		if !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
			t.Errorf("the lease's holder ended with %v; want SIGTERM", err)
		}
	case <-time.After(eventWait):
		t.Fatalf("the lease's holder still runs after End; the log says %q", f.logs.String())
	}
	want := "job 5 has ended: pid " + strconv.Itoa(holder.Process.Pid) + " ("
	if !f.logs.await(want, "still holds its lease of npu 0: sent SIGTERM") {
		t.Errorf("the log says %q; want %q… still holds its lease of npu 0: sent SIGTERM", f.logs.String(), want)
	}
	f.waitFree(t, "its holder ended")

	// Its device free again, the lease holds nothing: nothing to end.
	n := len(f.logs.String())
	f.ender.End(f.table.HeldBy(f.l), "job 5 has ended")
	if ids := f.acc.got(); len(ids) != 1 {
		t.Errorf("devices revoked for a lease that holds nothing: %v", ids[1:])
	}
	if got := f.logs.String()[n:]; got != "" {
		t.Errorf("a lease that holds nothing ended with %q in the log", got)
	}
}

// TestEndInFlight: a lease whose holder has ended, its only descriptor in
// a socket's queue (no process has it), ends all the same: the device is
// free again, on a fresh lock file, while the descriptor is in flight;
// received later, it holds the old file.
func TestEndInFlight(t *testing.T) {
	f := newFixture(t, lease.Holder{Kind: lease.Task, UID: uint32(os.Geteuid()), User: "alice", Task: 7})
	sock := testfd.InFlight(t, f.fd)
	f.ender.End(f.table.HeldBy(f.l), "task 7 has ended")
	f.waitFree(t, "its descriptor in flight")
	if !f.logs.await("task 7 has ended: no process holds its lease of npu 0, whose lock is held still by a descriptor no process has") {
		t.Errorf("the log says %q", f.logs.String())
	}
	late := testfd.Receive(t, sock)
	defer unix.Close(late)
	if got := fileOf(t, late); got != f.l.Files[0] {
		t.Errorf("the descriptor received late is on %v, want the lease's old file %v", got, f.l.Files[0])
	}
	if cur := f.table.Snapshot().Devices[0].File; cur == f.l.Files[0] {
		t.Error("npu 0 is on the ended lease's lock file still")
	}
}

// TestFollow: a lease held by a process tree is followed: while the
// process it was granted to runs, a descriptor of it in flight ends
// nothing; once that process is gone, and a process it passed the lease
// to holds it, nothing either; once that one is gone too, the lease ends
// although its descriptor is in flight.
func TestFollow(t *testing.T) {
	granted := exec.Command("sleep", "60")
	if err := granted.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { granted.Process.Kill(); granted.Wait() })
	scanner, err := procscan.New("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, lease.Holder{Kind: lease.Inline, UID: uint32(os.Geteuid()), User: "alice",
		PID: granted.Process.Pid, PIDStart: scanner.Start(granted.Process.Pid)})

	// A holder the lease was passed to, and a copy in flight.
	dup, err := unix.Dup(f.fd)
	if err != nil {
		t.Fatal(err)
	}
	passed := exec.Command("sleep", "60")
	lockFile := os.NewFile(uintptr(dup), "lock")
	passed.ExtraFiles = []*os.File{lockFile}
	if err := passed.Start(); err != nil {
		t.Fatal(err)
	}
	lockFile.Close()
	t.Cleanup(func() { passed.Process.Kill(); passed.Wait() })
	sock := testfd.InFlight(t, f.fd)

	f.ender.Follow(f.l)
	granted.Process.Kill()
	granted.Wait()
	// The follow sweeps now, finds the passed holder and waits on it:
	// the lease is held.
	if !f.table.Holds(f.l, 0) {
		t.Fatal("the lease ended while a process it was passed to holds it")
	}
	passed.Process.Kill()
	passed.Wait()
	f.waitFree(t, "its holders gone, its descriptor in flight")
	if !f.logs.await("the lease of alice (lease " + strconv.FormatUint(f.l.ID, 10) + ") has no holder left: no process holds its lease of npu 0") {
		t.Errorf("the log says %q", f.logs.String())
	}
	if s := f.logs.String(); strings.Contains(s, "sent SIG") {
		t.Errorf("a follow signalled a holder: %q", s)
	}
	late := testfd.Receive(t, sock)
	unix.Close(late)
}

// TestFollowEndsWithLease: a lease followed that ends as leases do (its
// lock released), while the process it was granted to lives on, ends its
// follow once the table says so (Released): no pidfd is kept for it.
func TestFollowEndsWithLease(t *testing.T) {
	granted := exec.Command("sleep", "60")
	if err := granted.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { granted.Process.Kill(); granted.Wait() })
	f := newFixture(t, lease.Holder{Kind: lease.Inline, UID: uint32(os.Geteuid()), User: "alice", PID: granted.Process.Pid})
	f.ender.Follow(f.l)
	waitDescriptors(t, f.ender, 1)
	unix.Close(f.fd)
	f.waitFree(t, "its lock released")
	f.ender.Released(f.l)
	waitDescriptors(t, f.ender, 0)
}

// waitDescriptors waits until e holds n descriptors.
func waitDescriptors(t *testing.T, e *Ender, n int) {
	t.Helper()
	deadline := time.Now().Add(eventWait)
	for e.Descriptors() != n {
		if time.Now().After(deadline) {
			t.Fatalf("the ender holds %d descriptors, want %d", e.Descriptors(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// meanwhile is the real /proc scanner with something done during its
// first sweep, before /proc is read, and the signals it was asked to send.
type meanwhile struct {
	*procscan.Scanner
	during  func()
	mu      sync.Mutex
	signals []int
}

func (m *meanwhile) Sweep(t procscan.Targets) (*procscan.Result, error) {
	if d := m.during; d != nil {
		m.during = nil
		d()
	}
	return m.Scanner.Sweep(t)
}

func (m *meanwhile) Signal(pid int, start uint64, sig unix.Signal) error {
	m.mu.Lock()
	m.signals = append(m.signals, pid)
	m.mu.Unlock()
	return m.Scanner.Signal(pid, start, sig)
}

// holdIn starts a process that holds the lock descriptor fd (closed here).
func holdIn(t *testing.T, fd int) *exec.Cmd {
	t.Helper()
	lockFile := os.NewFile(uintptr(fd), "lock")
	defer lockFile.Close()
	p := exec.Command("sleep", "60")
	p.ExtraFiles = []*os.File{lockFile}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Process.Kill(); p.Wait() })
	return p
}

// TestSweepLeaseEndedMeanwhile: a task's lease is ended (End), and while
// the sweep that looks for its holders runs, the lease is released and
// its device granted on, its old lock file gone and its inode number
// given to a later lease's file (the file system reuses freed inodes, as
// ext4 does): the process holding that later file is found under the old
// lease's file identity, and must not be signalled. The sweep trusts what
// it found only for a lease that holds its device still once /proc has
// been read (TestRoomsLockOrder had a task killed as "cancelled" so, in
// CI).
func TestSweepLeaseEndedMeanwhile(t *testing.T) {
	f := newFixture(t, lease.Holder{Kind: lease.Task, UID: uint32(os.Geteuid()), User: "alice", Task: 7})
	old := f.l.Files[0]
	first := holdIn(t, f.fd)
	held := f.table.HeldBy(f.l)
	scanner := f.ender.c.Holders.(*procscan.Scanner)
	var later *exec.Cmd
	reused := false
	m := &meanwhile{Scanner: scanner, during: func() {
		first.Process.Kill()
		first.Wait()
		f.waitFree(t, "its holder killed")
		// Leases come and go on npu 0 until one is on a file with the
		// old file's identity.
		for range 200 {
			w, err := f.table.Admit(lease.Request{Holder: lease.Holder{Kind: lease.Inline, UID: uint32(os.Geteuid()), User: "bob"}, N: 1})
			if err != nil {
				t.Fatal(err)
			}
			f.table.Add(w)
			hs := f.table.Schedule(nil)
			if len(hs) != 1 {
				t.Fatalf("%d grants for one request on a free device", len(hs))
			}
			f.table.Commit(hs[0])
			fd := hs[0].FDs()[0]
			if fileOf(t, fd) == old {
				later, reused = holdIn(t, fd), true
				return
			}
			unix.Close(fd)
			f.waitFree(t, "a lease let go")
		}
	}}
	f.ender.c.Holders = m
	found, done := f.ender.sweep(held, "task 7 has ended", unix.SIGTERM)
	if !reused {
		t.Logf("no later lock file took the inode number of the old one in 200 leases (%s does not reuse them): nothing to check", f.dir)
		return
	}
	if len(found) != 0 || !done {
		t.Errorf("the sweep for an ended lease found %d holders (done: %v); want none", len(found), done)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.signals) != 0 {
		t.Errorf("signalled pids %v, the later lease's holder being %d: the ended lease's sweep signalled another lease's holder", m.signals, later.Process.Pid)
	}
}
