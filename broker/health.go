package broker

import (
	"context"
	"strconv"
	"time"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
)

// HealthBy is who a drain for a device's ill health is by, in status.
const HealthBy = "health check"

// maxHealthWait bounds one round of the vendor's tool: a sick driver can
// hang npu-smi, and the next round must not queue behind it.
const maxHealthWait = 30 * time.Second

// watchHealth asks the vendor's tool about every device each
// [devices] health_interval, at once first, until ctx is done, and
// drains a device that says it is unhealthy, with the tool's words as
// the reason (checkHealth). It never undrains: a device comes back when
// an administrator undrains it. It runs on a goroutine of its own, the
// tool outside every lock. A reload (healthWake) may change the interval,
// start the checks (at once) or stop them.
func (s *Server) watchHealth(ctx context.Context) {
	said := map[int]string{} // what was last logged of each device, to log a change once
	next := time.Now()       // at once first
	for {
		every := s.policy().HealthInterval
		var tick <-chan time.Time
		var t *time.Timer
		if every > 0 {
			t = time.NewTimer(time.Until(next))
			tick = t.C
		}
		select {
		case <-ctx.Done():
			if t != nil {
				t.Stop()
			}
			return
		case <-s.healthWake:
			if t != nil {
				t.Stop()
			}
			continue
		case <-tick:
		}
		s.checkHealth(ctx, said)
		next = time.Now().Add(every)
	}
}

// checkHealth is one round of watchHealth. A device the tool could not
// answer for is logged, not drained (a missing or hung tool must not
// take every device out); a Slurm-managed device that is unhealthy is
// logged for Slurm's administrator, as drainOp refuses it; a device
// drained already keeps its drain (an administrator's reason is not
// overwritten), and one the health check drained stays drained when it
// says it is well again. Each device's finding is logged when it changes.
func (s *Server) checkHealth(ctx context.Context, said map[int]string) {
	cfg := s.policy()
	wait := min(max(cfg.HealthInterval, policy.MinHealthInterval), maxHealthWait)
	cctx, cancel := context.WithTimeout(ctx, wait)
	got, errs := s.inv.CheckHealth(cctx, s.inv.IDs, npu.Tools{NVIDIASmi: cfg.NVIDIASmi, FakeFile: cfg.FakeHealth})
	cancel()
	if ctx.Err() != nil {
		return
	}
	drained := s.table.Drains()
	anyDrained := false
	for _, id := range s.inv.IDs {
		name := s.inv.Vendor.Noun() + strconv.Itoa(id)
		var line string
		logged := false
		h, answered := got[id]
		switch {
		case !answered:
			line = "health of " + name + ": no answer: " + errs[id].Error()
		case h.Unhealthy && cfg.Slurm.Active() && cfg.Slurm.Manages(id):
			line = name + " is unhealthy (" + h.Words + "): it is Slurm's, drain it in Slurm"
		case h.Unhealthy:
			if _, already := drained[id]; already {
				line = name + " is unhealthy (" + h.Words + "), and drained"
				break
			}
			if _, err := s.table.Drain(id, lease.Drain{By: HealthBy, Reason: h.Words, Since: time.Now()}); err != nil {
				line = "drain unhealthy " + name + ": " + err.Error()
				break
			}
			s.log.Printf("%s drained by the %s: %s", name, HealthBy, h.Words)
			anyDrained, logged = true, true
			line = name + " is unhealthy (" + h.Words + "), and drained"
		case h.Words != "":
			line = name + " reports " + h.Words + ": not drained"
		case drained[id].By == HealthBy:
			line = name + " is healthy again: it stays drained until npubroker undrain " + name
		}
		if line != said[id] {
			if line != "" && !logged {
				s.log.Print(line)
			}
			said[id] = line
		}
	}
	if anyDrained {
		s.drainChanged()
	}
}

// drainChanged tells those who watch of a drain or an undrain: the
// board's watchers, and the line's waiters, whose reasons change.
func (s *Server) drainChanged() {
	s.status.Changed()
	s.mu.Lock()
	s.progressLocked()
	s.mu.Unlock()
}
