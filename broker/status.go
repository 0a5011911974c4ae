package broker

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/policy"
)

// statusOp serves status (once, or watched) and usage. Any user may ask:
// the board shows every device, state and waiter; the command lines of
// other users' processes only where [status] show_commands allows.
func (s *Server) statusOp(c *conn, req *client.Request) bool {
	switch req.Op {
	case client.OpStatus:
		if req.Watch {
			return s.watchStatus(c)
		}
		b, _ := s.board(c.uid)
		return c.sendRaw(encodeBoard(b)) == nil
	default:
		return s.usageOp(c, req.Usage)
	}
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
		s.mu.Lock()
		changed := first || s.led.gen != sent
		ch := s.led.changed
		if ch == nil {
			ch = make(chan struct{})
			s.led.changed = ch
		}
		s.mu.Unlock()
		if changed {
			b, gen := s.board(c.uid)
			if c.sendRaw(encodeBoard(b)) != nil {
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
		case <-ch:
		case <-look.C:
			s.refreshHolders()
		case <-gone:
			return false
		}
	}
}

// changedLocked tells watchers that the board changed. With nobody
// watching it costs an increment: it is called on every scheduling pass.
func (s *Server) changedLocked() {
	s.led.gen++
	if s.led.changed != nil {
		close(s.led.changed)
		s.led.changed = nil
	}
}

// board is the board as asker may see it, after a look at the holders,
// and the change count it reflects.
func (s *Server) board(asker uint32) (*client.Board, uint64) {
	s.refreshHolders()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.boardLocked(asker), s.led.gen
}

// maxWaitersShown is how many waiters of each pool the board lists.
const maxWaitersShown = 20

// maxUnleasedShown bounds the unleased uses the board lists.
const maxUnleasedShown = 100

func (s *Server) boardLocked(asker uint32) *client.Board {
	now := time.Now()
	show := func(uid uint32) bool {
		return asker == 0 || uid == asker || s.cfg.Status.ShowCommands == policy.ShowCommandsAll
	}
	b := &client.Board{Time: now.UnixMilli(), Vendor: string(s.inv.Vendor), Devices: []client.DeviceState{}, Waiting: []client.Line{}, Unleased: []client.Unleased{}}
	snap := s.table.Snapshot()
	states, reserved := s.deviceStates(snap)
	for _, d := range snap.Devices {
		id := d.ID
		ds := client.DeviceState{ID: id, Name: s.deviceName(id), Pool: d.Pool, State: states[id]}
		if l := s.led.leases[id]; l != nil {
			ds.Since = l.Since.UnixMilli()
			ds.Lease = s.leaseInfo(l, id, show)
		}
		if w := reserved[id]; w != nil {
			wi := s.waiterInfo(w, 0, s.table.Reason(w))
			ds.ReservedFor = &wi
			ds.Since = w.Queued.UnixMilli()
			if !d.Freed.IsZero() && d.Freed.After(w.Queued) {
				ds.Since = d.Freed.UnixMilli()
			}
		}
		b.Devices = append(b.Devices, ds)
	}
	lines := map[string]*client.Line{}
	for _, p := range s.cfg.Pools {
		b.Waiting = append(b.Waiting, client.Line{Pool: p.Name, Waiters: []client.WaiterInfo{}})
	}
	for i := range b.Waiting {
		lines[b.Waiting[i].Pool] = &b.Waiting[i]
	}
	for _, p := range snap.Line {
		ln := lines[p.W.Pool]
		if ln == nil {
			continue
		}
		ln.Count++
		if len(ln.Waiters) < maxWaitersShown {
			ln.Waiters = append(ln.Waiters, s.waiterInfo(p.W, ln.Count, p.Why))
		}
	}
	if first, n := s.cpuLineLocked(maxWaitersShown); n > 0 {
		ln := client.Line{Pool: "cpu", Waiters: []client.WaiterInfo{}, Count: n}
		for i, w := range first {
			ln.Waiters = append(ln.Waiters, s.waiterInfo(w, i+1, s.table.Reason(w)))
		}
		b.Waiting = append(b.Waiting, ln)
	}
	for _, u := range s.led.reported {
		if len(b.Unleased) == maxUnleasedShown {
			b.Truncated = true
			break
		}
		b.Unleased = append(b.Unleased, s.unleasedInfo(u, show(u.uid)))
	}
	b.Scan = client.ScanInfo{IntervalMS: s.cfg.Status.ScanInterval.Milliseconds(), GraceMS: s.cfg.Status.UnleasedGrace.Milliseconds()}
	if ls := s.led.lastScan; ls != nil {
		b.Scan.Last = ls.at.UnixMilli()
		b.Scan.TookMS = float64(ls.took.Microseconds()) / 1000
		b.Scan.Procs = ls.procs
	}
	return b
}

// deviceStatesLocked returns each device's state, and the waiter each
// reserved device is kept for (lease.Table.Snapshot says which).
func (s *Server) deviceStatesLocked() (map[int]string, map[int]*lease.Waiter) {
	return s.deviceStates(s.table.Snapshot())
}

// deviceStates is deviceStatesLocked of snapshot snap, under Server.mu: a
// lease the ledger still records is shown until the ledger hears of its
// end (the table's watcher reports it just after the lock goes).
func (s *Server) deviceStates(snap lease.Snapshot) (map[int]string, map[int]*lease.Waiter) {
	states := make(map[int]string, len(snap.Devices))
	reserved := map[int]*lease.Waiter{}
	for _, d := range snap.Devices {
		switch l := s.led.leases[d.ID]; {
		case l != nil:
			states[d.ID] = kindState(l.kind())
		case d.State == lease.Reserved:
			states[d.ID] = client.DeviceReserved
			reserved[d.ID] = d.For
		case d.State == lease.Free:
			states[d.ID] = client.DeviceFree
		case d.State == lease.Granting:
			states[d.ID] = kindState(string(d.For.Kind))
		case d.State == lease.Leased:
			states[d.ID] = kindState(string(d.Leases[0].Kind))
		default:
			states[d.ID] = client.DeviceOut
		}
	}
	return states, reserved
}

func kindState(kind string) string {
	switch kind {
	case client.KindInline:
		return client.DeviceLeased
	case client.KindTask:
		return client.DeviceTask
	case client.KindLogin:
		return client.DeviceLogin
	case client.KindSlurm:
		return client.DeviceSlurm
	case client.KindContainer:
		return client.DeviceContainer
	}
	return client.DeviceHeld
}

// deviceName is what people call device id: npu3, gpu3.
func (s *Server) deviceName(id int) string {
	return s.inv.Vendor.Noun() + strconv.Itoa(id)
}

func (s *Server) leaseInfo(l *ledgerEntry, id int, show func(uint32) bool) *client.LeaseInfo {
	li := &client.LeaseInfo{ID: l.ID, Kind: l.kind(), User: l.User, UID: l.UID, PID: l.pid, Task: l.Task,
		Service: l.Service, TTY: l.TTY, RHost: l.RHost, Claimed: l.Claimed, Devices: l.Devices, Since: l.Since.UnixMilli(), Adopted: l.Adopted,
		SlurmJob: l.SlurmJob}
	li.Container = s.led.containers.named(l.container, show(l.UID))
	li.Holders, li.MoreHolders = s.holdersInfo(l, id, show)
	if !l.checked.IsZero() {
		li.Checked = l.checked.UnixMilli()
	}
	return li
}

// waiterInfo is waiter w, at place pos, waiting for why beyond its turn,
// as the board shows it.
func (s *Server) waiterInfo(w *lease.Waiter, pos int, why string) client.WaiterInfo {
	wi := client.WaiterInfo{Position: pos, Kind: string(w.Kind), User: w.User, N: w.N, Since: w.Queued.UnixMilli(), Why: s.slurmWhy(w, why), Task: w.Task, SlurmJob: w.SlurmJob}
	if w.Exact {
		wi.Devices = w.Cand
	}
	return wi
}

// encodeBoard is the status reply carrying b, cut to fit one message if
// it must be: fewer waiters, unleased uses and holders, then no commands,
// then fewer devices; Truncated says so.
func encodeBoard(b *client.Board) []byte {
	for cut := 0; ; cut++ {
		data, err := json.Marshal(&client.Reply{V: client.Version, Type: client.TypeStatus, Board: b})
		if err == nil && len(data) <= client.MaxMessage || cut == 5 {
			return data
		}
		b.Truncated = true
		keep := []int{5, 1, 0, 0, 0}[cut]
		for i := range b.Waiting {
			b.Waiting[i].Waiters = b.Waiting[i].Waiters[:min(keep, len(b.Waiting[i].Waiters))]
		}
		b.Unleased = b.Unleased[:min(keep*4, len(b.Unleased))]
		for i := range b.Devices {
			li := b.Devices[i].Lease
			if li == nil {
				continue
			}
			if n := max(keep, 1); len(li.Holders) > n {
				li.MoreHolders += len(li.Holders) - n
				li.Holders = li.Holders[:n]
			}
			if cut >= 3 {
				for j := range li.Holders {
					li.Holders[j].Command = ""
				}
			}
		}
		if cut == 4 {
			b.Devices = b.Devices[:min(len(b.Devices), 256)]
		}
	}
}

// usageReads bounds the usage requests reading the accounting log at once.
var usageReads = make(chan struct{}, 2)

// usageOp sums the accounting log for npubroker usage.
func (s *Server) usageOp(c *conn, q *client.UsageQuery) bool {
	now := time.Now()
	if q == nil || q.SinceMS < 0 || q.SinceMS > now.UnixMilli() {
		s.mu.Lock()
		defer s.mu.Unlock()
		c.sendLocked(errReply(client.CodeBadRequest, "usage needs a start time in the past", ""))
		return false
	}
	usageReads <- struct{}{}
	s.led.usage.flush(time.Second)
	files, cut, oldest, err := s.led.usage.readSince(time.UnixMilli(q.SinceMS))
	<-usageReads
	if err != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		c.sendLocked(errReply("usage-log", fmt.Sprintf("read the usage log: %v", err), ""))
		return true
	}
	s.mu.Lock()
	live := map[uint64]bool{}
	for _, l := range s.led.leases {
		live[l.ID] = true
	}
	// Leases past their user's rate that ended lately are not in the log
	// yet: counted all the same.
	files = append(files, s.led.sums.pending())
	s.mu.Unlock()
	rep := sumUsage(files, time.UnixMilli(q.SinceMS), now, q.User, func(id uint64) bool { return live[id] })
	rep.Dropped = s.led.usage.dropped.Load()
	rep.Oldest = 0
	if cut {
		rep.Oldest = oldest
	}
	return c.sendUsage(rep) == nil
}

// sendUsage sends rep's rows in as many replies as their size takes.
func (c *conn) sendUsage(rep *client.UsageReport) error {
	rows := rep.Rows
	for {
		part := *rep
		n, size := 0, 1024
		for n < len(rows) && size < client.MaxMessage/2 {
			b, _ := json.Marshal(&rows[n])
			size += len(b) + 1
			n++
		}
		part.Rows = rows[:n]
		rows = rows[n:]
		data, err := json.Marshal(&client.Reply{V: client.Version, Type: client.TypeUsage, Usage: &part, More: len(rows) > 0})
		if err != nil {
			return err
		}
		if err := c.sendRaw(data); err != nil {
			return err
		}
		if len(rows) == 0 {
			return nil
		}
	}
}
