package wire

import "fmt"

// Who holds what, and who used how much: on the same socket and framing.
//
//	npubroker status                                npubroker
//	  │ ── {"op":"status"} ──────────────────────────▶ │ identity: SO_PEERCRED; any user may ask
//	  │ ◀── {"type":"status","board":{…}} ───────────── │ from what it knows (grants, holders checked
//	  │                                                 │ in /proc) and its last background scan:
//	  │                                                 │ never waits for a full /proc scan
//	  │ ── {"op":"status","watch":true} ─────────────▶ │
//	  │ ◀── {"type":"status","board":{…}} ───────────── │ at once, then after each change (a lease,
//	  │ ◀── {"type":"status","board":{…}} ───────────── │ the line, holders, unleased use), at most
//	  │      … until the client closes the connection  │ every 100 ms; any request ends the watch
//	  │                                                 │
//	  │ ── {"op":"usage","usage":{"since_ms":…}} ────▶ │ reads the accounting log
//	  │ ◀── {"type":"usage","usage":{…},"more":true} ── │ rows in as many replies as they take
//	  │ ◀── {"type":"usage","usage":{…}} ────────────── │ the last one without "more"
//
// Field names of Board and UsageReport are stable: scripts and dashboards
// read them (npubroker status --json prints the Board as it came).

// Status and usage operations.
const (
	OpStatus = "status"
	OpUsage  = "usage"
)

// Status and usage reply types.
const (
	TypeStatus = "status"
	TypeUsage  = "usage"
)

// Kinds of lease (and KindSlurm, a Slurm job's, in slurm.go).
const (
	KindInline = "inline" // npurun CMD
	KindTask   = "task"   // a task-submit task
	KindLogin  = "login"  // a login session's lease (pam_npurun)
	KindHeld   = ""       // found held at the broker's start, with no record of its grant
	// KindContainer (container.go): held by a container's processes
)

// States of a device on the board.
const (
	DeviceFree     = "free"
	DeviceLeased   = "leased"         // an npurun lease
	DeviceTask     = "task"           // a task's lease
	DeviceLogin    = "login"          // a login session's lease
	DeviceHeld     = "held"           // held since before the broker's start, grant unknown
	DeviceReserved = "reserved"       // free, but kept for the first request in line
	DeviceOut      = "out-of-service" // no fresh lock file could be made
)

// UsageQuery is what npubroker usage asks for.
type UsageQuery struct {
	SinceMS int64  `json:"since_ms"`       // Unix milliseconds: count from then to now
	User    string `json:"user,omitempty"` // one user's rows only; "" for everyone's
	By      string `json:"by,omitempty"`   // the rows: UsageByUser ("" too) or UsageByDevice
}

// What npubroker usage sums by (UsageQuery.By, UsageReport.By).
const (
	UsageByUser   = "user"   // a row per user, kind of lease and pool
	UsageByDevice = "device" // a row per device and pool
)

// Board is the broker's answer to status: every device, the lines of
// waiters and the processes using a device without a lease.
type Board struct {
	Time      int64         `json:"time"` // the broker's clock, Unix milliseconds
	Vendor    string        `json:"vendor"`
	Devices   []DeviceState `json:"devices"`
	Waiting   []Line        `json:"waiting"`  // one per pool, in the configuration's order
	Unleased  []Unleased    `json:"unleased"` // reported unleased use, past its grace window
	Scan      ScanInfo      `json:"scan"`
	Util      *UtilInfo     `json:"util,omitempty"`      // the utilization sampling; nil where the broker does not sample (no interval, no tool), and before its first sample
	Truncated bool          `json:"truncated,omitempty"` // lists were cut to fit one message
}

// UtilInfo says how the broker samples the devices' utilization ([status]
// util_interval) and when a lease is idle ([idle] below).
type UtilInfo struct {
	IntervalMS int64   `json:"interval_ms"`
	Below      float64 `json:"below"` // percent: a lease whose devices are all under it is idle
	Last       int64   `json:"last"`  // Unix ms of the last sample
}

// DeviceState is one device on the board.
type DeviceState struct {
	ID          int         `json:"id"`   // physical id
	Name        string      `json:"name"` // "npu3", "gpu3"
	Pool        string      `json:"pool"` // "" for a device in no pool
	State       string      `json:"state"`
	Since       int64       `json:"since,omitempty"` // Unix ms: the lease's start, or the reservation's
	Lease       *LeaseInfo  `json:"lease,omitempty"`
	ReservedFor *WaiterInfo `json:"reserved_for,omitempty"`
	Drain       *DrainInfo  `json:"drain,omitempty"` // drained (drain.go): State is DeviceDrained, or a lease's that runs on

	// The last sample of its utilization (Board.Util): compute in percent,
	// memory in use and in all in MiB (0: the tool does not say). Util is
	// nil where it is unknown: UtilUnknown says why (the tool failed, hung
	// or printed what does not parse).
	Util        *float64 `json:"util,omitempty"`
	MemUsed     int64    `json:"mem_used,omitempty"`
	MemTotal    int64    `json:"mem_total,omitempty"`
	UtilUnknown string   `json:"util_unknown,omitempty"`

	// A device that holds shares (npurun --mem): State is DeviceShared
	// while it holds any, Shares are their leases in grant order, and
	// Capacity (what shares may declare together: its memory less the
	// margin), Declared and External (what processes outside any lease
	// use) are in MiB; Capacity is 0 for a device not shared.
	// CapacityUnknown says why, for a device the configuration shares
	// whose memory the vendor's tool could not say yet (Capacity 0): it
	// takes no new share until the broker, asking again, knows it.
	Shares          []LeaseInfo `json:"shares,omitempty"`
	Capacity        int64       `json:"capacity,omitempty"`
	Declared        int64       `json:"declared,omitempty"`
	External        int64       `json:"external,omitempty"`
	CapacityUnknown string      `json:"capacity_unknown,omitempty"`
}

// DeviceShared is the state of a device that holds shares.
const DeviceShared = "shared"

// LeaseInfo is a lease as the broker recorded its grant, joined with the
// processes /proc shows holding it. Where the two disagree, Holders is
// the truth.
type LeaseInfo struct {
	ID          uint64        `json:"id"`
	Kind        string        `json:"kind"` // KindInline, KindTask, KindLogin, or "" (KindHeld)
	User        string        `json:"user"` // granted to
	UID         uint32        `json:"uid"`
	PID         int           `json:"pid,omitempty"`  // the process it was granted to (a task's supervisor)
	Task        uint64        `json:"task,omitempty"` // a task lease's task
	Service     string        `json:"service,omitempty"`
	TTY         string        `json:"tty,omitempty"`
	RHost       string        `json:"rhost,omitempty"`
	Claimed     bool          `json:"claimed,omitempty"` // service, tty and rhost are the user's own claim (a session request not made by root), not the PAM module's
	Devices     []int         `json:"devices"`
	Since       int64         `json:"since"`               // Unix ms
	Adopted     bool          `json:"adopted,omitempty"`   // held since before the broker's start
	Container   *ContainerRef `json:"container,omitempty"` // KindContainer: the container holding it
	Holders     []Holder      `json:"holders"`             // root holders first, then their descendants
	MoreHolders int           `json:"more_holders,omitempty"`
	Checked     int64         `json:"checked,omitempty"` // Unix ms of the last look in /proc

	// The Slurm job holding it (KindSlurm), or the placeholder allocation
	// its devices came from ([slurm] mode "allocate").
	SlurmJob uint32 `json:"slurm_job,omitempty"`

	// A share's: the memory it declared of each device, in MiB (0: a
	// whole lease); what its processes use now and used at most, as the
	// vendor's tool shows them (MiB); Over: it was seen over its
	// declaration.
	Mem int64 `json:"mem,omitempty"`
	// Backfill: it was backfilled ([scheduling] backfill) ahead of a
	// request that had reserved some of its devices; nil otherwise.
	Backfill *Backfill `json:"backfill,omitempty"`
	Used     int64     `json:"used,omitempty"`
	Peak     int64     `json:"peak,omitempty"`
	Over     bool      `json:"over,omitempty"`

	// Its devices' utilization (Board.Util), in percent: now, the mean of
	// its devices at the last sample (nil: any of them unknown); held, the
	// mean of the samples known since its start (since the broker's
	// start, for one held from before: figures are not kept across a
	// restart); IdleSince, Unix ms of the first of the samples, up to the
	// last, that found all its devices under [idle] below (0: not idle).
	// A share has its device's figures: the hardware does not split
	// compute by process.
	Util      *float64 `json:"util,omitempty"`
	UtilHeld  *float64 `json:"util_held,omitempty"`
	IdleSince int64    `json:"idle_since,omitempty"`
	// What the [idle] policy says of it while it is idle: the action
	// that applies ("report", "warn", "reclaim"; "": none), whether its
	// holders were warned, for "reclaim" when it is ended unless it is
	// used (IdleEnds, Unix ms) and, once it is, when (Reclaimed, Unix
	// ms: the lease is ending).
	IdleAction string `json:"idle_action,omitempty"`
	Warned     bool   `json:"idle_warned,omitempty"`
	IdleEnds   int64  `json:"idle_ends,omitempty"`
	Reclaimed  int64  `json:"reclaimed,omitempty"`
}

// Holder is a process that holds a lease's lock descriptor.
type Holder struct {
	PID     int    `json:"pid"`
	PPID    int    `json:"ppid"`
	User    string `json:"user"`
	UID     uint32 `json:"uid"`
	Command string `json:"command,omitempty"` // left out where the policy hides others' commands
	Started int64  `json:"started"`           // Unix ms

	Container *ContainerRef `json:"container,omitempty"` // the container the process is in, from its cgroup
}

// Line is one pool's waiters.
type Line struct {
	Pool    string       `json:"pool"`
	Count   int          `json:"count"`
	Waiters []WaiterInfo `json:"waiters"` // the first ones, in order
}

// WaiterInfo is one waiting request.
type WaiterInfo struct {
	Position int    `json:"position"` // 1 is next
	Kind     string `json:"kind"`     // KindInline, KindTask, KindLogin
	Task     uint64 `json:"task,omitempty"`
	User     string `json:"user"`
	N        int    `json:"n"`                 // devices wanted
	Mem      int64  `json:"mem,omitempty"`     // a share of each (--mem), in MiB; 0: whole devices
	Devices  []int  `json:"devices,omitempty"` // exactly these (npurun -d)
	Since    int64  `json:"since"`             // Unix ms
	Why      string `json:"why,omitempty"`     // why it waits beyond its turn: its user is at max_devices; a placeholder's Slurm state and reason
	Start    int64  `json:"start,omitempty"`   // when it starts at the latest (Unix ms), by the time limits of what holds and waits ahead; absent: unknown (and for the cpu line)

	// The placeholder Slurm allocation it waits in ([slurm] mode "allocate").
	SlurmJob uint32 `json:"slurm_job,omitempty"`
}

// Unleased is a process that uses a device node (open, or mapped) and
// holds no lease on that device, itself or through an ancestor; or uses a
// control node (davinci_manager, nvidiactl, …) and holds no lease at all.
type Unleased struct {
	Device     int    `json:"device"` // -1 for a control node
	Name       string `json:"name"`   // "npu7"; "" for a control node
	Node       string `json:"node"`   // "/dev/davinci7", as the broker knows it (the process may have reached it by another path)
	Control    bool   `json:"control,omitempty"`
	Mapped     bool   `json:"mapped,omitempty"` // mapped, with no descriptor of it open
	PID        int    `json:"pid"`
	User       string `json:"user"`
	UID        uint32 `json:"uid"`
	Command    string `json:"command,omitempty"`
	Since      int64  `json:"since"` // Unix ms: when its user's use of the node began (through gaps shorter than the grace window)
	Restricted bool   `json:"restricted"`
	Action     string `json:"action"` // "report", or the signal sent: "term", "kill"

	Container *ContainerRef `json:"container,omitempty"` // the container the process is in, from its cgroup
}

// ScanInfo tells how fresh the background scan is.
type ScanInfo struct {
	Last       int64   `json:"last,omitempty"` // Unix ms of the last scan's start; 0 before the first
	TookMS     float64 `json:"took_ms"`
	Procs      int     `json:"procs"`
	IntervalMS int64   `json:"interval_ms"`
	GraceMS    int64   `json:"grace_ms"`
}

// UsageReport sums device time per user, kind of lease and pool.
type UsageReport struct {
	Since      int64      `json:"since"` // Unix ms
	Until      int64      `json:"until"`
	Rows       []UsageRow `json:"rows"`
	Incomplete int        `json:"incomplete,omitempty"` // leases whose end was never recorded (counted as 0)
	Dropped    int64      `json:"dropped,omitempty"`    // records the broker could not write since it started
	Oldest     int64      `json:"oldest,omitempty"`     // Unix ms of the oldest record left, where older files were rotated away
	// Sampled tells that some row has utilization figures (Busy,
	// IdleDeviceHours, Reclaimed): the broker sampled the devices.
	Sampled bool `json:"sampled,omitempty"`
	// By is what the rows are summed by: UsageByDevice where the query
	// asked for it (a broker that does not know it leaves it empty), else
	// empty (per user).
	By string `json:"by,omitempty"`
}

// UsageRow is one user's use of one pool by one kind of lease, or, summed
// by device, the use of one device (Device, its name, and Pool; no User
// or Kind). Leases that the accounting log summed past a user's rate
// name no device: by device they make a row with no Device.
type UsageRow struct {
	User          string  `json:"user,omitempty"`
	Kind          string  `json:"kind,omitempty"`
	Device        string  `json:"device,omitempty"`
	Pool          string  `json:"pool"`
	Leases        int     `json:"leases"`
	DeviceSeconds float64 `json:"device_seconds"`
	DeviceHours   float64 `json:"device_hours"`
	// Where the broker sampled utilization ([status] util_interval):
	// Busy, the device time weighted by each lease's mean utilization,
	// in percent of the device time of the leases sampled (nil: none
	// was); IdleDeviceHours, the device time between samples that both
	// found a lease idle ([idle] below); Reclaimed, the leases the [idle]
	// policy ended.
	Busy            *float64 `json:"busy,omitempty"`
	IdleDeviceHours float64  `json:"idle_device_hours,omitempty"`
	Reclaimed       int      `json:"reclaimed,omitempty"`
}

// Status returns the board.
func (c *Conn) Status() (*Board, error) {
	r, err := c.call(&Request{Op: OpStatus})
	if err != nil {
		return nil, err
	}
	if r.Type != TypeStatus || r.Board == nil {
		return nil, fmt.Errorf("unexpected reply %q to status", r.Type)
	}
	return r.Board, nil
}

// Watch asks for the board now and after every change; NextBoard reads
// them.
func (c *Conn) Watch() error { return c.Send(&Request{Op: OpStatus, Watch: true}) }

// NextBoard waits for the next board of a watch.
func (c *Conn) NextBoard() (*Board, error) {
	r, _, err := c.Recv(-1)
	if err != nil {
		return nil, err
	}
	if r.Type != TypeStatus || r.Board == nil {
		return nil, fmt.Errorf("unexpected reply %q to status", r.Type)
	}
	return r.Board, nil
}

// Usage sums device time since q.SinceMS.
func (c *Conn) Usage(q UsageQuery) (*UsageReport, error) {
	r, err := c.call(&Request{Op: OpUsage, Usage: &q})
	var all *UsageReport
	for {
		if err != nil {
			return nil, err
		}
		if r.Type != TypeUsage || r.Usage == nil {
			return nil, fmt.Errorf("unexpected reply %q to usage", r.Type)
		}
		if all == nil {
			all = r.Usage
		} else {
			all.Rows = append(all.Rows, r.Usage.Rows...)
		}
		if !r.More {
			return all, nil
		}
		r, _, err = c.Recv(-1)
	}
}
