package wire

// A Slurm node: Slurm's jobs hold leases too, on the same socket and
// framing. Every one of these requests comes from root (SO_PEERCRED uid
// 0): Slurm's Prolog and Epilog run as root in slurmd, and the SPANK
// plugin asks from slurmstepd while it is still root; anyone else is
// answered "denied". Slurm gives a job's devices as gres.conf positions
// (SLURM_JOB_GPUS=0,1); the broker maps them to physical ids through
// [slurm] gres_devices.
//
//	npurun-slurm prolog (slurmd's Prolog, root)            npubroker
//	  │ ── {"op":"slurm-prolog","job":{"id":42,"uid":1001, │ maps the positions; locks the devices for
//	  │     "user":"alice","gres":"0,1"}} ───────────────▶ │ job 42 (a restricted user's ACL entries
//	  │                                                    │ first), records the job durably
//	  │ ◀── {"type":"ok","devices":[4,5],"message":…} ──── │ or an error: the Prolog logs it, exits 0
//	  │
//	spank_npurun.so in the job's extern step (slurm_spank_init, root)
//	  │ ── {"op":"slurm-hold","job":{"id":42,"uid":1001}} ▶│ the lease's descriptors, for the step's
//	  │ ◀── {"type":"grant","devices":[4,5],…} ─────────── │ life (+ SCM_RIGHTS); the broker closes
//	  │                                                    │ its own copy: the job holds the lease
//	  │ ◀── {"type":"ignore"} ──────────────────────────── │ no lease for job 42: nothing to hold
//	  │
//	spank_npurun.so in each task, before it drops privileges (root)
//	  │ ── {"op":"slurm-task","job":{"id":42,"uid":1001,   │ copies of the lease's descriptors
//	  │     "step":0}} ──────────────────────────────────▶ │
//	  │ ◀── {"type":"grant","devices":[4,5],"vendor":…,    │ + SCM_RIGHTS; the plugin places them at
//	  │      "env":[…]} ───────────────────────────────── │ 20 and above, sets env and NPURUN_LEASE
//	  │ ◀── {"type":"ignore"} ──────────────────────────── │ no lease: the task runs as Slurm made it
//	  │
//	npurun-slurm epilog (slurmd's Epilog, root)
//	  │ ── {"op":"slurm-epilog","job":{"id":42,"uid":1001, │ idempotent: the lease ends (what still
//	  │     "gres":"0,1"}} ──────────────────────────────▶ │ holds it is ended), entries removed
//	  │ ◀── {"type":"ok","message":…} ──────────────────── │
//
// A task's request comes from root in the task's own process, which
// slurmstepd forked and has not yet given to the user, and names the job
// slurmstepd runs it for (spank_get_item): the user can forge neither.
// Nothing a user sends can ask for a job's descriptors.

// Slurm operations: from root only.
const (
	OpSlurmProlog = "slurm-prolog"
	OpSlurmEpilog = "slurm-epilog"
	OpSlurmHold   = "slurm-hold"
	OpSlurmTask   = "slurm-task"
)

// Error codes of the Slurm operations.
const (
	// CodeNoSlurm: the broker has no [slurm] table, or the job's devices
	// are not Slurm's by it.
	CodeNoSlurm = "no-slurm"
)

// Slurm step ids that are not numbers of srun steps (slurm.h).
const (
	SlurmBatchStep  = 0xfffffffb // SLURM_BATCH_SCRIPT: the batch script
	SlurmExternStep = 0xfffffffc // SLURM_EXTERN_CONT: the job's extern step
)

// KindSlurm is the kind of a Slurm job's lease; DeviceSlurm the state
// of a device held by one. A placeholder allocation's lease keeps the
// kind of its request (inline, task, login) and names its job.
const (
	KindSlurm   = "slurm"
	DeviceSlurm = "slurm"
)

// SlurmJob is a Slurm job as its Prolog, Epilog and the SPANK plugin name
// it, from what slurmd and slurmstepd give them.
type SlurmJob struct {
	ID   uint32 `json:"id"`             // SLURM_JOB_ID
	UID  uint32 `json:"uid"`            // SLURM_JOB_UID
	User string `json:"user,omitempty"` // SLURM_JOB_USER (prolog), checked against uid by the broker
	GRES string `json:"gres,omitempty"` // SLURM_JOB_GPUS as Slurm wrote it: gres.conf positions (prolog, epilog)
	Step uint32 `json:"step,omitempty"` // the step of a task (slurm-task)
}

// IsSlurmOp tells whether op is one of the Slurm operations.
func IsSlurmOp(op string) bool {
	switch op {
	case OpSlurmProlog, OpSlurmEpilog, OpSlurmHold, OpSlurmTask:
		return true
	}
	return false
}
