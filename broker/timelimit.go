package broker

import (
	"fmt"
	"time"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
)

// npurun --time: a lease's time limit, with a task's meaning. The request
// says it (wire.Request.TimeSec); [tasks] max_time caps it as it caps a
// task's (policy.Tasks.TimeRefusal); its holder's Limit is it and [tasks]
// kill_grace, from which the line reckons starts and backfills; and at its
// end the lease is ended as a task's is (leaseend.Ender.End, the one path
// by which the broker ends a lease whose time is up): its processes get
// SIGTERM, then SIGKILL after kill_grace.

// timeLimit checks the time limit of request req, in seconds: the reply
// that refuses it, or nil.
func (s *Server) timeLimit(req *wire.Request) *wire.Reply {
	switch {
	case req.TimeSec < 0 || req.TimeSec > wire.MaxTimeSec:
		return errReply(wire.CodeBadRequest, fmt.Sprintf("time limit of %d seconds is out of range (at most %d, a century)", req.TimeSec, wire.MaxTimeSec), "")
	case req.TimeSec > 0 && req.Login:
		return errReply(wire.CodeBadRequest, "a login's lease takes no time limit", "")
	}
	if why := s.policy().Tasks.TimeRefusal(time.Duration(req.TimeSec) * time.Second); why != "" {
		return errReply(wire.CodeDenied, why, "ask for less with --time, or none")
	}
	return nil
}

// armTimeLimit ends lease l, granted on c with a time limit of d, once d
// has passed since its start. The timer is stopped at the lease's end
// (stopTimeLimit), an end before it was kept included.
func (s *Server) armTimeLimit(l *lease.Lease, d time.Duration) {
	timer := time.AfterFunc(time.Until(l.Since.Add(d)), func() {
		s.stopTimeLimit(l)
		held := s.table.HeldBy(l)
		if len(held) == 0 {
			return // ended meanwhile
		}
		why := fmt.Sprintf("lease %d of %s on %s: time limit %s reached", l.ID, l.User, npu.FormatIDs(l.Devices), quantity.Duration(d))
		s.log.Print(why)
		s.ender.End(held, why)
	})
	s.limitsMu.Lock()
	s.limits[l] = timer
	s.limitsMu.Unlock()
	if len(s.table.HeldBy(l)) == 0 {
		s.stopTimeLimit(l) // it ended before its timer was kept
	}
}

// stopTimeLimit stops lease l's time limit, if it has one.
func (s *Server) stopTimeLimit(l *lease.Lease) {
	s.limitsMu.Lock()
	timer := s.limits[l]
	delete(s.limits, l)
	s.limitsMu.Unlock()
	if timer != nil {
		timer.Stop()
	}
}

// timeLimits is how many leases have a time limit armed (for tests).
func (s *Server) timeLimits() int {
	s.limitsMu.Lock()
	defer s.limitsMu.Unlock()
	return len(s.limits)
}
