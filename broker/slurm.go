package broker

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/broker/refusal"
	"github.com/npurun/npurun/broker/slurmjobs"
	"github.com/npurun/npurun/broker/status"
	"github.com/npurun/npurun/internal/fileid"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/wire"
)

// A Slurm node ([slurm]): the wiring of the Slurm room (broker/slurmjobs)
// and the handlers of Slurm's operations. Every one comes from root:
// Slurm's Prolog and Epilog run as root in slurmd, the SPANK plugin asks
// from slurmstepd as root; the job's uid and user come from them.

// slurmPools are the lease table's pools on a Slurm node: in split mode
// the pool of every device ([pools] absent) is every device that is not
// Slurm's, and Slurm's devices are in no pool (granted to Slurm jobs
// only); in allocate mode a pool of Slurm's devices is Slurm's to
// allocate (lease.Pool.External).
func slurmPools(cfg *policy.Config, all []int, pools []lease.Pool) []lease.Pool {
	if !cfg.Slurm.Active() {
		return pools
	}
	for i := range pools {
		switch p := cfg.Pools[i]; {
		case cfg.Slurm.Mode == policy.ModeSplit && p.IDs == nil:
			pools[i].IDs = append([]int{}, cfg.OwnDevices(all)...)
		case cfg.Slurm.Mode == policy.ModeAllocate && cfg.SlurmPool(p, all):
			pools[i].External = "Slurm"
		}
	}
	return pools
}

// openSlurm opens the Slurm room, where the configuration has [slurm];
// wake is the lease table's (lease.Config.External).
func (s *Server) openSlurm(stateDir, lockDir string, env []string, wake chan struct{}) error {
	sc := s.policy().Slurm
	if !sc.Active() {
		return nil
	}
	room, err := slurmjobs.Open(slurmjobs.Config{Slurm: sc, Table: s.table, LockDir: lockDir, StateDir: stateDir, Vendor: s.inv.Vendor,
		Owner: (*slurmOwner)(s), Log: s.log, Env: env, KillGrace: s.policy().Tasks.KillGrace, Wake: wake})
	if err != nil {
		return fmt.Errorf("[slurm]: %w", err)
	}
	s.slurm = room
	if own := s.policy().OwnDevices(s.inv.IDs); sc.Mode == policy.ModeSplit && len(own) == 0 {
		s.log.Printf("[slurm] mode %q: every device is Slurm's: npurun serves Slurm jobs' leases only", sc.Mode)
	} else {
		s.log.Printf("[slurm] mode %q: Slurm's devices are %s", sc.Mode, s.inv.Vendor.Format(sc.Devices))
	}
	return nil
}

// slurmRefusal refuses a request that names Slurm's devices in split
// mode: they are leased to Slurm jobs only. nil where it does not.
func (s *Server) slurmRefusal(devices []int) error {
	sc := s.policy().Slurm
	if !sc.Active() || sc.Mode != policy.ModeSplit {
		return nil
	}
	for _, id := range devices {
		if sc.Manages(id) {
			return &refusal.Refusal{Err: lease.ErrNoDevice, Msg: fmt.Sprintf("%s is Slurm's ([slurm] mode %q): ask Slurm for it (srun --gres=%s:1)", s.inv.Vendor.Format([]int{id}), sc.Mode, sc.GRES)}
		}
	}
	return nil
}

// slurmOp serves a Slurm operation; false closes the connection.
func (s *Server) slurmOp(c *conn, req *wire.Request) bool {
	reply := func(r *wire.Reply, fds ...int) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		return c.sendLocked(r, fds...)
	}
	switch {
	case c.uid != 0:
		reply(errReply(wire.CodeDenied, "the Slurm operations are slurmd's and slurmstepd's (root only)", ""))
		return false
	case req.Job == nil:
		reply(errReply(wire.CodeBadRequest, req.Op+" names no job", ""))
		return false
	case s.slurm == nil:
		reply(errReply(wire.CodeNoSlurm, "this broker has no [slurm] table: it knows nothing of Slurm's devices", "add [slurm] to npurun.conf (npurun.conf(5))"))
		return true
	}
	job := *req.Job
	switch req.Op {
	case wire.OpSlurmProlog:
		s.users.lookupLease(job.UID) // the account, cached for its device access
		devices, msg, err := s.slurm.Prolog(job, func(reason string) {
			reply(&wire.Reply{Type: wire.TypeQueued, Reason: reason})
		})
		if err != nil {
			s.log.Printf("Prolog of job %d of uid %d: %v", job.ID, job.UID, err)
			reply(slurmError(err))
			return true
		}
		s.log.Print(msg)
		return reply(&wire.Reply{Type: wire.TypeOK, Devices: devices, Message: msg}) == nil
	case wire.OpSlurmHold, wire.OpSlurmTask:
		var g *slurmjobs.Grant
		var err error
		if req.Op == wire.OpSlurmHold {
			g, err = s.slurm.Hold(job.ID, int(c.pid))
		} else {
			g, err = s.slurm.Task(job.ID, int(c.pid))
		}
		if err != nil {
			s.log.Printf("%s of job %d: %v", req.Op, job.ID, err)
		}
		if g == nil {
			return reply(&wire.Reply{Type: wire.TypeIgnore}) == nil
		}
		r := &wire.Reply{Type: wire.TypeGrant, Devices: g.Devices, Vendor: string(s.inv.Vendor)}
		if req.Op == wire.OpSlurmTask {
			r.Env = spankEnv(s.inv.Env(g.Devices))
		}
		err = reply(r, g.FDs...)
		g.Done(err == nil)
		return err == nil
	case wire.OpSlurmEpilog:
		msg := s.slurm.Epilog(job)
		return reply(&wire.Reply{Type: wire.TypeOK, Message: msg}) == nil
	}
	return false
}

// slurmError is the answer to a Slurm operation the room refused.
func slurmError(err error) *wire.Reply {
	var r *slurmjobs.Refusal
	if errors.As(err, &r) {
		return errReply(r.Code, r.Msg, "")
	}
	return errReply(wire.CodeBadRequest, err.Error(), "")
}

// spankVars are the variables the SPANK plugin sets in a task, and the
// values it takes (slurm/spank/spank_npurun.c): nothing else is sent.
var (
	spankVars  = []string{"NPURUN_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"}
	spankValue = regexp.MustCompile(`^[A-Za-z0-9_,.:-]*$`)
)

// spankEnv keeps of env what the plugin takes.
func spankEnv(env []string) []string {
	out := env[:0:0]
	for _, e := range env {
		name, value, _ := strings.Cut(e, "=")
		for _, v := range spankVars {
			if name == v && spankValue.MatchString(value) {
				out = append(out, e)
			}
		}
	}
	return out
}

// slurmOwner is the broker as the Slurm room's owner.
type slurmOwner Server

// Begin commits a Slurm job's lease, or a placeholder's grant, and
// records it, as grantLocked does an npurun's.
func (o *slurmOwner) Begin(h *lease.Handover) *lease.Lease {
	s := (*Server)(o)
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.table.Commit(h)
	s.status.Started(l, h)
	return l
}

// End ends lease l, whose job has ended, as a task's lease ends with the
// task (leaseend.Ender.End): its processes, and its lock whoever holds it.
// An npurun granted l through its placeholder allocation hears it first,
// on its connection, so that it can say why its command is ended.
func (o *slurmOwner) End(l *lease.Lease, why string) {
	s := (*Server)(o)
	s.mu.Lock()
	if c := s.byPlaceholder[l.SlurmJob]; l.SlurmJob != 0 && c != nil {
		delete(s.byPlaceholder, l.SlurmJob)
		c.placeholder = 0
		if !c.closed {
			c.sendLocked(&wire.Reply{Type: wire.TypeEnded, SlurmJob: l.SlurmJob, Message: why})
		}
	}
	s.mu.Unlock()
	s.ender.End(s.table.HeldBy(l), why)
}

// Extern notes the extern step of a job's lease as its first holder:
// status looks there first.
func (o *slurmOwner) Extern(l *lease.Lease, pid int, start uint64) {
	o.status.FirstHolder(l, pid, start)
}

// Holders are the processes that hold l's lock files (Server.holdersOf).
func (o *slurmOwner) Holders(l *lease.Lease) []slurmjobs.Proc {
	return (*Server)(o).holdersOf(l)
}

// holdersOf are the processes that hold lease l's lock files: those
// status last saw, or else those a sweep of /proc finds (every process,
// whatever the background scan's budgets, whose cursors it leaves alone).
func (s *Server) holdersOf(l *lease.Lease) []slurmjobs.Proc {
	var out []slurmjobs.Proc
	for _, h := range s.status.Holders(l) {
		out = append(out, slurmjobs.Proc{PID: h.PID, Start: h.Start})
	}
	if len(out) > 0 {
		return out
	}
	targets := procscan.Targets{Files: map[fileid.ID]bool{}}
	for _, f := range l.Files {
		targets.Files[f] = true
	}
	res, err := s.scanner.Sweep(targets)
	if err != nil {
		return nil
	}
	for _, pids := range res.Files {
		for _, pid := range pids {
			if pi := res.Info[pid]; pi != nil {
				out = append(out, slurmjobs.Proc{PID: pid, Start: pi.Start})
			}
		}
	}
	return out
}

// Deliver delivers the devices Slurm picked for a placeholder to its
// request, as scheduleLocked delivers the line's grants.
func (o *slurmOwner) Deliver(h *lease.Handover) bool {
	s := (*Server)(o)
	s.mu.Lock()
	defer s.mu.Unlock()
	ok := s.deliverLocked(h)
	s.status.Changed()
	s.progressLocked()
	return ok
}

// Changed notes waiter w's placeholder job and has its progress told.
func (o *slurmOwner) Changed(w *lease.Waiter, id uint32) {
	s := (*Server)(o)
	s.mu.Lock()
	defer s.mu.Unlock()
	if id != 0 {
		w.SlurmJob = id
	}
	s.status.Changed()
	s.progressAfterLocked(0)
}

// Refuse takes waiter w, whose placeholder Slurm refused or ended, out of
// the line, and answers it; a task's, the task room fails, not started.
func (o *slurmOwner) Refuse(w *lease.Waiter, code, msg string) {
	s := (*Server)(o)
	task := s.tasks.Refuse(w, msg)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch c := connOf(w); {
	case task:
	case c != nil && c.w == w && c.login != nil:
		s.log.Printf("login of %s: %s", w.User, msg)
		s.busyLocked(c, c.login)
	case c != nil && c.w == w:
		s.table.Remove(w)
		s.unwaitLocked(c)
		c.sendLocked(errReply(code, msg, ""))
	default:
		return
	}
	s.scheduleLocked()
	s.progressLocked()
}

// TimeLimit is waiter w's time limit: a task's --time.
func (o *slurmOwner) TimeLimit(w *lease.Waiter) time.Duration {
	return (*Server)(o).tasks.TimeLimit(w)
}

// slurmOutside is the Slurm room as the task room asks it of tasks'
// requests (tasks.Outside), under the task room's lock.
type slurmOutside Server

func (o *slurmOutside) Refusal(devices []int) error { return (*Server)(o).slurmRefusal(devices) }
func (o *slurmOutside) Why(w *lease.Waiter, why string) string {
	return (*Server)(o).slurmWhy(w, why)
}

// slurmWhy is what Slurm says of waiter w's placeholder, or why, what
// the line says of w.
func (s *Server) slurmWhy(w *lease.Waiter, why string) string {
	if s.slurm != nil && w.External {
		if r := s.slurm.Why(w); r != "" {
			return r
		}
	}
	return why
}

// slurmJobs is the Slurm room as the status room asks it at start
// (status.Config.Jobs); nil without [slurm].
func (s *Server) slurmJobs() status.Jobs {
	if s.slurm == nil {
		return nil
	}
	return s.slurm
}
