package lease

import (
	"slices"

	"github.com/npurun/npurun/internal/fileid"
)

// Holding is a device a lease holds still, on lock file File.
type Holding struct {
	Lease  *Lease
	Device int
	File   fileid.ID
}

// OfTask returns the devices that the leases of task id (Kind Task) hold
// still, in device order: a task's end ends its lease, whoever holds its
// descriptors then.
func (t *Table) OfTask(id uint64) []Holding {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Holding
	for _, d := range t.devs {
		if d == nil {
			continue
		}
		for _, l := range d.leases {
			if l.Kind != Task || l.Task != id {
				continue
			}
			if f, ok := l.FileOf(d.id); ok {
				out = append(out, Holding{Lease: l, Device: d.id, File: f})
			}
		}
	}
	return out
}

// HeldBy returns the devices lease l holds still, in its order: a lease
// whose holder has ended (a Slurm job's Epilog) is ended so, whoever
// holds its descriptors then.
func (t *Table) HeldBy(l *Lease) []Holding {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Holding
	for _, id := range l.Devices {
		if id < 0 || id >= len(t.devs) || t.devs[id] == nil || !slices.Contains(t.devs[id].leases, l) {
			continue
		}
		if f, ok := l.FileOf(id); ok {
			out = append(out, Holding{Lease: l, Device: id, File: f})
		}
	}
	return out
}

// Holds tells whether lease l holds device id still: the table records it
// held, and its watcher has not seen its lock go (Ended).
func (t *Table) Holds(l *Lease, id int) bool {
	if id < 0 || id >= len(t.devs) || t.devs[id] == nil {
		return false
	}
	t.mu.Lock()
	held := slices.Contains(t.devs[id].leases, l)
	t.mu.Unlock()
	f, ok := l.FileOf(id)
	return held && ok && !t.Ended(id, f)
}
