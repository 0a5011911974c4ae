package slurmjobs

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/npurun/npurun/broker/lease"
)

// Resume takes up, once the lease table is in service, the jobs of an
// earlier broker (its records, and the Slurm jobs' leases the broker
// adopted): a job whose lease is held goes on, held by the job's
// processes; a job that broker held alone (its Prolog answered, no extern
// step yet) is locked again, Slurm having given it its devices; any other
// record is of a lease that ended meanwhile, and goes. In allocate mode
// the placeholders follow, with po the broker.
func (r *Room) Resume(po PlaceholderOwner) {
	defer func() {
		if r.ph != nil {
			r.ph.resume(po)
		}
	}()
	adopted := map[uint32]*lease.Lease{}
	for _, d := range r.table.Snapshot().Devices {
		for _, l := range d.Leases {
			if l.Kind == lease.Slurm && l.SlurmJob != 0 {
				adopted[l.SlurmJob] = l
			}
		}
	}
	read := r.rec.read
	r.rec.read = nil
	for _, rec := range read {
		if l := adopted[rec.Job]; l != nil {
			delete(adopted, rec.Job)
			r.goOn(l, Proc{rec.Extern, rec.Start})
			continue
		}
		if rec.State == told {
			if err := r.relock(rec); err != nil {
				r.log.Printf("job %d: lock %s again for its lease: %v", rec.Job, r.vendor.Format(rec.Devices), err)
			} else {
				r.log.Printf("job %d of %s: %s locked again for its lease (the broker held it alone before this start)", rec.Job, rec.User, r.vendor.Format(rec.Devices))
			}
			continue
		}
		r.rec.mu.Lock()
		r.rec.remove(rec.Job)
		r.rec.mu.Unlock()
		r.log.Printf("job %d of %s: its lease of %s ended while the broker was down", rec.Job, rec.User, r.vendor.Format(rec.Devices))
	}
	for _, id := range slices.Sorted(maps.Keys(adopted)) {
		r.goOn(adopted[id], Proc{adopted[id].PID, adopted[id].PIDStart})
	}
}

// goOn takes up lease l, held since before this start by its job's
// processes; extern is the extern step the record names.
func (r *Room) goOn(l *lease.Lease, extern Proc) {
	j := &job{id: l.SlurmJob, uid: l.UID, user: l.User, devices: slices.Clone(l.Devices), state: held, l: l, extern: extern,
		ready: make(chan struct{})}
	close(j.ready)
	r.mu.Lock()
	r.jobs[j.id] = j
	r.mu.Unlock()
	if err := r.save(j); err != nil {
		r.log.Printf("job %d: %v", j.id, err)
	}
	r.log.Printf("job %d of %s: its lease of %s from before this start goes on", j.id, j.user, r.vendor.Format(j.devices))
}

// relock locks again the devices of rec, a job the earlier broker held
// the lease of alone.
func (r *Room) relock(rec *record) error {
	j := &job{id: rec.Job, uid: rec.UID, user: rec.User, devices: slices.Clone(rec.Devices), state: told, ready: make(chan struct{})}
	close(j.ready)
	w := &lease.Waiter{Holder: lease.Holder{Kind: lease.Slurm, UID: j.uid, User: j.user, SlurmJob: j.id}, N: len(j.devices), Cand: j.devices, Exact: true, Queued: time.UnixMilli(rec.Since)}
	h, err := r.table.Claim(w, j.devices)
	var busy *lease.Busy
	if errors.As(err, &busy) {
		return fmt.Errorf("%w: held by another lease", err)
	}
	if err != nil {
		return err
	}
	if err := r.table.Allow(h); err != nil {
		r.table.Return(h)
		return err
	}
	l := r.owner.Begin(h)
	r.mu.Lock()
	j.l, j.fds = l, h.FDs()
	r.jobs[j.id] = j
	r.mu.Unlock()
	return r.save(j)
}
