package status

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/npurun/npurun/wire"
)

// A task's history outlives the journal's ended tasks (a few per user):
// the accounting log keeps every task lease's start and end, with the
// task's id, its user, pool and devices, for as long as its files are
// kept ([usage] max_size and keep). TaskHistory reads it for task-submit
// list --ended; what the log does not know (the command, the exit status;
// tasks run without a device, which hold no lease; a lease summed past
// its user's rate, usagelimit.go) it cannot tell.

// TaskLease is a task's lease as the accounting log shows it.
type TaskLease struct {
	Task     uint64
	UID      uint32
	User     string
	Pool     string
	Devices  []int
	Started  int64 // Unix ms
	Ended    int64 // Unix ms: its last device's end
	Complete bool  // an end of every device was found
}

// TaskHistory is the task leases of uid (everyone's with all) that the
// accounting log shows ended from since on, newest end first, at most max
// of them; more tells that others were left out.
func (g *Ledger) TaskHistory(uid uint32, all bool, since time.Time, most int) (out []TaskLease, more bool, err error) {
	usageReads <- struct{}{}
	g.usage.flush(time.Second)
	files, _, _, err := g.usage.readSince(since)
	<-usageReads
	if err != nil {
		return nil, false, fmt.Errorf("read the usage log: %w", err)
	}
	out, more = taskLeases(files, uid, all, since.UnixMilli(), most)
	return out, more, nil
}

// taskLeases picks TaskHistory's leases from the records of the log's
// files, oldest first.
func taskLeases(files [][]usageRec, uid uint32, all bool, since int64, most int) ([]TaskLease, bool) {
	starts := map[uint64]*TaskLease{}
	left := map[uint64]int{} // devices not yet ended, per lease
	for _, recs := range files {
		for _, r := range recs {
			switch r.Ev {
			case "start", "open":
				if _, seen := starts[r.Lease]; seen || r.Task == 0 || r.Kind != wire.KindTask || (!all && r.UID != uid) {
					continue
				}
				starts[r.Lease] = &TaskLease{Task: r.Task, UID: r.UID, User: r.User, Pool: r.Pool,
					Devices: slices.Clone(r.Devices), Started: r.T}
				left[r.Lease] = len(r.Devices)
			case "end":
				if tl := starts[r.Lease]; tl != nil && r.Device != nil {
					tl.Ended = max(tl.Ended, r.T)
					if left[r.Lease]--; left[r.Lease] <= 0 {
						tl.Complete = true
					}
				}
			}
		}
	}
	var out []TaskLease
	for _, tl := range starts {
		if tl.Ended != 0 && tl.Ended >= since {
			out = append(out, *tl)
		}
	}
	slices.SortFunc(out, func(a, b TaskLease) int {
		return cmp.Or(cmp.Compare(b.Ended, a.Ended), cmp.Compare(b.Task, a.Task))
	})
	if len(out) > most {
		return out[:most], true
	}
	return out, false
}
