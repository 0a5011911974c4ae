package status

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/npurun/npurun/wire"
)

// LeaseHistory is who held which device when, for npuboard's timeline and
// anyone who asks: the accounting log's leases held at any time from
// since (no earlier than wire.MaxHistorySpan ago) to now, one entry per
// device of a lease, at most most of them (the newest starts kept). The
// log names no command, and the history none of the session's origin
// either: any user may ask.
func (g *Ledger) LeaseHistory(q *wire.HistoryQuery) (*wire.HistoryReport, error) {
	now := time.Now()
	if q == nil || q.SinceMS < 0 || q.SinceMS > now.UnixMilli() {
		return nil, ErrBadQuery
	}
	since := max(q.SinceMS, now.Add(-wire.MaxHistorySpan).UnixMilli())
	most := q.Max
	if most <= 0 || most > wire.MaxHistoryEntries {
		most = wire.MaxHistoryEntries
	}
	usageReads <- struct{}{}
	g.usage.flush(time.Second)
	files, _, _, err := g.usage.readSince(time.UnixMilli(since))
	<-usageReads
	if err != nil {
		return nil, fmt.Errorf("read the usage log: %w", err)
	}
	g.mu.Lock()
	type figs struct {
		util   *float64
		idleMS int64
	}
	live := map[uint64]figs{}
	for _, e := range g.leases {
		var f figs
		f.util, f.idleMS = e.util.figures()
		live[e.ID] = f
	}
	for _, es := range g.shares {
		for _, e := range es {
			var f figs
			f.util, f.idleMS = e.util.figures()
			live[e.ID] = f
		}
	}
	g.unlock()
	rep := leaseHistory(files, since, now.UnixMilli(), most, g.deviceName, func(id uint64) (bool, *float64, int64) {
		f, ok := live[id]
		return ok, f.util, f.idleMS
	})
	return rep, nil
}

// leaseHistory picks LeaseHistory's entries from the records of the log's
// files, oldest first: each device of each lease held at any time from lo
// to hi (Unix ms), in the order of their starts, the newest most of them.
// A device with no end is held now if live says its lease is (with its
// figures so far), else its end was lost: left out, counted.
func leaseHistory(files [][]usageRec, lo, hi int64, most int, name func(int) string, live func(uint64) (bool, *float64, int64)) *wire.HistoryReport {
	type key struct {
		lease uint64
		dev   int
	}
	starts := map[uint64]usageRec{}
	var order []uint64
	ends := map[key]usageRec{}
	for _, recs := range files {
		for _, r := range recs {
			switch r.Ev {
			case "start", "open":
				if _, seen := starts[r.Lease]; !seen && len(r.Devices) > 0 {
					starts[r.Lease] = r
					order = append(order, r.Lease)
				}
			case "kind":
				if st, ok := starts[r.Lease]; ok {
					st.Kind = r.Kind
					starts[r.Lease] = st
				}
			case "end":
				if r.Device != nil {
					ends[key{r.Lease, *r.Device}] = r
				}
			}
		}
	}
	rep := &wire.HistoryReport{Since: lo, Until: hi, Entries: []wire.HistoryEntry{}}
	for _, id := range order {
		st := starts[id]
		if st.T > hi {
			continue
		}
		for _, d := range st.Devices {
			e := wire.HistoryEntry{Lease: id, Device: d, Name: name(d), Kind: st.Kind, User: st.User, UID: st.UID,
				Pool: st.Pool, Task: st.Task, Mem: st.Mem, Start: st.T}
			if end, ok := ends[key{id, d}]; ok {
				if end.T < lo {
					continue
				}
				e.End, e.How, e.Util, e.IdleMS = end.T, end.How, end.Util, end.IdleMS
			} else if held, util, idle := live(id); held {
				e.Util, e.IdleMS = util, idle
			} else {
				rep.Incomplete++
				continue
			}
			rep.Entries = append(rep.Entries, e)
		}
	}
	slices.SortStableFunc(rep.Entries, func(a, b wire.HistoryEntry) int {
		return cmp.Or(cmp.Compare(a.Start, b.Start), cmp.Compare(a.Lease, b.Lease), cmp.Compare(a.Device, b.Device))
	})
	if len(rep.Entries) > most {
		rep.Entries = slices.Clone(rep.Entries[len(rep.Entries)-most:])
		rep.Cut = true
	}
	return rep
}
