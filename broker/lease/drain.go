package lease

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/refusal"
	"github.com/npurun/npurun/internal/atomicfile"
)

// A drained device is taken out of the line's service by an
// administrator (npubroker drain): no new lease is granted on it, while
// the lease that holds it, if one does, runs on to its end. It is neither
// free for Plan nor leased: Snapshot shows it Drained, with its Drain. A
// drain lasts until Undrain, across restarts: the drained devices are
// kept in a small file of the state directory (Config.DrainFile),
// written whole (a temporary file, fsync'd, renamed over the old one, the
// directory fsync'd) on each change, outside the table's lock, and read by
// Open.

// Drain is why a device is drained, by whom, since when.
type Drain struct {
	By     string    // who drained it (the account's name)
	Reason string    // what they said
	Since  time.Time // when
}

// MaxDrainReason is the longest reason a drain keeps, in bytes.
const MaxDrainReason = 512

// ErrDrainFile is a drain file that cannot be read as one.
var ErrDrainFile = errors.New("drain file")

// drainRecord is one drained device in the drain file.
type drainRecord struct {
	ID      int    `json:"id"`
	By      string `json:"by"`
	Reason  string `json:"reason"`
	SinceMS int64  `json:"since_ms"`
}

// drainFile is the drain file's content.
type drainFile struct {
	V       int           `json:"v"`
	Drained []drainRecord `json:"drained"`
}

// maxDrainFile is the largest drain file read.
const maxDrainFile = 1 << 20

// readDrains reads the drain file at path: none if it does not exist, or
// its directory is not one (a line in the log says so: the broker serves
// leases without its state directory). A file that cannot be read, or
// read as one, is an error.
// Devices it names that are not managed here are left out, with a line in
// the log.
func (t *Table) readDrains(path string) (map[int]Drain, error) {
	if path == "" {
		return nil, nil
	}
	var df drainFile
	found, err := atomicfile.ReadJSON(path, maxDrainFile, &df)
	switch {
	case errors.Is(err, unix.ENOTDIR):
		// The state directory cannot be had now (it is a file): as the
		// task journal, it does not keep leases from being served.
		t.log.Printf("drain file %v: no device is drained; drain again once the state directory is back", err)
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("%w %w", ErrDrainFile, err)
	case !found:
		return nil, nil
	}
	if df.V != 1 {
		return nil, fmt.Errorf("%w %s: version %d, this broker reads version 1", ErrDrainFile, path, df.V)
	}
	out := map[int]Drain{}
	for _, r := range df.Drained {
		if r.ID < 0 || r.ID >= len(t.devs) || t.devs[r.ID] == nil {
			t.log.Printf("%s: npu %d is drained there but not managed by this broker; left out", path, r.ID)
			continue
		}
		if _, dup := out[r.ID]; dup {
			return nil, fmt.Errorf("%w %s: npu %d named twice", ErrDrainFile, path, r.ID)
		}
		out[r.ID] = Drain{By: r.By, Reason: r.Reason, Since: time.UnixMilli(r.SinceMS)}
	}
	return out, nil
}

// writeDrains writes drains to the drain file, atomically: a reader (the
// next start, after a crash at any moment) sees the old file or the new.
func writeDrains(path string, drains map[int]Drain) error {
	df := drainFile{V: 1, Drained: []drainRecord{}}
	for id, d := range drains {
		df.Drained = append(df.Drained, drainRecord{ID: id, By: d.By, Reason: d.Reason, SinceMS: d.Since.UnixMilli()})
	}
	sort.Slice(df.Drained, func(i, j int) bool { return df.Drained[i].ID < df.Drained[j].ID })
	data, err := json.MarshalIndent(df, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(path, append(data, '\n'), 0o644)
}

// Drain drains device id (or changes the reason of a drain): no new lease
// is granted on it from now on, and the lease that holds it runs on. The
// drain is written to the drain file before it takes effect: an error
// leaves the device as it was. It returns the drain in force.
func (t *Table) Drain(id int, d Drain) (Drain, error) {
	if id < 0 || id >= len(t.devs) || t.devs[id] == nil {
		return Drain{}, refusal.New(ErrNoDevice, "this broker manages "+t.vendor.Format(t.ids), "no %s here", t.vendor.Format([]int{id}))
	}
	if len(d.Reason) > MaxDrainReason {
		return Drain{}, refusal.New(ErrBadRequest, "", "a drain's reason is at most %d bytes, got %d", MaxDrainReason, len(d.Reason))
	}
	if i := strings.IndexFunc(d.Reason, func(r rune) bool { return r < 0x20 || r == 0x7f }); i >= 0 {
		return Drain{}, refusal.New(ErrBadRequest, "", "a drain's reason is one line of text: a control character at byte %d", i)
	}
	in, _, err := t.changeDrain(id, &d)
	return in, err
}

// Undrain puts drained device id back in service, and tells whether it
// was drained. The owner hears of it (Owner.Freed) where the device is
// free, to serve its line.
func (t *Table) Undrain(id int) (bool, error) {
	if id < 0 || id >= len(t.devs) || t.devs[id] == nil {
		return false, refusal.New(ErrNoDevice, "this broker manages "+t.vendor.Format(t.ids), "no %s here", t.vendor.Format([]int{id}))
	}
	_, was, err := t.changeDrain(id, nil)
	if err != nil || !was {
		return false, err
	}
	t.owner.Freed()
	return true, nil
}

// changeDrain sets device id's drain to d (nil: undrained): it writes
// the drain file, then the table. drainMu orders the changes: the file
// always says what the table does. was tells whether the device was
// drained before.
func (t *Table) changeDrain(id int, d *Drain) (in Drain, was bool, err error) {
	t.drainMu.Lock()
	defer t.drainMu.Unlock()
	t.mu.Lock()
	all := t.drainsLocked()
	t.mu.Unlock()
	old, was := all[id]
	if d == nil && !was {
		return Drain{}, false, nil
	}
	if d != nil {
		if was && d.Reason == "" {
			d.Reason = old.Reason // drained again without a reason: the first one stands
		}
		all[id] = *d
	} else {
		delete(all, id)
	}
	if t.drainFile != "" {
		if err := writeDrains(t.drainFile, all); err != nil {
			return Drain{}, was, err
		}
	}
	t.mu.Lock()
	if d != nil {
		t.devs[id].drain = d
	} else {
		t.devs[id].drain = nil
	}
	t.mu.Unlock()
	if d == nil {
		return Drain{}, was, nil
	}
	return *d, was, nil
}

// drainsLocked copies the drains in force.
func (t *Table) drainsLocked() map[int]Drain {
	all := map[int]Drain{}
	for _, id := range t.ids {
		if d := t.devs[id].drain; d != nil {
			all[id] = *d
		}
	}
	return all
}

// Drains returns the drained devices, with why.
func (t *Table) Drains() map[int]Drain {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.drainsLocked()
}

// drainedLocked tells, by id, which devices are drained; nil if none is.
func (t *Table) drainedLocked() []bool {
	var out []bool
	for _, id := range t.ids {
		if t.devs[id].drain != nil {
			if out == nil {
				out = make([]bool, len(t.devs))
			}
			out[id] = true
		}
	}
	return out
}

// drainedReasonLocked says why w waits for drained devices, if it must:
// when the devices it may take that are not drained are fewer than it
// wants, it names the drained ones, who drained them, since when and
// why.
func (t *Table) drainedReasonLocked(w *Waiter) string {
	if !w.drainBlocked(t.drainedLocked()) {
		return ""
	}
	var drained []int
	for _, id := range w.Cand {
		if d := t.devs[id]; d != nil && d.drain != nil {
			drained = append(drained, id)
		}
	}
	var b strings.Builder
	for i, id := range drained {
		if i > 0 {
			b.WriteString("; ")
		}
		d := t.devs[id].drain
		fmt.Fprintf(&b, "%s drained by %s since %s", t.vendor.Noun()+fmt.Sprint(id), d.By, d.Since.Format("2006-01-02 15:04"))
		if d.Reason != "" {
			b.WriteString(": " + d.Reason)
		}
	}
	return b.String()
}
