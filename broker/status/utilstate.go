package status

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/atomicfile"
)

// The leases' utilization figures across a broker restart (issue 29).
// After each sample (and the [idle] judgement that follows it) the ledger
// writes what it keeps of every lease held — the sum and count of its
// known samples (its held mean), its idle time, the start of its idle run
// and what the [idle] policy said of that run — to one small file in the
// state directory, util.json, whole (internal/atomicfile), holding no
// lock. At start, Open reads it back for the leases adopted, and only
// for those: a record of a lease that ended meanwhile, or that this
// start did not take up, is dropped.
//
// The state directory and not the accounting log: the figures are a
// state, replaced at every sample, not a history; the accounting log is
// append-only and rotated, may be anywhere ([usage] log), leaves out the
// leases past their user's logging rate, and a line per lease per sample
// would grow it without bound. It has each lease's figures at its end.
//
// What a kill -9 loses: nothing changes between two samples, so at most
// the samples since the last write: the last one, where the broker was
// killed while writing it. A SIGTERM loses the same.
//
// The time the broker was down: an idle run goes on through it only where
// the last sample before it and the first after it both found the lease
// idle, as between any two samples; a first sample that finds it busy or
// unknown ends the run (and what was said of it) as it would have. Until
// that first sample the lease shows its mean, and no idle mark. A run
// whose holders were not warned before the restart may have passed
// [idle] after meanwhile: it is warned at that first sample, and
// reclaimed no sooner than warn_before later (idle.go), never unwarned.

// utilStateName is the file's name in the state directory.
const utilStateName = "util.json"

// maxUtilState bounds the file read back, and written: a record is about
// 200 bytes, one per lease held.
const maxUtilState = 1 << 20

// errUtilState is a file that cannot be read as one.
var errUtilState = errors.New("utilization state")

// utilStateFile is the file's content.
type utilStateFile struct {
	V      int          `json:"v"`
	At     int64        `json:"at_ms"` // when it was written
	Leases []utilRecord `json:"leases"`
}

// utilRecord is what the file keeps of one lease held.
type utilRecord struct {
	Lease     uint64  `json:"lease"`
	Since     int64   `json:"since_ms"` // the lease's start, against a lease id taken again
	Sum       float64 `json:"sum"`      // of its known samples' means
	N         int     `json:"n"`        // its known samples
	IdleMS    int64   `json:"idle_ms"`  // its idle time, for usage
	IdleSince int64   `json:"idle_since_ms,omitempty"`
	LastMS    int64   `json:"last_ms,omitempty"` // its last sample
	Warned    bool    `json:"warned,omitempty"`
	Reported  bool    `json:"reported,omitempty"`
	LateMS    int64   `json:"late_ms,omitempty"` // warned after a restart: not reclaimed before (idleState.late)
}

// utilStatePath is the file's path; "" without a state directory.
func utilStatePath(stateDir string) string {
	if stateDir == "" {
		return ""
	}
	return filepath.Join(stateDir, utilStateName)
}

// readUtilState reads the file at path: none if it does not exist; an
// error for a file that cannot be read as one (a link, larger than
// maxUtilState, not its JSON, another version).
func readUtilState(path string) ([]utilRecord, error) {
	var sf utilStateFile
	found, err := atomicfile.ReadJSON(path, maxUtilState, &sf)
	if errors.Is(err, unix.ENOTDIR) || (err == nil && !found) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w %w", errUtilState, err)
	}
	if sf.V != 1 {
		return nil, fmt.Errorf("%w %s: version %d, this broker reads version 1", errUtilState, path, sf.V)
	}
	return sf.Leases, nil
}

// encodeUtilState is the file's content for recs, written at at.
func encodeUtilState(at time.Time, recs []utilRecord) []byte {
	if recs == nil {
		recs = []utilRecord{}
	}
	data, _ := json.Marshal(utilStateFile{V: 1, At: at.UnixMilli(), Leases: recs})
	return append(data, '\n')
}

// utilRecordsLocked is what the file keeps of the leases held: those a
// sample has said something of.
func (g *Ledger) utilRecordsLocked() []utilRecord {
	var out []utilRecord
	for _, e := range g.leasesHeldLocked() {
		u := e.util
		if u == nil || (u.n == 0 && u.idleSince.IsZero()) {
			continue
		}
		r := utilRecord{Lease: e.ID, Since: e.Since.UnixMilli(), Sum: u.sum, N: u.n, IdleMS: u.idleTotal.Milliseconds(),
			Warned: u.idle.warned, Reported: u.idle.reported}
		if !u.idleSince.IsZero() {
			r.IdleSince = u.idleSince.UnixMilli()
		}
		if !u.lastAt.IsZero() {
			r.LastMS = u.lastAt.UnixMilli()
		}
		if !u.idle.late.IsZero() {
			r.LateMS = u.idle.late.UnixMilli()
		}
		out = append(out, r)
	}
	return out
}

// saveUtil writes the leases' figures to the file, unless they are what
// it holds already: called by the sampling alone, after each sample,
// holding no lock. A file it cannot write is logged (at a bounded rate);
// one that would be too large is removed rather than left stale.
func (g *Ledger) saveUtil(at time.Time) {
	if g.utilPath == "" {
		return
	}
	g.mu.Lock()
	recs := g.utilRecordsLocked()
	g.unlock()
	// The time written is left out of the comparison: an unchanged
	// state is not written again.
	data := encodeUtilState(time.Time{}, recs)
	if bytes.Equal(data, g.utilSaved) {
		return
	}
	out := encodeUtilState(at, recs)
	if len(out) > maxUtilState {
		os.Remove(g.utilPath)
		g.repeat("utilization state %s: %d leases make it larger than %d bytes: not kept across a restart", g.utilPath, len(recs), maxUtilState)
		g.utilSaved = nil
		return
	}
	if err := atomicfile.Write(g.utilPath, out, 0o600); err != nil {
		g.repeat("utilization state: %v: the leases' figures are not kept across a restart", err)
		g.utilSaved = nil
		return
	}
	g.utilSaved = data
}

// restoreUtil takes up, at start, the figures the file at path kept of
// the leases adopted (before the first sample). A file that cannot be
// read is logged and left: the leases' figures start again.
func (g *Ledger) restoreUtil(path string) {
	if path == "" {
		return
	}
	recs, err := readUtilState(path)
	if err != nil {
		g.log.Printf("%v; the figures of the leases from before this start count again from its first sample", err)
		return
	}
	byID := make(map[uint64]utilRecord, len(recs))
	for _, r := range recs {
		byID[r.Lease] = r
	}
	kept := 0
	g.mu.Lock()
	for _, e := range g.leasesHeldLocked() {
		r, ok := byID[e.ID]
		if !ok || !e.Adopted || r.Since != e.Since.UnixMilli() || r.N < 0 || r.Sum < 0 || r.IdleMS < 0 {
			continue
		}
		u := &leaseUtil{sum: r.Sum, n: r.N, idleTotal: time.Duration(r.IdleMS) * time.Millisecond, resumed: true}
		if r.LastMS > 0 {
			u.lastAt = time.UnixMilli(r.LastMS)
		}
		if r.IdleSince > 0 {
			u.idleSince = time.UnixMilli(r.IdleSince)
			u.idle.warned, u.idle.reported = r.Warned, r.Reported
			// Not warned before: it may have passed after while the
			// broker was down, and is warned before it is reclaimed.
			u.idle.unwarned = !r.Warned
			if r.LateMS > 0 {
				u.idle.late = time.UnixMilli(r.LateMS)
			}
		}
		e.util = u
		kept++
	}
	g.unlock()
	if kept > 0 {
		g.log.Printf("utilization: the figures of %d lease(s) from before this start go on", kept)
	}
}
