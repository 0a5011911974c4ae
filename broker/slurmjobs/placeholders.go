package slurmjobs

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/wire"
)

// Allocate mode ([slurm] mode "allocate"): Slurm is the only allocator
// of its devices. A request for a pool of them (an npurun, a task, a
// login's lease) waits in the lease table's line as an external request
// (lease.Pool.External), reserving nothing, and in Slurm's queue as a
// placeholder allocation: a batch job of its user on this node, for as
// many of the GRES as it wants, that sleeps. So Slurm's fair share,
// limits and accounting apply to it. The placeholder's Prolog names the
// devices Slurm picked: they are claimed for the request and granted to
// it as any grant is (Deliver), and the placeholder's own steps hold
// nothing (slurm-hold and slurm-task are answered "ignore"), so that the
// lease is the request's alone. When the lease ends the placeholder is
// cancelled; when Slurm ends the placeholder first (its time limit,
// scancel, preemption), its Epilog ends the lease's processes (SIGTERM,
// SIGKILL after kill_grace), as nothing may run on a device Slurm gives
// to someone else.
//
// One goroutine (run) follows the line's external requests: it submits
// a placeholder for each new one (sbatch, as the request's user), cancels
// those of requests that left the line, and asks squeue about all of them
// every poll_interval, telling waiters Slurm's state and reason.

// PlaceholderOwner is what allocate mode needs of the broker, beside
// Owner.
type PlaceholderOwner interface {
	// Deliver delivers handover h, the devices Slurm picked for a
	// request's placeholder, to the request (an npurun's connection, a
	// task's start, a login's session), as the line's grants are, and
	// begins its lease or returns the devices: it tells whether it did.
	Deliver(h *lease.Handover) bool
	// Changed tells that waiter w's placeholder is Slurm job id (0 for
	// none yet) and that what Why says of it changed: its progress is to
	// be told.
	Changed(w *lease.Waiter, id uint32)
	// Refuse takes w out of the line and answers it with code and msg:
	// Slurm refused its placeholder, or ended it before it started.
	Refuse(w *lease.Waiter, code, msg string)
	// TimeLimit is w's time limit (a task's --time), 0 for none: its
	// placeholder asks Slurm for as much, rounded up to minutes.
	TimeLimit(w *lease.Waiter) time.Duration
}

// placeholder is one request's placeholder allocation, under Room.mu.
type placeholder struct {
	w        *lease.Waiter
	job      uint32 // 0 until sbatch answers
	state    string // Slurm's (PENDING, RUNNING), from the last poll
	reason   string // Slurm's reason, while pending
	claiming bool   // its Prolog claims the devices
	alloc    bool   // made by salloc: an allocation with no batch step
	granted  bool   // delivered: the request holds the lease
	running  time.Time
	cancel   chan struct{} // closed when the placeholder must not be claimed for any more
}

// placeholders are allocate mode's placeholder allocations, under
// Room.mu.
type placeholders struct {
	r     *Room
	po    PlaceholderOwner
	wake  chan struct{}
	byW   map[*lease.Waiter]*placeholder
	byID  map[uint32]*placeholder
	once  sync.Once
	saidN bool
	// noAlloc: a placeholder made by salloc ran without a Prolog
	// (slurm.conf without PrologFlags=Alloc runs none for an
	// allocation with no step): placeholders are queued by sbatch only.
	noAlloc bool
	// submitting counts the placeholders being submitted: a Prolog of a
	// job the room does not know waits for them (settled), as its job
	// may be one whose sbatch has not answered yet.
	submitting int
	settled    chan struct{}
}

// MaxPlaceholders bounds the placeholders the broker keeps in Slurm's
// queue at once.
const MaxPlaceholders = 1024

// Slurm's commands are bounded in time and in what is read of them.
const (
	submitTimeout = 20 * time.Second
	pollTimeout   = 5 * time.Second
	cancelTimeout = 10 * time.Second
	maxOutput     = 1 << 20
	// unclaimedGrace is how long a placeholder may run without its
	// Prolog having named its devices (a Prolog that failed: no broker
	// then, a wrong slurm.conf) before it is cancelled and another is
	// submitted.
	unclaimedGrace = 90 * time.Second
)

func newPlaceholders(r *Room) *placeholders {
	wake := r.cfg.Wake
	if wake == nil {
		wake = make(chan struct{}, 1)
	}
	return &placeholders{r: r, wake: wake, byW: map[*lease.Waiter]*placeholder{}, byID: map[uint32]*placeholder{}, settled: make(chan struct{})}
}

// resume takes up the placeholders an earlier broker left: one whose
// lease goes on is followed (cancelled when it ends, its lease ended
// when Slurm ends it); any other is cancelled, its request having gone
// with that broker (an npurun or a login asks again, a task queues again
// with a placeholder of its own). Then it starts following the line,
// with po the broker.
func (ph *placeholders) resume(po PlaceholderOwner) {
	r := ph.r
	held := map[uint32]*lease.Lease{}
	for _, d := range r.table.Snapshot().Devices {
		for _, l := range d.Leases {
			if l.SlurmJob != 0 && l.Kind != lease.Slurm {
				held[l.SlurmJob] = l
			}
		}
	}
	recs := r.rec.placeholders
	r.rec.placeholders = nil
	for _, rec := range recs {
		if l := held[rec.Job]; l != nil {
			p := &placeholder{w: &lease.Waiter{Holder: l.Holder, N: len(l.Devices), Pool: l.Pool, External: true}, job: rec.Job, granted: true, cancel: make(chan struct{})}
			r.mu.Lock()
			ph.byID[rec.Job] = p
			r.mu.Unlock()
			continue
		}
		r.rec.removePlaceholder(rec.Job)
		r.log.Printf("placeholder job %d of %s from before this start: its request has gone, cancelled", rec.Job, rec.User)
		go ph.scancel(rec.Job, "its request went with the broker")
	}
	ph.once.Do(func() {
		ph.po = po
		go ph.run()
	})
}

// Why says what Slurm says of waiter w's placeholder ("Slurm job 123:
// PENDING (Resources)"), "" until Slurm has said (a placeholder being
// submitted: its waiter is told nothing before).
func (r *Room) Why(w *lease.Waiter) string {
	if r.ph == nil || !w.External {
		return ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.ph.byW[w]
	switch {
	case p == nil || p.job == 0 || p.state == "":
		return ""
	case p.reason != "" && p.reason != "None":
		return fmt.Sprintf("Slurm job %d: %s (%s)", p.job, p.state, p.reason)
	}
	return fmt.Sprintf("Slurm job %d: %s", p.job, p.state)
}

// byJob is the placeholder of Slurm job id, under Room.mu; nil if none.
func (ph *placeholders) byJob(id uint32) *placeholder { return ph.byID[id] }

// run follows the line's external requests until the broker stops.
func (ph *placeholders) run() {
	tick := time.NewTicker(ph.r.s.PollInterval)
	defer tick.Stop()
	for {
		poll := false
		select {
		case <-ph.wake:
		case <-tick.C:
			poll = true
		}
		ph.sync()
		if poll {
			ph.poll(nil)
		}
	}
}

// sync submits placeholders for the requests new in line and cancels
// those of requests that left it without a grant, or are held (a task
// its owner holds, task starts paused): a held request would refuse the
// devices Slurm gave it, while they kept another job from them. Released,
// it gets a placeholder anew.
func (ph *placeholders) sync() {
	r := ph.r
	ws := r.table.Externals(nil)
	var submit, cancel []*placeholder
	r.mu.Lock()
	in := make(map[*lease.Waiter]bool, len(ws))
	for _, w := range ws {
		in[w] = true
		if ph.byW[w] == nil {
			if len(ph.byW) >= MaxPlaceholders {
				if !ph.saidN {
					ph.saidN = true
					r.log.Printf("%d placeholder allocations in Slurm's queue, the most the broker keeps: further requests wait for one to end", MaxPlaceholders)
				}
				continue
			}
			p := &placeholder{w: w, cancel: make(chan struct{})}
			ph.byW[w] = p
			submit = append(submit, p)
			ph.submitting++
		}
	}
	for w, p := range ph.byW {
		if !in[w] && !p.claiming && !p.granted {
			cancel = append(cancel, p)
			ph.forgetLocked(p)
		}
	}
	r.mu.Unlock()
	for _, p := range cancel {
		if p.job != 0 {
			ph.scancel(p.job, "its request left the line or is held")
		}
	}
	var ids []uint32
	for _, p := range submit {
		if id := ph.submit(p); id != 0 {
			ids = append(ids, id)
		}
	}
	if len(ids) > 0 {
		ph.poll(ids) // Slurm's state and reason, for their waiters' first word
	}
}

// forgetLocked forgets placeholder p.
func (ph *placeholders) forgetLocked(p *placeholder) {
	delete(ph.byW, p.w)
	if p.job != 0 && ph.byID[p.job] == p {
		delete(ph.byID, p.job)
	}
	select {
	case <-p.cancel:
	default:
		close(p.cancel)
	}
}

// submit submits p's placeholder allocation as its request's user, and
// returns its job id (0 if there is none).
func (ph *placeholders) submit(p *placeholder) uint32 {
	r := ph.r
	w := p.w
	r.mu.Lock()
	alloc := !ph.noAlloc
	r.mu.Unlock()
	args := r.placeholderArgs(w, ph.po.TimeLimit(w))
	err := errNotNow
	var id uint32
	if alloc {
		id, err = r.salloc(w, args)
	}
	if errors.Is(err, errNotNow) {
		alloc = false
		id, err = r.sbatch(w, args)
	}
	r.mu.Lock()
	gone := ph.byW[w] != p
	if err == nil && !gone {
		p.job, p.alloc = id, alloc
		ph.byID[id] = p
	}
	if ph.submitting--; ph.submitting == 0 {
		close(ph.settled)
		ph.settled = make(chan struct{})
	}
	r.mu.Unlock()
	switch {
	case err != nil && !gone:
		r.mu.Lock()
		ph.forgetLocked(p)
		r.mu.Unlock()
		r.log.Printf("placeholder allocation for %s of %s: %v", what(w), w.User, err)
		ph.po.Refuse(w, wire.CodeDenied, fmt.Sprintf("Slurm refused a placeholder allocation of %s: %v", quantity.Count(w.N, "device", "devices"), err))
	case err != nil:
	case gone:
		ph.scancel(id, "its request left the line as it was submitted")
	default:
		if err := r.rec.writePlaceholder(id, w); err != nil {
			r.log.Printf("placeholder job %d: %v", id, err)
		}
		ph.po.Changed(w, id)
		return id
	}
	return 0
}

// what names w's request in the log.
func what(w *lease.Waiter) string {
	switch w.Kind {
	case lease.Task:
		return fmt.Sprintf("task %d", w.Task)
	case lease.Login:
		return "a login"
	}
	return "an npurun"
}

// poll asks squeue about placeholders ids (nil: every one), and acts on
// what changed.
func (ph *placeholders) poll(ids []uint32) {
	r := ph.r
	if ids == nil {
		r.mu.Lock()
		for id := range ph.byID {
			ids = append(ids, id)
		}
		r.mu.Unlock()
	}
	if len(ids) == 0 {
		return
	}
	slices.Sort(ids)
	states, err := r.squeue(ids)
	if err != nil {
		r.log.Printf("ask Slurm about %s: %v", quantity.Count(len(ids), "placeholder", "placeholders"), err)
		return
	}
	now := time.Now()
	var changed []*placeholder
	var failed, ended, stale []*placeholder
	r.mu.Lock()
	for _, id := range ids {
		p := ph.byID[id]
		if p == nil {
			continue
		}
		st, ok := states[id]
		switch {
		case !ok && p.granted:
			ended = append(ended, p) // no Epilog came (slurmd down?): the poll ends the lease
			ph.forgetLocked(p)
		case !ok && !p.claiming:
			failed = append(failed, p)
			ph.forgetLocked(p)
		case !ok:
		case st.state != p.state || st.reason != p.reason:
			p.state, p.reason = st.state, st.reason
			if st.state == "RUNNING" && p.running.IsZero() {
				p.running = now
			}
			changed = append(changed, p)
		case st.state == "RUNNING" && !p.granted && !p.claiming && !p.running.IsZero() && now.Sub(p.running) > unclaimedGrace:
			stale = append(stale, p)
			ph.forgetLocked(p)
		}
	}
	r.mu.Unlock()
	for _, p := range changed {
		ph.po.Changed(p.w, p.job)
	}
	for _, p := range failed {
		r.rec.removePlaceholder(p.job)
		ph.po.Refuse(p.w, wire.CodeBusy, fmt.Sprintf("Slurm ended job %d, the placeholder allocation of %s, before it started", p.job, what(p.w)))
	}
	for _, p := range ended {
		r.rec.removePlaceholder(p.job)
		ph.endLeaseOf(p.job, fmt.Sprintf("Slurm job %d, the placeholder allocation of its lease, is gone (scancel, its time limit or preemption)", p.job))
	}
	for _, p := range stale {
		r.log.Printf("placeholder job %d runs since %s with no Prolog that named its devices (slurm.conf Prolog= npurun-slurm, PrologFlags=Alloc?): cancelled, and another submitted", p.job, p.running.Format(time.TimeOnly))
		ph.scancel(p.job, "its Prolog never came")
		if p.alloc {
			r.mu.Lock()
			ph.noAlloc = true
			r.mu.Unlock()
		}
	}
	if len(stale) > 0 {
		ph.kick()
	}
}

func (ph *placeholders) kick() {
	select {
	case ph.wake <- struct{}{}:
	default:
	}
}

// prolog serves the Prolog of placeholder p's job: the devices Slurm
// picked are claimed for its request and delivered to it.
func (ph *placeholders) prolog(p *placeholder, sj wire.SlurmJob, ids []int, progress func(string)) ([]int, string, error) {
	r := ph.r
	r.mu.Lock()
	switch {
	case p.granted:
		r.mu.Unlock()
		return ids, fmt.Sprintf("job %d is the placeholder allocation of %s of %s, granted already", sj.ID, what(p.w), p.w.User), nil
	case p.claiming:
		r.mu.Unlock()
		return nil, "", refuse(wire.CodeBusy, "job %d's Prolog runs already", sj.ID)
	case p.w.UID != sj.UID:
		r.mu.Unlock()
		return nil, "", refuse(wire.CodeBadRequest, "job %d of uid %d is the placeholder of uid %d", sj.ID, sj.UID, p.w.UID)
	case len(ids) != p.w.N:
		r.mu.Unlock()
		return nil, "", refuse(wire.CodeBadRequest, "job %d was given %s for a request of %d", sj.ID, r.vendor.Format(ids), p.w.N)
	}
	p.claiming = true
	w, cancel := p.w, p.cancel
	r.mu.Unlock()
	ph.po.Changed(w, sj.ID) // the grant's lease names its placeholder, however soon its Prolog came
	h, err := r.claim(w, ids, cancel, progress, fmt.Sprintf("placeholder job %d of %s", sj.ID, w.User))
	delivered := false
	if err == nil {
		delivered = ph.po.Deliver(h)
	}
	r.mu.Lock()
	p.claiming = false
	p.granted = delivered
	if !delivered {
		ph.forgetLocked(p)
	}
	r.mu.Unlock()
	switch {
	case errors.Is(err, lease.ErrGone) || (err == nil && !delivered):
		r.rec.removePlaceholder(sj.ID)
		go ph.scancel(sj.ID, "its request left the line")
		return nil, fmt.Sprintf("job %d was the placeholder allocation of %s of %s, which has gone: cancelled", sj.ID, what(w), w.User), nil
	case err != nil:
		return nil, "", err
	}
	return ids, fmt.Sprintf("job %d, the placeholder allocation of %s of %s: %s granted", sj.ID, what(w), w.User, r.vendor.Format(ids)), nil
}

// epilog serves the Epilog of placeholder p's job: Slurm has ended it. A
// lease still held on its devices is ended; a request still waiting for
// it is refused.
func (ph *placeholders) epilog(p *placeholder) string {
	r := ph.r
	r.mu.Lock()
	granted, w, id := p.granted, p.w, p.job
	ph.forgetLocked(p)
	r.mu.Unlock()
	r.rec.removePlaceholder(id)
	if granted {
		if ph.endLeaseOf(id, fmt.Sprintf("Slurm ended job %d, the placeholder allocation of the lease (scancel, its time limit or preemption)", id)) {
			return fmt.Sprintf("job %d, the placeholder allocation of %s of %s, ended: its lease's processes are ended", id, what(w), w.User)
		}
		return fmt.Sprintf("job %d, the placeholder allocation of %s of %s, ended after its lease", id, what(w), w.User)
	}
	ph.po.Refuse(w, wire.CodeBusy, fmt.Sprintf("Slurm ended job %d, the placeholder allocation of %s, before it started", id, what(w)))
	return fmt.Sprintf("job %d, the placeholder allocation of %s of %s, ended before it started", id, what(w), w.User)
}

// endLeaseOf ends the lease granted through placeholder job id, if one
// is held, and tells whether one was.
func (ph *placeholders) endLeaseOf(id uint32, why string) bool {
	for _, d := range ph.r.table.Snapshot().Devices {
		for _, l := range d.Leases {
			if l.SlurmJob == id && l.Kind != lease.Slurm {
				ph.r.log.Printf("%s: ending the lease of %s on %s", why, l.User, ph.r.vendor.Format(l.Devices))
				ph.r.owner.End(l, why)
				return true
			}
		}
	}
	return false
}

// released tells that lease l, granted through a placeholder, ended: the
// placeholder is cancelled.
func (ph *placeholders) released(l *lease.Lease) {
	r := ph.r
	r.mu.Lock()
	p := ph.byID[l.SlurmJob]
	if p != nil {
		ph.forgetLocked(p)
	}
	r.mu.Unlock()
	r.rec.removePlaceholder(l.SlurmJob)
	go ph.scancel(l.SlurmJob, "its lease ended")
}

// scancel cancels placeholder job id, as root.
func (ph *placeholders) scancel(id uint32, why string) {
	if err := ph.r.scancel(id); err != nil {
		ph.r.log.Printf("cancel placeholder job %d (%s): %v", id, why, err)
	}
}

// jobState is a job's state and reason as squeue shows them.
type jobState struct{ state, reason string }

// parseSqueue reads squeue -h -o '%i %T %r'.
func parseSqueue(out string) map[uint32]jobState {
	states := map[uint32]jobState{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		id, err := strconv.ParseUint(f[0], 10, 32)
		if err != nil {
			continue
		}
		st := jobState{state: f[1]}
		if len(f) > 2 {
			st.reason = strings.Join(f[2:], " ")
		}
		states[uint32(id)] = st
	}
	return states
}
