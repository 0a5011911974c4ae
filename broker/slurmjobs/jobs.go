// Package slurmjobs is the broker's room for a Slurm node: the leases of
// Slurm jobs from their Prolog to their end, their records on disk, and the
// placeholder allocations of allocate mode. Its lock is taken after its
// owner's and nothing slow (a disk write, /proc, pidfd_getfd, a Slurm
// command) happens under it; it must never touch a client's socket or a
// task.
package slurmjobs

// A Slurm job's lease (kind lease.Slurm) lives through these states:
//
//	told     its Prolog named the devices Slurm gave it: the broker
//	         claimed them (lease.Table.Claim), opened them to a
//	         restricted user, and holds the lease's locked descriptors
//	         itself, the only time it does; the job's record is on disk
//	held     its extern step (the SPANK plugin in slurmstepd) took the
//	         descriptors: the broker closed its own, and the job's
//	         processes alone hold the lease; each task takes copies
//	         (pidfd_getfd from the extern step, or from any other holder)
//	ending   its Epilog came while something still holds the lease: the
//	         broker let go of its own copy, if it still held one, and the
//	         broker ends the holders (SIGTERM, SIGKILL after kill_grace)
//	ended    the release watcher saw the lock go, however the job ended:
//	         the lease ends as any lease (fresh lock files, ACL entries
//	         gone, usage), and the record goes
//
// A job without an extern step (slurm.conf without PrologFlags=Contain)
// stays told until its Epilog: the broker's copy holds the lease.
//
// Lock order: the broker's lock (or the task room's, which asks Why of a
// waiting task), then the room's, then the lease table's. The room calls
// its owner (Owner) holding no lock of its own, and nothing slow (a disk
// write, /proc, pidfd_getfd, a Slurm command) happens under its lock.

import (
	"errors"
	"fmt"
	"log"
	"os/user"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/internal/fileid"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/wire"
)

// Owner is what the room needs of the broker.
type Owner interface {
	// Begin commits handover h, a Slurm job's lease or a placeholder's
	// grant delivered, and records it (the ledger, the accounting log):
	// the lease begins. Called holding no lock of the room's.
	Begin(h *lease.Handover) *lease.Lease
	// End ends lease l now: its devices closed to restricted accounts at
	// once, the processes that hold it sent SIGTERM, then SIGKILL after
	// kill_grace (start times checked). The lease itself ends when its
	// watcher sees the lock go. why names the cause, for the log.
	End(l *lease.Lease, why string)
	// Extern notes the process that holds l for its job, its extern
	// step, where status looks first for l's holders.
	Extern(l *lease.Lease, pid int, start uint64)
	// Holders returns the processes that /proc shows holding l's lock
	// files: where copies for a task are taken when the extern step
	// and the known tasks hold them no more.
	Holders(l *lease.Lease) []Proc
}

// Proc names a process for good: its pid and start time (clock ticks
// after boot, /proc/PID/stat).
type Proc struct {
	PID   int
	Start uint64
}

// Config configures a Room.
type Config struct {
	Slurm    policy.Slurm
	Table    *lease.Table
	LockDir  string // the lease table's lock files (lease.LockPath)
	StateDir string // the broker's state directory: records in StateDir/slurm/jobs
	Vendor   npu.Vendor
	Owner    Owner
	Log      *log.Logger
	// ProcRoot is where /proc is read ("" for /proc).
	ProcRoot string
	// Env is the environment of the Slurm commands the broker runs
	// (SLURM_CONF), in allocate mode.
	Env []string
	// KillGrace is the tasks' kill_grace: how long a lease's processes
	// have between SIGTERM and SIGKILL, which the Prolog of a job whose
	// devices an earlier job's processes hold waits for.
	KillGrace time.Duration
	// Wake is woken by the lease table when a request of a Slurm pool
	// joins or leaves its line (lease.Config.External), in allocate mode.
	Wake chan struct{}
}

// state is a job lease's state (see the package's comment).
type state string

const (
	claiming state = "claiming" // its Prolog waits for the devices
	told     state = "told"
	held     state = "held"
)

// job is a Slurm job's lease, under Room.mu.
type job struct {
	id      uint32
	uid     uint32
	user    string
	devices []int // physical ids, in the order of the job's positions
	state   state
	ending  bool          // its Epilog came
	cancel  chan struct{} // closed at its Epilog, while it is claiming
	ready   chan struct{} // closed once its Prolog is done, well or not

	files  []fileid.ID // the lease's lock files, from its claim
	since  time.Time
	l      *lease.Lease
	fds    []int // the broker's locked descriptors, while told
	extern Proc  // the extern step, once it took the lease
	tasks  []Proc
	err    error // why its Prolog failed, for a second Prolog waiting on ready
}

// maxTaskHints bounds the tasks a job remembers as holders to take
// copies from, most recent first.
const maxTaskHints = 8

// Room is the Slurm node's room.
type Room struct {
	cfg    Config
	s      policy.Slurm
	table  *lease.Table
	owner  Owner
	log    *log.Logger
	vendor npu.Vendor
	rec    *records

	freedMu sync.Mutex
	freed   chan struct{} // closed at the next device the table frees

	mu        sync.Mutex
	jobs      map[uint32]*job
	permSaid  bool // pidfd_getfd's EPERM is in the log
	noExtern  bool // a job without an extern step is in the log
	cancelled map[uint32]bool
	ph        *placeholders // allocate mode's placeholders; nil in split mode
}

// Open opens the room: the records of the jobs' leases of an earlier
// broker are read, for Adoptable and Resume.
func Open(c Config) (*Room, error) {
	if c.Log == nil {
		return nil, errors.New("slurmjobs: no log")
	}
	if c.ProcRoot == "" {
		c.ProcRoot = "/proc"
	}
	r := &Room{cfg: c, s: c.Slurm, table: c.Table, owner: c.Owner, log: c.Log, vendor: c.Vendor,
		freed: make(chan struct{}), jobs: map[uint32]*job{}}
	var err error
	if r.rec, err = openRecords(c.StateDir, len(c.Slurm.Devices)); err != nil {
		return nil, err
	}
	if c.Slurm.Mode == policy.ModeAllocate {
		r.ph = newPlaceholders(r)
	}
	return r, nil
}

// maxJobs bounds the jobs the room knows at once: each holds a device,
// or waits in its Prolog for one.
func (r *Room) maxJobs() int { return 4*len(r.s.Devices) + 16 }

// Refusal is a Slurm operation refused: a wire error code and the
// message.
type Refusal struct {
	Code string
	Msg  string
}

func (e *Refusal) Error() string { return e.Msg }

func refuse(code, format string, args ...any) *Refusal {
	return &Refusal{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// Devices maps a job's GRES (SLURM_JOB_GPUS: gres.conf positions) to
// physical devices.
func (r *Room) Devices(gres string) ([]int, error) {
	pos, err := policy.ParsePositions(gres)
	if err != nil {
		return nil, refuse(wire.CodeNoSlurm, "%v", err)
	}
	if len(pos) == 0 {
		return nil, refuse(wire.CodeNoSlurm, "gres %q names no device", gres)
	}
	ids, err := r.s.Map(pos)
	if err != nil {
		return nil, refuse(wire.CodeNoSlurm, "gres %q: %v ([slurm] gres_devices = %q)", gres, err, npu.FormatIDs(r.s.Devices))
	}
	return ids, nil
}

// checkUser checks the user a Prolog names against its uid: a name that
// resolves to another uid is an error; one that does not resolve is
// taken as said (the uid is the truth). It returns the name to record.
func checkUser(uid uint32, name string) (string, error) {
	if name == "" {
		if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
			return u.Username, nil
		}
		return "uid " + strconv.FormatUint(uint64(uid), 10), nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return name, nil
	}
	if u.Uid != strconv.FormatUint(uint64(uid), 10) {
		return "", refuse(wire.CodeBadRequest, "user %q is uid %s, not the job's uid %d", name, u.Uid, uid)
	}
	return name, nil
}

// Prolog serves a job's Prolog: it claims the job's devices for its
// lease, opens them to a restricted user, records the job on disk and
// returns the devices and a message for slurmd's log. While the
// devices are held by what an earlier job (or lease) left running, it
// ends those and waits, telling progress why; it goes on when the Prolog
// has given up waiting (Slurm gave the job the devices), until the job's
// Epilog. A Prolog told again (slurmd tries again) is answered as the
// first was.
func (r *Room) Prolog(sj wire.SlurmJob, progress func(reason string)) ([]int, string, error) {
	ids, err := r.Devices(sj.GRES)
	if err != nil {
		return nil, "", err
	}
	name, err := checkUser(sj.UID, sj.User)
	if err != nil {
		return nil, "", err
	}
	r.mu.Lock()
	if ph := r.ph; ph != nil {
		// A placeholder's job may start before its sbatch has answered:
		// while placeholders are being submitted, a job not known yet
		// waits for them.
		deadline := time.NewTimer(submitTimeout)
		for ph.byJob(sj.ID) == nil && r.jobs[sj.ID] == nil && ph.submitting > 0 {
			settled := ph.settled
			r.mu.Unlock()
			late := false
			select {
			case <-settled:
			case <-deadline.C:
				late = true
			}
			r.mu.Lock()
			if late {
				break
			}
		}
		deadline.Stop()
		if p := ph.byJob(sj.ID); p != nil {
			r.mu.Unlock()
			return ph.prolog(p, sj, ids, progress)
		}
	}
	if j := r.jobs[sj.ID]; j != nil {
		r.mu.Unlock()
		return r.again(j, sj, ids)
	}
	if len(r.jobs) >= r.maxJobs() {
		r.mu.Unlock()
		return nil, "", refuse(wire.CodeTooMany, "the broker knows %d Slurm jobs already, the most it keeps", len(r.jobs))
	}
	j := &job{id: sj.ID, uid: sj.UID, user: name, devices: ids, state: claiming, cancel: make(chan struct{}), ready: make(chan struct{})}
	r.jobs[sj.ID] = j
	r.mu.Unlock()

	w := &lease.Waiter{Holder: lease.Holder{Kind: lease.Slurm, UID: j.uid, User: j.user, SlurmJob: j.id}, N: len(ids), Cand: ids, Exact: true, Queued: time.Now()}
	h, err := r.claim(w, ids, j.cancel, progress, fmt.Sprintf("job %d", j.id))
	if err == nil {
		if err = r.table.Allow(h); err != nil {
			r.table.Return(h)
			err = refuse(wire.CodeNoAccess, "job %d: the broker could not open %s to %s: %v", j.id, r.vendor.Format(ids), j.user, err)
		}
	}
	if err != nil {
		r.mu.Lock()
		delete(r.jobs, j.id)
		j.err = err
		close(j.ready)
		r.mu.Unlock()
		return nil, "", err
	}
	// The record first: a broker killed from here on leaves the lock
	// free (its copy dies with it) and the record, by which the next one
	// locks the devices again for the job.
	r.mu.Lock()
	j.files, j.since, j.state = h.Files(), time.Now(), told
	r.mu.Unlock()
	if err := r.save(j); err != nil {
		r.log.Printf("job %d: %v; a broker restarted before the job's extern step holds its lease will not know of it", j.id, err)
	}
	l := r.owner.Begin(h)
	r.mu.Lock()
	j.l, j.fds = l, h.FDs()
	ending := j.ending
	close(j.ready)
	r.mu.Unlock()
	if ending {
		// Its Epilog came while it claimed: the lease ends at once.
		r.end(j, "its Epilog came before its Prolog was done")
		return nil, "", refuse(wire.CodeBusy, "job %d ended before its devices were its", j.id)
	}
	return ids, fmt.Sprintf("job %d of %s holds %s", j.id, j.user, r.vendor.Format(ids)), nil
}

// again answers a second Prolog of job j: as the first, once that one is
// done.
func (r *Room) again(j *job, sj wire.SlurmJob, ids []int) ([]int, string, error) {
	<-j.ready
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case j.err != nil:
		return nil, "", j.err
	case j.uid != sj.UID || !slices.Equal(j.devices, ids):
		return nil, "", refuse(wire.CodeBadRequest, "job %d of uid %d holds %s already, not uid %d's %s", j.id, j.uid, r.vendor.Format(j.devices), sj.UID, r.vendor.Format(ids))
	}
	return ids, fmt.Sprintf("job %d of %s holds %s", j.id, j.user, r.vendor.Format(ids)), nil
}

// retryClaim is how often a claim waiting for devices held tries again
// however quiet the table is: a Freed missed costs no more than this.
const retryClaim = time.Second

// claim claims devices ids for w (what calls it named who): at once if
// they are free, else it ends what holds them and waits for them, telling
// progress why, until cancel is closed.
func (r *Room) claim(w *lease.Waiter, ids []int, cancel <-chan struct{}, progress func(string), who string) (*lease.Handover, error) {
	ended := map[*lease.Lease]bool{}
	said := ""
	for {
		freed := r.nextFreed()
		h, err := r.table.Claim(w, ids)
		var busy *lease.Busy
		if !errors.As(err, &busy) {
			if err != nil {
				return nil, refuse(wire.CodeBadRequest, "%s: %v", who, err)
			}
			return h, nil
		}
		reason := ""
		for _, l := range busy.Leases {
			what := r.leaseName(l)
			if reason == "" {
				dev, _ := firstShared(l.Devices, busy.IDs)
				reason = fmt.Sprintf("%s is still held by %s", r.vendor.Format([]int{dev}), what)
			}
			if !ended[l] {
				ended[l] = true
				r.log.Printf("%s was given %s by Slurm, still held by %s: ending that lease", who, r.vendor.Format(busy.IDs), what)
				r.endLease(l, fmt.Sprintf("Slurm gave its devices to %s", who))
			}
		}
		if reason == "" {
			reason = r.vendor.Format(busy.IDs) + " is being released"
		}
		if reason != said && progress != nil {
			said = reason
			progress(reason)
		}
		select {
		case <-freed:
		case <-time.After(retryClaim):
		case <-cancel:
			return nil, refuse(wire.CodeBusy, "%s ended while %s", who, reason)
		}
	}
}

func firstShared(a, b []int) (int, bool) {
	for _, x := range a {
		if slices.Contains(b, x) {
			return x, true
		}
	}
	return 0, false
}

// leaseName names lease l's holder in messages.
func (r *Room) leaseName(l *lease.Lease) string {
	switch {
	case l.Kind == lease.Slurm:
		return fmt.Sprintf("job %d's processes", l.SlurmJob)
	case l.SlurmJob != 0:
		return fmt.Sprintf("the lease of %s from Slurm job %d", l.User, l.SlurmJob)
	case l.User != "":
		return fmt.Sprintf("a lease of %s", l.User)
	}
	return "a lease from before the broker's start"
}

// endLease ends lease l, which holds devices Slurm gave another job: a
// Slurm job's as at its Epilog, any other as at a task's end.
func (r *Room) endLease(l *lease.Lease, why string) {
	if l.Kind == lease.Slurm {
		r.mu.Lock()
		j := r.jobs[l.SlurmJob]
		r.mu.Unlock()
		if j != nil && j.l == l {
			r.end(j, why)
			return
		}
	}
	r.owner.End(l, why)
}

// end ends job j's lease: the broker's own copy goes, if it still holds
// one, and the owner ends whatever else holds it.
func (r *Room) end(j *job, why string) {
	r.mu.Lock()
	j.ending = true
	fds := j.fds
	j.fds = nil
	l := j.l
	r.mu.Unlock()
	for _, fd := range fds {
		unix.Close(fd)
	}
	if l != nil {
		r.owner.End(l, why)
	}
}

// nextFreed returns a channel closed when the table next frees a device.
func (r *Room) nextFreed() <-chan struct{} {
	r.freedMu.Lock()
	defer r.freedMu.Unlock()
	return r.freed
}

// Freed tells the room that the table freed a device (lease.Owner):
// the Prologs waiting for devices try again.
func (r *Room) Freed() {
	r.freedMu.Lock()
	close(r.freed)
	r.freed = make(chan struct{})
	r.freedMu.Unlock()
}

// Grant is what a Slurm job's extern step or task is given: the
// devices, and locked descriptors of their lock files in that order,
// which are the caller's to send, then to close.
type Grant struct {
	Devices []int
	FDs     []int
	// Done, called once the grant is sent (sent) or not, records it.
	Done func(sent bool)
}

// Hold serves the extern step's slurm-hold for job id from process
// caller (SO_PEERCRED): the lease's descriptors, for the step's life.
// Once they are sent the broker holds no copy. A job the room holds no
// lease for (no devices of npurun's, a placeholder, unknown) gets nil.
func (r *Room) Hold(id uint32, caller int) (*Grant, error) {
	start := r.startOf(caller)
	r.mu.Lock()
	j := r.jobs[id]
	if j == nil || j.l == nil || j.ending {
		r.mu.Unlock()
		return nil, nil
	}
	devices, l := slices.Clone(j.devices), j.l
	fds, err := dupAll(j.fds)
	if err != nil {
		r.mu.Unlock()
		return nil, fmt.Errorf("job %d: copy its lease: %w", id, err)
	}
	fromBroker := fds != nil
	r.mu.Unlock()
	if !fromBroker {
		// Held already: a second extern step (a broker restarted, the
		// step run again) takes copies from the holders.
		if fds, err = r.copies(j); err != nil || fds == nil {
			return nil, err
		}
	}
	return &Grant{Devices: devices, FDs: fds, Done: func(sent bool) {
		closeAll(fds)
		if !sent {
			return
		}
		r.mu.Lock()
		mine := j.fds
		if fromBroker {
			j.fds = nil
		}
		j.state, j.extern = held, Proc{caller, start}
		r.mu.Unlock()
		closeAll(mine) // the job holds its lease alone now
		r.owner.Extern(l, caller, start)
		if err := r.save(j); err != nil {
			r.log.Printf("job %d: %v", id, err)
		}
	}}, nil
}

// Task serves a task's slurm-task for job id from process caller (the
// task, root still): copies of the lease's descriptors. A job the room
// holds no lease for gets nil.
func (r *Room) Task(id uint32, caller int) (*Grant, error) {
	r.mu.Lock()
	j := r.jobs[id]
	if j == nil || j.l == nil || j.ending {
		r.mu.Unlock()
		return nil, nil
	}
	devices := slices.Clone(j.devices)
	fds, err := dupAll(j.fds)
	r.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("job %d: copy its lease: %w", id, err)
	}
	if fds == nil {
		if fds, err = r.copies(j); err != nil || fds == nil {
			return nil, err
		}
	}
	return &Grant{Devices: devices, FDs: fds, Done: func(sent bool) {
		closeAll(fds)
		if !sent {
			return
		}
		// The task is a holder to take copies from later: a hint only,
		// checked as any holder is.
		p := Proc{caller, r.startOf(caller)}
		r.mu.Lock()
		j.tasks = slices.Insert(j.tasks, 0, p)
		if len(j.tasks) > maxTaskHints {
			j.tasks = j.tasks[:maxTaskHints]
		}
		r.mu.Unlock()
	}}, nil
}

// Epilog serves a job's Epilog: its lease ends. Idempotent: a job with
// no lease is told so.
func (r *Room) Epilog(sj wire.SlurmJob) string {
	r.mu.Lock()
	if ph := r.ph; ph != nil {
		if p := ph.byJob(sj.ID); p != nil {
			r.mu.Unlock()
			return ph.epilog(p)
		}
	}
	j := r.jobs[sj.ID]
	if j == nil {
		r.mu.Unlock()
		return fmt.Sprintf("no lease of job %d", sj.ID)
	}
	if j.state == claiming {
		if !j.ending {
			j.ending = true
			close(j.cancel)
		}
		r.mu.Unlock()
		return fmt.Sprintf("job %d ended before its devices were free", sj.ID)
	}
	if j.state == told && !j.ending && j.extern.PID == 0 && !r.noExtern {
		r.noExtern = true
		r.log.Printf("job %d had no extern step that held its lease (slurm.conf PrologFlags=Contain missing?): the broker held it from the Prolog to the Epilog", j.id)
	}
	devices := j.devices
	r.mu.Unlock()
	r.end(j, fmt.Sprintf("job %d ended", sj.ID))
	return fmt.Sprintf("job %d's lease of %s ends", sj.ID, r.vendor.Format(devices))
}

// Released tells the room that device id of lease l was released
// (lease.Owner); last tells that l holds no other device. Called holding
// no lock.
func (r *Room) Released(l *lease.Lease, id int, last bool) {
	if !last {
		return
	}
	if l.Kind != lease.Slurm {
		if r.ph != nil && l.SlurmJob != 0 {
			r.ph.released(l)
		}
		return
	}
	r.mu.Lock()
	j := r.jobs[l.SlurmJob]
	if j == nil || j.l != l {
		r.mu.Unlock()
		return
	}
	delete(r.jobs, j.id)
	fds := j.fds
	j.fds = nil
	r.mu.Unlock()
	closeAll(fds)
	r.rec.mu.Lock()
	err := r.rec.remove(j.id)
	r.rec.mu.Unlock()
	if err != nil {
		r.log.Printf("job %d: %v", j.id, err)
	}
}

// save writes job j's record, if the room still knows j (a record
// written after the lease's end would outlive it).
func (r *Room) save(j *job) error {
	r.rec.mu.Lock()
	defer r.rec.mu.Unlock()
	r.mu.Lock()
	if r.jobs[j.id] != j {
		r.mu.Unlock()
		return nil
	}
	rec := j.record()
	r.mu.Unlock()
	return r.rec.write(rec)
}

// dupAll duplicates fds (close-on-exec); nil for none.
func dupAll(fds []int) ([]int, error) {
	if len(fds) == 0 {
		return nil, nil
	}
	out := make([]int, 0, len(fds))
	for _, fd := range fds {
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			closeAll(out)
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}
