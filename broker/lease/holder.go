package lease

import (
	"strconv"
	"time"

	"github.com/npurun/npurun/internal/fileid"
	"github.com/npurun/npurun/wire"
)

// Kind is what holds a lease. Its values are the wire protocol's
// (wire.KindInline, …), so that the broker passes them through as they
// are; a later kind (a Slurm job, a container) adds a value here and a
// Holder field for what names it, not a new path through the table.
type Kind string

// The holders of today.
const (
	Inline Kind = "inline" // an npurun the broker grants on its connection
	Task   Kind = "task"   // a queued task, run by the broker under a supervisor
	Login  Kind = "login"  // a login session's lease (pam_npurun, npurun --login)
	Found  Kind = ""       // found held at the broker's start, with no record of its grant

	// Slurm is a Slurm job's lease: Slurm picked its devices, its Prolog
	// named them (Claim), and the job's processes hold it. It does not
	// count against its user's max_devices: Slurm's limits are its own.
	Slurm Kind = "slurm"

	// Container is a container's lease: granted to npurun-runtime on the
	// container's behalf (Holder.Container names it), held by the
	// container's processes. It counts as any lease. (A lease granted to
	// npurun and handed into a container keeps the kind it was granted
	// with here; the status ledger re-kinds it when the runtime names it.)
	Container Kind = "container"
)

// Holder is who asks for a lease, and who it is granted to. The table
// looks at Kind and UID only (a task's caps, a user's devices); the rest is
// the record a grant keeps for status and accounting.
type Holder struct {
	Kind Kind
	UID  uint32
	User string // account name, for messages and listings

	// PID is the process the lease is granted to: the client's, from
	// SO_PEERCRED (inline, login); 0 for a task, whose supervisor comes
	// later, and for a lease found at start. PIDStart is its start time
	// where a record of an earlier broker gave it.
	PID      int
	PIDStart uint64
	Task     uint64 // Kind Task: the task's id

	// Where a session, or a request on behalf of another user, came from:
	// the PAM service, terminal and remote host. Claimed tells that they
	// are the user's own claim, not root's (the PAM module's).
	Service, TTY, RHost string
	Claimed             bool

	// SlurmJob is the Slurm job: Kind Slurm's own, or, for a request of
	// a pool Slurm allocates (Pool.External), the placeholder allocation
	// its devices come from; 0 for none.
	SlurmJob uint32

	// Container is the container a lease of kind Container is for (a
	// label that the runtime gave; the user is who asked); nil otherwise.
	Container *wire.ContainerRef

	// Limit is the longest its lease may last, from its grant: a task's
	// time limit and the grace of its kill; 0 where none is known (an
	// npurun, a login, a Slurm job, a lease taken up at start). The
	// line's estimated starts (Place.Start) are reckoned from it.
	Limit time.Duration
}

// Lease is the record of one grant: who holds it, which devices, on which
// lock files, since when. It is never changed once the table hands it
// out, so any room may keep and read it without the table's lock; which
// of its devices are still held is the table's to say (Snapshot, and the
// owner's Released).
type Lease struct {
	Holder
	ID      uint64
	Pool    string
	Devices []int
	Files   []fileid.ID // the lock files, in the order of Devices
	Since   time.Time
	Adopted bool // held since before this broker's start
	// Mem is what a share declared of each of its devices, in MiB; 0
	// for a whole lease (share.go).
	Mem int64
	// Share is what a share weighs in accounting: Mem over what its
	// device's shares may declare together (Device.Capacity), at most 1,
	// of the first of Devices; 0 for a whole lease, which weighs 1.
	Share float64
	// Backfill: the lease was backfilled ahead of a request that had
	// reserved some of its devices, and ends before its start; nil
	// otherwise.
	Backfill *Backfilled
}

// Backfilled is what a backfilled lease (Room.Backfill) went ahead of.
type Backfilled struct {
	EndsBy   time.Time // its limit ends it by then
	Before   Holder    // the request whose reservation it took that starts first
	BeforeAt time.Time // that request's estimated start at the grant
	Beside   bool      // it took devices that request will not need by then (it may end later)
}

// Of names the request a backfilled lease went ahead of: "task 118", or
// "alice's request (pid 4242)".
func (b *Backfilled) Of() string {
	switch {
	case b.Before.Kind == Task:
		return "task " + strconv.FormatUint(b.Before.Task, 10)
	case b.Before.PID > 0:
		return b.Before.User + "'s request (pid " + strconv.Itoa(b.Before.PID) + ")"
	}
	return b.Before.User + "'s request"
}

// FileOf returns the lock file of device id in l.
func (l *Lease) FileOf(id int) (fileid.ID, bool) {
	for i, d := range l.Devices {
		if d == id && i < len(l.Files) {
			return l.Files[i], true
		}
	}
	return fileid.ID{}, false
}
