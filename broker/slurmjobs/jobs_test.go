package slurmjobs

import (
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/internal/fileid"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/wire"
)

// The room in process, on a real lease table (real lock files, flock and
// release watchers in a temporary directory) whose Slurm devices are 2
// and 3 (gres.conf positions 0 and 1); the job's processes are real
// processes holding the lease's descriptors (pidfd_getfd takes copies
// from them); the broker is a test owner that records what it is asked.

const eventWait = 10 * time.Second

// owner is the test's broker: the lease table's owner and the room's.
type owner struct {
	t     *testing.T
	tbl   *lease.Table
	room  *Room
	mu    sync.Mutex
	ended []string           // End's why, in order
	onEnd func(*lease.Lease) // what End does besides
	freed chan int           // the releases the table reported, by device
}

func (o *owner) Released(l *lease.Lease, id int, _ time.Time, last bool) {
	o.room.Released(l, id, last)
	o.freed <- id
}

func (o *owner) Freed() { o.room.Freed() }

func (o *owner) Begin(h *lease.Handover) *lease.Lease { return o.tbl.Commit(h) }

func (o *owner) End(l *lease.Lease, why string) {
	o.mu.Lock()
	o.ended = append(o.ended, why)
	f := o.onEnd
	o.mu.Unlock()
	if f != nil {
		f(l)
	}
}

func (o *owner) Extern(*lease.Lease, int, uint64) {}

func (o *owner) Holders(*lease.Lease) []Proc { return nil }

func (o *owner) endedWith(prefix string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.ContainsFunc(o.ended, func(s string) bool { return strings.HasPrefix(s, prefix) })
}

// newRoom opens a table of devices 0-3 (2 and 3 Slurm's, in no pool) and
// the room, with state in state ("" for a directory of its own).
func newRoom(t *testing.T, state string) *owner {
	t.Helper()
	dir := t.TempDir()
	if state == "" {
		state = filepath.Join(dir, "state")
	}
	o := &owner{t: t, freed: make(chan int, 64)}
	tbl, err := lease.Open(lease.Config{Dir: filepath.Join(dir, "locks"), IDs: []int{0, 1, 2, 3}, Pools: []lease.Pool{{Name: "own", IDs: []int{0, 1}}},
		DefaultPool: "own", Vendor: npu.Fake, Owner: o})
	if err != nil {
		t.Fatal(err)
	}
	tbl.Start(nil)
	o.tbl = tbl
	o.room, err = Open(Config{Slurm: policy.Slurm{Devices: []int{2, 3}, Mode: policy.ModeSplit, GRES: "gpu"}, Table: tbl,
		LockDir: filepath.Join(dir, "locks"), StateDir: state, Vendor: npu.Fake, Owner: o, Log: newLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// testLog keeps the room's log, for a failed test's output (the room's
// goroutines may write after the test has ended).
type testLog struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func newLog(t *testing.T) *log.Logger {
	l := &testLog{}
	t.Cleanup(func() {
		if t.Failed() {
			l.mu.Lock()
			t.Logf("the room's log:\n%s", l.buf.String())
			l.mu.Unlock()
		}
	})
	return log.New(l, "", 0)
}

// holder is a process that holds copies of descriptors fds (a job's
// extern step, a task): sleep, given them at 3 and above.
func holder(t *testing.T, fds []int) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	for _, fd := range fds {
		d, err := unix.Dup(fd)
		if err != nil {
			t.Fatal(err)
		}
		cmd.ExtraFiles = append(cmd.ExtraFiles, os.NewFile(uintptr(d), "lease"))
	}
	err := cmd.Start()
	for _, f := range cmd.ExtraFiles {
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// on tells whether fds are open on files, in order.
func on(t *testing.T, fds []int, files []fileid.ID) bool {
	t.Helper()
	if len(fds) != len(files) {
		return false
	}
	for i, fd := range fds {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || (fileid.ID{Dev: st.Dev, Ino: st.Ino}) != files[i] {
			return false
		}
	}
	return true
}

// leased tells whether the table shows device id leased.
func (o *owner) leased(id int) bool {
	for _, d := range o.tbl.Snapshot().Devices {
		if d.ID == id {
			return d.State == lease.Leased
		}
	}
	return false
}

// awaitFreed waits until the table has released devices ids.
func (o *owner) awaitFreed(t *testing.T, ids ...int) {
	t.Helper()
	left := slices.Clone(ids)
	deadline := time.After(eventWait)
	for len(left) > 0 {
		select {
		case id := <-o.freed:
			if i := slices.Index(left, id); i >= 0 {
				left = slices.Delete(left, i, i+1)
			}
		case <-deadline:
			t.Fatalf("npu %v not released", left)
		}
	}
}

// leaseOf is the table's lease of Slurm job id, nil if none.
func (o *owner) leaseOf(id uint32) *lease.Lease {
	for _, d := range o.tbl.Snapshot().Devices {
		for _, l := range d.Leases {
			if l.SlurmJob == id {
				return l
			}
		}
	}
	return nil
}

// TestJobLease: a job's lease through its life. Its Prolog maps gres.conf
// positions to the devices and the broker holds their locks, the job
// recorded on disk; a task that starts before the extern step gets
// copies of the broker's own; the extern step takes the descriptors and
// the broker's are closed (the lock stays held, by the step alone); a
// task then gets copies taken from the step, on the same lock files; the
// Epilog ends what holds the lease, the lease ends with its last holder
// and its record goes. A Prolog told again answers the same; one of
// another user for the same job is refused; Slurm operations for a job
// with no lease are ignored.
func TestJobLease(t *testing.T) {
	o := newRoom(t, "")
	job := wire.SlurmJob{ID: 42, UID: uint32(os.Getuid()), GRES: "1,0"}
	devices, msg, err := o.room.Prolog(job, nil)
	if err != nil || !slices.Equal(devices, []int{3, 2}) {
		t.Fatalf("Prolog: %v, %v", devices, err)
	}
	if !strings.HasPrefix(msg, "job 42 of ") || !strings.HasSuffix(msg, " holds npu 2-3") {
		t.Errorf("Prolog said %q", msg)
	}
	l := o.leaseOf(42)
	if l == nil || l.Kind != lease.Slurm || !slices.Equal(l.Devices, []int{3, 2}) {
		t.Fatalf("job 42's lease: %+v", l)
	}
	if !o.leased(2) || !o.leased(3) {
		t.Error("job 42's devices are not leased after its Prolog")
	}
	rec := new(record)
	if err := readRecord(recordPath(o.room.rec.dir, 42), rec); err != nil || rec.State != told || !slices.Equal(rec.Devices, []int{3, 2}) || len(rec.Inodes) != 2 {
		t.Errorf("job 42's record after its Prolog: %+v, %v", rec, err)
	}
	if again, _, err := o.room.Prolog(job, nil); err != nil || !slices.Equal(again, devices) {
		t.Errorf("the Prolog again: %v, %v", again, err)
	}
	other := job
	other.UID++
	if _, _, err := o.room.Prolog(other, nil); err == nil {
		t.Error("a Prolog of job 42 for another uid is answered")
	}

	// The batch step before the extern step: copies of the broker's.
	g, err := o.room.Task(42, os.Getpid())
	if err != nil || g == nil || !on(t, g.FDs, l.Files) {
		t.Fatalf("a task while the broker holds the lease: %+v, %v", g, err)
	}
	batch := holder(t, g.FDs)
	g.Done(true)

	// The extern step takes the lease; the broker keeps nothing.
	g, err = o.room.Hold(42, os.Getpid())
	if err != nil || g == nil || !on(t, g.FDs, l.Files) {
		t.Fatalf("slurm-hold: %+v, %v", g, err)
	}
	extern := holder(t, g.FDs)
	g.Done(true)
	// The extern step is the caller of slurm-hold, which received the
	// descriptors on its socket: here, the holder started with them.
	// Copies are taken from it alone (the tasks before forgotten).
	o.room.mu.Lock()
	j := o.room.jobs[42]
	j.extern = Proc{extern.Process.Pid, o.room.startOf(extern.Process.Pid)}
	j.tasks = nil
	brokerFDs := j.fds
	o.room.mu.Unlock()
	if brokerFDs != nil {
		t.Error("the broker holds descriptors of job 42's lease after its extern step took them")
	}
	batch.Process.Kill()
	batch.Wait()
	if err := readRecord(recordPath(o.room.rec.dir, 42), rec); err != nil || rec.State != held {
		t.Errorf("job 42's record once held: %+v, %v", rec, err)
	}

	// A task now: copies from the extern step.
	g, err = o.room.Task(42, os.Getpid())
	if err != nil || g == nil || !on(t, g.FDs, l.Files) {
		t.Fatalf("a task once the extern step holds the lease: %+v, %v", g, err)
	}
	g.Done(true)

	if g, err := o.room.Task(7, os.Getpid()); g != nil || err != nil {
		t.Errorf("a task of a job with no lease: %+v, %v", g, err)
	}
	if msg := o.room.Epilog(wire.SlurmJob{ID: 7}); msg != "no lease of job 7" {
		t.Errorf("the Epilog of a job with no lease: %q", msg)
	}

	// The Epilog: what holds the lease is ended (here: the extern step).
	o.onEnd = func(*lease.Lease) { extern.Process.Kill() }
	if msg := o.room.Epilog(wire.SlurmJob{ID: 42}); msg != "job 42's lease of npu 2-3 ends" {
		t.Errorf("the Epilog said %q", msg)
	}
	if !o.endedWith("job 42 ended") {
		t.Errorf("the Epilog did not end job 42's lease: %v", o.ended)
	}
	o.awaitFreed(t, 2, 3) // the extern step's end ends the lease: the broker held no copy
	if _, err := os.Stat(recordPath(o.room.rec.dir, 42)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("job 42's record after its lease's end: %v", err)
	}
	if g, _ := o.room.Hold(42, os.Getpid()); g != nil {
		t.Error("slurm-hold of an ended job is answered with a grant")
	}
	if msg := o.room.Epilog(wire.SlurmJob{ID: 42}); msg != "no lease of job 42" {
		t.Errorf("the Epilog again: %q", msg)
	}
}

// TestPrologEndsStray: a job given devices that an earlier job's
// processes still hold (escaped its end) ends them, says why it waits,
// and has the devices once they are gone.
func TestPrologEndsStray(t *testing.T) {
	o := newRoom(t, "")
	uid := uint32(os.Getuid())
	if _, _, err := o.room.Prolog(wire.SlurmJob{ID: 41, UID: uid, GRES: "0"}, nil); err != nil {
		t.Fatal(err)
	}
	g, err := o.room.Hold(41, os.Getpid())
	if err != nil || g == nil {
		t.Fatal(g, err)
	}
	stray := holder(t, g.FDs)
	g.Done(true)
	o.onEnd = func(*lease.Lease) { stray.Process.Kill() }
	var said []string
	var devices []int
	done := make(chan struct{})
	go func() {
		defer close(done)
		devices, _, err = o.room.Prolog(wire.SlurmJob{ID: 43, UID: uid, GRES: "0"}, func(why string) { said = append(said, why) })
	}()
	select {
	case <-done:
	case <-time.After(eventWait):
		t.Fatal("job 43's Prolog waits on: job 41's processes were not ended")
	}
	if err != nil || !slices.Equal(devices, []int{2}) {
		t.Fatalf("job 43's Prolog: %v, %v", devices, err)
	}
	if want := []string{"npu 2 is still held by job 41's processes"}; !slices.Equal(said, want) {
		t.Errorf("job 43's Prolog said %q, want %q", said, want)
	}
	if !o.endedWith("Slurm gave its devices to job 43") {
		t.Errorf("job 41's lease was not ended: %v", o.ended)
	}
	if l := o.leaseOf(43); l == nil || !o.leased(2) {
		t.Error("job 43 holds no lease of npu 2")
	}
	if l := o.leaseOf(41); l != nil {
		t.Errorf("job 41's lease is still in the table: %+v", l)
	}
	o.room.Epilog(wire.SlurmJob{ID: 43})
	o.awaitFreed(t, 2, 2)
}

// TestPrologCancelled: a Prolog waiting for devices gives up at its job's
// Epilog.
func TestPrologCancelled(t *testing.T) {
	o := newRoom(t, "")
	uid := uint32(os.Getuid())
	if _, _, err := o.room.Prolog(wire.SlurmJob{ID: 41, UID: uid, GRES: "1"}, nil); err != nil {
		t.Fatal(err)
	}
	g, err := o.room.Hold(41, os.Getpid())
	if err != nil || g == nil {
		t.Fatal(g, err)
	}
	stray := holder(t, g.FDs) // a process that ignores being ended
	g.Done(true)
	waiting := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		_, _, err := o.room.Prolog(wire.SlurmJob{ID: 44, UID: uid, GRES: "1"}, func(why string) { waiting <- why })
		done <- err
	}()
	select {
	case <-waiting:
	case <-time.After(eventWait):
		t.Fatal("job 44's Prolog does not wait")
	}
	if msg := o.room.Epilog(wire.SlurmJob{ID: 44}); msg != "job 44 ended before its devices were free" {
		t.Errorf("job 44's Epilog said %q", msg)
	}
	select {
	case err := <-done:
		var r *Refusal
		if !errors.As(err, &r) || r.Code != wire.CodeBusy {
			t.Errorf("job 44's Prolog: %v", err)
		}
	case <-time.After(eventWait):
		t.Fatal("job 44's Prolog waits on after its Epilog")
	}
	stray.Process.Kill()
	o.awaitFreed(t, 3)
}

// TestPrologRefusals: positions past gres_devices, or none, are no-slurm;
// a user whose name is another uid's is bad-request.
func TestPrologRefusals(t *testing.T) {
	o := newRoom(t, "")
	for _, tc := range []struct {
		job  wire.SlurmJob
		code string
		msg  string
	}{
		{wire.SlurmJob{ID: 1, GRES: "2"}, wire.CodeNoSlurm, `gres "2": gres position 2 is past [slurm] gres_devices, which lists 2 devices: the map and gres.conf disagree ([slurm] gres_devices = "2-3")`},
		{wire.SlurmJob{ID: 1, GRES: ""}, wire.CodeNoSlurm, `gres "" names no device`},
		{wire.SlurmJob{ID: 1, UID: 4242, User: "root", GRES: "0"}, wire.CodeBadRequest, `user "root" is uid 0, not the job's uid 4242`},
	} {
		_, _, err := o.room.Prolog(tc.job, nil)
		var r *Refusal
		if !errors.As(err, &r) || r.Code != tc.code || r.Msg != tc.msg {
			t.Errorf("Prolog %+v: %v, want %s %q", tc.job, err, tc.code, tc.msg)
		}
	}
}

// TestRecordsAdoptable: the records an earlier broker left are read back,
// and a job's lease is adoptable only where each of its devices is held
// on the lock file its record names.
func TestRecordsAdoptable(t *testing.T) {
	state := t.TempDir()
	rs, err := openRecords(state, 2)
	if err != nil {
		t.Fatal(err)
	}
	rec := &record{Job: 9, UID: 5, User: "u5", Devices: []int{3, 2}, Lease: 77, Since: 1000, FSDev: 8, Inodes: []uint64{30, 20}, State: held, Extern: 99, Start: 12}
	if err := rs.write(rec); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(rs.dir, ".10.new"), []byte("{"), 0o600) // a write cut short
	os.WriteFile(filepath.Join(rs.dir, "11"), []byte("not json"), 0o600)
	o := newRoom(t, state)
	if len(o.room.rec.read) != 1 || o.room.rec.read[0].Job != 9 {
		t.Fatalf("records read back: %+v", o.room.rec.read)
	}
	for _, name := range []string{".10.new", "11"} {
		if _, err := os.Stat(filepath.Join(rs.dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left: %v", name, err)
		}
	}
	pool := func(int) string { return "" }
	if got := o.room.Adoptable(map[int]fileid.ID{3: {Dev: 8, Ino: 30}}, pool); len(got) != 0 {
		t.Errorf("adoptable with npu 2 free: %+v", got)
	}
	if got := o.room.Adoptable(map[int]fileid.ID{3: {Dev: 8, Ino: 30}, 2: {Dev: 8, Ino: 21}}, pool); len(got) != 0 {
		t.Errorf("adoptable with npu 2 on another file: %+v", got)
	}
	got := o.room.Adoptable(map[int]fileid.ID{3: {Dev: 8, Ino: 30}, 2: {Dev: 8, Ino: 20}}, pool)
	if len(got) != 1 || got[0].ID != 77 || got[0].Kind != lease.Slurm || got[0].SlurmJob != 9 || got[0].User != "u5" || got[0].PID != 99 ||
		!slices.Equal(got[0].Devices, []int{3, 2}) {
		t.Errorf("adoptable: %+v", got)
	}
}

// TestResumeRelocks: a job whose lease the earlier broker held alone (its
// Prolog answered, no extern step yet) is locked again for it at start;
// one whose lease was held by its processes and is free now ended
// meanwhile, and its record goes.
func TestResumeRelocks(t *testing.T) {
	state := t.TempDir()
	rs, err := openRecords(state, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range []*record{
		{Job: 5, UID: 1, User: "u1", Devices: []int{2}, FSDev: 1, Inodes: []uint64{1}, State: told},
		{Job: 6, UID: 1, User: "u1", Devices: []int{3}, FSDev: 1, Inodes: []uint64{2}, State: held},
	} {
		if err := rs.write(rec); err != nil {
			t.Fatal(err)
		}
	}
	o := newRoom(t, state)
	o.room.Resume(nil)
	l := o.leaseOf(5)
	if l == nil || l.Kind != lease.Slurm || !slices.Equal(l.Devices, []int{2}) || !o.leased(2) {
		t.Fatalf("job 5 after the restart: %+v", l)
	}
	if o.leaseOf(6) != nil || o.leased(3) {
		t.Error("job 6, whose lease ended while the broker was down, holds npu 3")
	}
	if _, err := os.Stat(recordPath(rs.dir, 6)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("job 6's record: %v", err)
	}
	rec := new(record)
	if err := readRecord(recordPath(rs.dir, 5), rec); err != nil || rec.State != told || rec.Lease != l.ID {
		t.Errorf("job 5's record after the restart: %+v, %v", rec, err)
	}
	// Its extern step takes the lease from the broker, as before.
	g, err := o.room.Hold(5, os.Getpid())
	if err != nil || g == nil || !on(t, g.FDs, l.Files) {
		t.Fatalf("slurm-hold after the restart: %+v, %v", g, err)
	}
	g.Done(false) // not sent: the broker keeps holding, until the Epilog
	if !o.leased(2) {
		t.Error("a hold not sent let the lease go")
	}
	o.room.Epilog(wire.SlurmJob{ID: 5})
	o.awaitFreed(t, 2)
}

// TestParse: what the room reads of Slurm's commands.
func TestParse(t *testing.T) {
	got := parseSqueue("12 PENDING Resources\n13 RUNNING None\n\nbad line\n14 PENDING QOSMaxJobsPerUserLimit extra\n")
	want := map[uint32]jobState{12: {"PENDING", "Resources"}, 13: {"RUNNING", "None"}, 14: {"PENDING", "QOSMaxJobsPerUserLimit extra"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("squeue: %v, want %v", got, want)
	}
	for line, id := range map[string]uint32{"salloc: Granted job allocation 123": 123, "salloc: Pending job allocation 5": 0, "Granted job allocation x": 0} {
		if got := grantedJob(line); got != id {
			t.Errorf("salloc's %q: %d, want %d", line, got, id)
		}
	}
}
