package broker

import (
	"errors"
	"time"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/status"
	"github.com/npurun/npurun/broker/tasks"
	"github.com/npurun/npurun/wire"
)

// statusOp serves status (once, or watched), usage and lease-history,
// from the status room (package status). Any user may ask.
func (s *Server) statusOp(c *conn, req *wire.Request) bool {
	switch req.Op {
	case wire.OpStatus:
		if req.Watch {
			return s.watchStatus(c)
		}
		b, _ := s.status.Board(c.uid)
		return c.sendRaw(status.EncodeBoard(b)) == nil
	case wire.OpLeaseHistory:
		return s.leaseHistoryOp(c, req.History)
	default:
		return s.usageOp(c, req.Usage)
	}
}

// tableView is the lease table as the status room reads it
// (status.Table): the table's copies, with what Slurm says of the
// placeholder of a request that waits for Slurm's devices in place of the
// line's reason (slurmWhy). The status room calls it holding no lock.
type tableView Server

var _ status.Table = (*tableView)(nil)

// Snapshot copies the table.
func (v *tableView) Snapshot() lease.Snapshot {
	s := (*Server)(v)
	snap := s.table.Snapshot()
	var ids []uint64
	for _, p := range snap.Line {
		if p.Why == "" && p.W.Task != 0 {
			ids = append(ids, p.W.Task)
		}
	}
	if held := s.tasks.HeldByOwner(ids...); len(held) > 0 {
		for i, p := range snap.Line {
			if p.Why == "" && held[p.W.Task] {
				snap.Line[i].Why = tasks.HeldWhy
			}
		}
	}
	if s.slurm != nil {
		for i, p := range snap.Line {
			snap.Line[i].Why = s.slurmWhy(p.W, p.Why)
		}
	}
	return snap
}

// SetExternal tells the table what processes outside any lease use of
// device id.
func (v *tableView) SetExternal(id int, mib int64) { (*Server)(v).table.SetExternal(id, mib) }

// Reason says why w waits beyond its turn, if it does.
func (v *tableView) Reason(w *lease.Waiter) string {
	s := (*Server)(v)
	return s.slurmWhy(w, s.heldWhy(w, s.table.Reason(w)))
}

// heldWhy is why, or, for a task its owner holds (task-submit hold), that
// it is held: the line passes over it, so the board says why.
func (s *Server) heldWhy(w *lease.Waiter, why string) string {
	if why == "" && w.Task != 0 && s.tasks.HeldByOwner(w.Task)[w.Task] {
		return tasks.HeldWhy
	}
	return why
}

// watchGap is the least time between two boards of a watch: a burst of
// changes costs one board.
const watchGap = 100 * time.Millisecond

// watchLook is how often a watch looks at the holders of leases between
// other changes (a holder that exits changes no lock).
const watchLook = 2 * time.Second

// watchStatus sends the board now and after every change until the client
// closes the connection or sends anything.
func (s *Server) watchStatus(c *conn) bool {
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		c.read()
	}()
	look := time.NewTicker(watchLook)
	defer look.Stop()
	var sent uint64
	first := true
	for {
		changed, next := s.status.Watch(sent)
		if first || changed {
			b, gen := s.status.Board(c.uid)
			if c.sendRaw(status.EncodeBoard(b)) != nil {
				return false
			}
			sent, first = gen, false
			select {
			case <-time.After(watchGap):
			case <-gone:
				return false
			}
			continue
		}
		select {
		case <-next:
		case <-look.C:
			s.status.Refresh()
		case <-gone:
			return false
		}
	}
}

// usageOp sums the accounting log for npubroker usage.
func (s *Server) usageOp(c *conn, q *wire.UsageQuery) bool {
	rep, err := s.status.Usage(q)
	if errors.Is(err, status.ErrBadQuery) || errors.Is(err, status.ErrBadBy) {
		s.mu.Lock()
		defer s.mu.Unlock()
		c.sendLocked(errReply(wire.CodeBadRequest, err.Error(), ""))
		return false
	}
	if err != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		c.sendLocked(errReply("usage-log", err.Error(), ""))
		return true
	}
	return c.sendUsage(rep) == nil
}

// sendUsage sends rep's rows in as many replies as their size takes.
func (c *conn) sendUsage(rep *wire.UsageReport) error {
	return sendInParts(c, rep.Rows, "rows", func(rows []wire.UsageRow, more bool) *wire.Reply {
		part := *rep
		part.Rows = rows
		return &wire.Reply{V: wire.Version, Type: wire.TypeUsage, Usage: &part, More: more}
	})
}

// leaseHistoryOp serves who held which device when, from the accounting
// log, in as many replies as the entries take.
func (s *Server) leaseHistoryOp(c *conn, q *wire.HistoryQuery) bool {
	rep, err := s.status.LeaseHistory(q)
	if errors.Is(err, status.ErrBadQuery) {
		s.mu.Lock()
		defer s.mu.Unlock()
		c.sendLocked(errReply(wire.CodeBadRequest, "lease-history needs a start time in the past", ""))
		return false
	}
	if err != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		c.sendLocked(errReply("usage-log", err.Error(), ""))
		return true
	}
	return sendInParts(c, rep.Entries, "entries", func(entries []wire.HistoryEntry, more bool) *wire.Reply {
		part := *rep
		part.Entries = entries
		return &wire.Reply{V: wire.Version, Type: wire.TypeLeaseHistory, History: &part, More: more}
	}) == nil
}
