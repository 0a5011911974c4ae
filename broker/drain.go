package broker

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/refusal"
	"github.com/npurun/npurun/internal/testhook"
	"github.com/npurun/npurun/wire"
)

// hookBeforeDrainReply: a drain or undrain is made and its answer not
// yet sent (internal/testhook).
const hookBeforeDrainReply = "before-drain-reply"

// drainOp drains or undrains a device (root only): the lease table keeps
// the drain, and its file; the line hears of it in its progress lines,
// the board's watchers at once. A device that Slurm manages ([slurm]
// split or allocate) is refused: Slurm picks it, and draining it is
// Slurm's (scontrol update nodename=… state=drain), which the table
// cannot refuse a job's Prolog without failing the job.
func (s *Server) drainOp(c *conn, req *wire.Request) bool {
	reply := func(r *wire.Reply) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return c.sendLocked(r) == nil
	}
	if c.uid != 0 {
		reply(errReply(wire.CodeDenied, fmt.Sprintf("%s is root's: uid %d may not %s a device", req.Op, c.uid, req.Op), "run it as root (sudo npubroker "+req.Op+" …)"))
		return false
	}
	id, err := s.deviceByName(req.Device)
	if err != nil {
		return reply(refusalReply(err))
	}
	name := s.inv.Vendor.Noun() + strconv.Itoa(id)
	if s.policy().Slurm.Active() && s.policy().Slurm.Manages(id) {
		return reply(errReply(wire.CodeDenied, fmt.Sprintf("%s is Slurm's ([slurm] mode %q): drain it in Slurm, not here", name, s.policy().Slurm.Mode), "scontrol update nodename=<this node> state=drain reason=…"))
	}
	info := &wire.DrainInfo{Device: name}
	if req.Op == wire.OpDrain {
		by, _, _ := s.users.nameGroups(c.uid)
		if by == "" {
			by = "uid " + strconv.Itoa(int(c.uid))
		}
		was := s.table.Drains()
		d, err := s.table.Drain(id, lease.Drain{By: by, Reason: req.Reason, Since: time.Now()})
		if err != nil {
			s.log.Printf("drain %s: %v", name, err)
			return reply(refusalReply(err))
		}
		_, info.Was = was[id]
		info.Drained, info.By, info.Reason, info.Since = true, d.By, d.Reason, d.Since.UnixMilli()
		info.Leased = s.status.States()[id] != wire.DeviceDrained
		s.log.Printf("%s drained by %s: %s", name, by, d.Reason)
	} else {
		was, err := s.table.Undrain(id) // serves the line (tableOwner.Freed): s.mu is not held
		if err != nil {
			s.log.Printf("undrain %s: %v", name, err)
			return reply(refusalReply(err))
		}
		info.Was = was
		if was {
			s.log.Printf("%s undrained", name)
		}
	}
	s.drainChanged()
	testhook.Stop(s.log, hookBeforeDrainReply, req.Op+" of "+name)
	return reply(&wire.Reply{Type: wire.TypeDrained, Drain: info})
}

// deviceByName is the device a name means: "npu3", "gpu3" (the
// vendor's noun and its physical id) or "3".
func (s *Server) deviceByName(name string) (int, error) {
	noun := s.inv.Vendor.Noun()
	num := strings.TrimPrefix(name, noun)
	id, err := strconv.Atoi(num)
	if err != nil || id < 0 || num == "" || num[0] == '+' || num[0] == '-' {
		return 0, &refusal.Refusal{Err: lease.ErrNoDevice, Msg: fmt.Sprintf("no device %q here: name one as %s3 or 3", name, noun),
			Hint: "this broker manages " + s.inv.Vendor.Format(s.inv.IDs)}
	}
	return id, nil
}
