package wire

import (
	"fmt"
	"time"
)

// Who held which device when, from the accounting log: any user may ask
// (npuboard's timeline does), for the records of at most the last
// MaxHistorySpan and at most MaxHistoryEntries of them, the newest kept.
//
//	npuboard                                        npubroker
//	  │ ── {"op":"lease-history",                    │ identity: SO_PEERCRED; any user may ask
//	  │     "lease_history":{"since_ms":…,"max":…}} ▶│ reads the accounting log
//	  │ ◀── {"type":"lease-history",                 │ entries in as many replies as they take
//	  │      "lease_history":{…},"more":true} ────── │
//	  │ ◀── {"type":"lease-history",                 │ the last one without "more"
//	  │      "lease_history":{…}} ─────────────────── │
//
// The log records no command line, service, terminal or remote host, and
// the history carries none: it shows no more of another user than
// status does with [status] show_commands = "own".

// OpLeaseHistory asks for the leases of the accounting log.
const OpLeaseHistory = "lease-history"

// TypeLeaseHistory is its reply.
const TypeLeaseHistory = "lease-history"

// Bounds of one history query: the time range and the entries.
const (
	MaxHistorySpan    = 7 * 24 * time.Hour
	MaxHistoryEntries = 10000
)

// HistoryQuery asks for the leases held at any time from SinceMS to now
// (no further back than MaxHistorySpan), at most Max entries (0 or more
// than MaxHistoryEntries: MaxHistoryEntries), the newest kept.
type HistoryQuery struct {
	SinceMS int64 `json:"since_ms"`
	Max     int   `json:"max,omitempty"`
}

// HistoryReport is the leases of a history query, one entry per device of
// a lease, in the order of their starts.
type HistoryReport struct {
	Since   int64          `json:"since"` // Unix ms: SinceMS, or MaxHistorySpan ago where it asked for more
	Until   int64          `json:"until"`
	Entries []HistoryEntry `json:"entries"`
	// Cut tells that older entries were left out (Max); Incomplete
	// counts the entries whose end the log lost (left out).
	Cut        bool `json:"cut,omitempty"`
	Incomplete int  `json:"incomplete,omitempty"`
}

// HistoryEntry is one device of one lease.
type HistoryEntry struct {
	Lease  uint64 `json:"lease"`
	Device int    `json:"device"`
	Name   string `json:"name"` // "npu3"
	Kind   string `json:"kind"` // KindInline, KindTask, ...
	User   string `json:"user"`
	UID    uint32 `json:"uid"`
	Pool   string `json:"pool"`
	Task   uint64 `json:"task,omitempty"`
	Mem    int64  `json:"mem,omitempty"` // a share's declaration, MiB
	Start  int64  `json:"start"`         // Unix ms
	End    int64  `json:"end,omitempty"` // Unix ms; 0: held now
	How    string `json:"how,omitempty"` // how it ended: "released", "reclaimed", "gone-at-start"
	// Its utilization where sampled: the mean, percent, and the time it
	// was found idle, ms (of a lease held now: so far).
	Util   *float64 `json:"util,omitempty"`
	IdleMS int64    `json:"idle_ms,omitempty"`
}

// LeaseHistory asks for the leases held from since on, at most max
// entries (0: MaxHistoryEntries).
func (c *Conn) LeaseHistory(q HistoryQuery) (*HistoryReport, error) {
	r, err := c.call(&Request{Op: OpLeaseHistory, History: &q})
	var all *HistoryReport
	for {
		if err != nil {
			return nil, err
		}
		if r.Type != TypeLeaseHistory || r.History == nil {
			return nil, fmt.Errorf("unexpected reply %q to lease-history", r.Type)
		}
		if all == nil {
			all = r.History
		} else {
			all.Entries = append(all.Entries, r.History.Entries...)
		}
		if !r.More {
			return all, nil
		}
		if len(all.Entries) > MaxHistoryEntries {
			return nil, fmt.Errorf("lease-history: more than %d entries", MaxHistoryEntries)
		}
		r, _, err = c.Recv(-1)
	}
}
