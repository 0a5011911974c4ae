package status

import (
	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/wire"
)

// backfillInfo is what status and the accounting log say of lease l
// backfilled ([scheduling] backfill); nil for one that was not.
func backfillInfo(l *lease.Lease) *wire.Backfill {
	if l == nil || l.Backfill == nil {
		return nil
	}
	b := l.Backfill
	return &wire.Backfill{EndsBy: b.EndsBy.UnixMilli(), Before: b.Of(), BeforeStart: b.BeforeAt.UnixMilli(), Beside: b.Beside}
}

// TaskBackfill is what task id's lease held now went ahead of, if it was
// backfilled (task-submit show); nil otherwise.
func (g *Ledger) TaskBackfill(id uint64) *wire.Backfill {
	g.mu.Lock()
	defer g.unlock()
	for _, e := range g.leases {
		if e != nil && e.Kind == lease.Task && e.Task == id && e.Lease.Backfill != nil {
			return backfillInfo(e.Lease)
		}
	}
	for _, list := range g.shares {
		for _, e := range list {
			if e.Kind == lease.Task && e.Task == id && e.Lease.Backfill != nil {
				return backfillInfo(e.Lease)
			}
		}
	}
	return nil
}
