package journal

import (
	"encoding/json"

	"github.com/npurun/npurun/wire"
)

// The journal's records are types of their own, not the wire's: a change to
// the protocol (a field renamed, a tag changed) must not silently change
// what is on disk, which a broker of another version reads back. A task
// keeps its submission and status as the wire's types in memory; it goes to
// and comes from disk as diskTask, whose submission and status are
// diskSubmission and diskStatus. These have the wire types' fields (the
// conversions between them are Go conversions, so a field added to or
// removed from either fails to compile until both agree) but their own JSON
// names, which are the format (record_test.go writes it down).

// diskSubmission is a task's submission as the journal holds it
// (wire.Submission).
type diskSubmission struct {
	Argv       []string `json:"argv,omitempty"`
	Shell      string   `json:"shell,omitempty"`
	Cwd        string   `json:"cwd"`
	Env        []string `json:"env"`
	N          int      `json:"n,omitempty"`
	Devices    []int    `json:"devices,omitempty"`
	Pool       string   `json:"pool,omitempty"`
	Mem        int64    `json:"mem,omitempty"`
	OOMRetries int      `json:"oom_retries,omitempty"`
	RetryOf    uint64   `json:"retry_of,omitempty"`
	NoDevice   bool     `json:"no_device,omitempty"`
	TimeSec    int64    `json:"time_sec,omitempty"`
	Name       string   `json:"name,omitempty"`
	After      []uint64 `json:"after,omitempty"`
	Log        string   `json:"log,omitempty"`
	Umask      *uint32  `json:"umask,omitempty"`
	Token      string   `json:"token,omitempty"`
	Notify     string   `json:"notify,omitempty"`
	NoNotify   bool     `json:"no_notify,omitempty"`
}

// diskStatus is how a task ended as the journal holds it (wire.Status).
type diskStatus struct {
	Exit       *int   `json:"exit,omitempty"`
	Signal     string `json:"signal,omitempty"`
	Reason     string `json:"reason,omitempty"`
	CPUMs      int64  `json:"cpu_ms,omitempty"`
	MemPeak    int64  `json:"mem_peak,omitempty"`
	DevicePeak int64  `json:"device_peak,omitempty"`
	OOM        bool   `json:"oom,omitempty"`
}

// statusOnDisk is st as the journal holds it (the same status, not a copy).
func statusOnDisk(st *wire.Status) *diskStatus { return (*diskStatus)(st) }

// wire is the status as the wire and the rest of the broker use it.
func (st *diskStatus) wire() *wire.Status { return (*wire.Status)(st) }

// diskTask is a task's record in the journal: Task's exported fields.
type diskTask struct {
	ID        uint64         `json:"id"`
	UID       uint32         `json:"uid"`
	User      string         `json:"user"`
	Sub       diskSubmission `json:"sub"`
	Argv      []string       `json:"argv"`
	Log       string         `json:"log"`
	TimeSec   int64          `json:"time_sec"`
	State     string         `json:"state"`
	Submitted int64          `json:"submitted"`
	Started   int64          `json:"started,omitempty"`
	Ended     int64          `json:"ended,omitempty"`
	Devices   []int          `json:"devices,omitempty"`
	Slot      int            `json:"slot"`
	PID       int            `json:"pid,omitempty"`
	PIDStart  uint64         `json:"pid_start,omitempty"`
	Boot      string         `json:"boot,omitempty"`
	ArmBoot   string         `json:"arm_boot,omitempty"`
	StartMono int64          `json:"start_mono,omitempty"`
	Status    *diskStatus    `json:"status,omitempty"`
	Reason    string         `json:"reason,omitempty"`
	Held      bool           `json:"held,omitempty"`
	From      uint64         `json:"from,omitempty"`
	Notify    string         `json:"notify,omitempty"`
}

// toDisk is t's record.
func (t *Task) toDisk() diskTask {
	return diskTask{
		ID: t.ID, UID: t.UID, User: t.User, Sub: diskSubmission(t.Sub), Argv: t.Argv, Log: t.Log, TimeSec: t.TimeSec,
		State: t.State, Submitted: t.Submitted, Started: t.Started, Ended: t.Ended, Devices: t.Devices, Slot: t.Slot,
		PID: t.PID, PIDStart: t.PIDStart, Boot: t.Boot, ArmBoot: t.ArmBoot, StartMono: t.StartMono,
		Status: statusOnDisk(t.Status), Reason: t.Reason, Held: t.Held, From: t.From, Notify: t.Notify,
	}
}

// fromDisk sets t's exported fields from its record d.
func (t *Task) fromDisk(d diskTask) {
	t.ID, t.UID, t.User, t.Sub, t.Argv, t.Log, t.TimeSec = d.ID, d.UID, d.User, wire.Submission(d.Sub), d.Argv, d.Log, d.TimeSec
	t.State, t.Submitted, t.Started, t.Ended, t.Devices, t.Slot = d.State, d.Submitted, d.Started, d.Ended, d.Devices, d.Slot
	t.PID, t.PIDStart, t.Boot, t.ArmBoot, t.StartMono = d.PID, d.PIDStart, d.Boot, d.ArmBoot, d.StartMono
	t.Status, t.Reason, t.Held, t.From, t.Notify = d.Status.wire(), d.Reason, d.Held, d.From, d.Notify
}

// MarshalJSON writes t as its journal record (diskTask).
func (t *Task) MarshalJSON() ([]byte, error) { return json.Marshal(t.toDisk()) }

// UnmarshalJSON reads t from its journal record (diskTask); fields the
// record leaves out keep what t had, as they would without it.
func (t *Task) UnmarshalJSON(b []byte) error {
	d := t.toDisk()
	if err := json.Unmarshal(b, &d); err != nil {
		return err
	}
	t.fromDisk(d)
	return nil
}
