package slurmjobs

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/internal/atomicfile"
	"github.com/npurun/npurun/internal/fileid"
	"github.com/npurun/npurun/internal/owndir"
)

// The jobs' records: one small file per job whose lease the broker knows,
// STATE/slurm/jobs/ID, written whole (a temporary file, fsync, rename,
// fsync of the directory) before the Prolog is answered and again once
// the extern step holds the lease, removed when the lease ends. A broker
// started later reads them: a job whose lock files are still held goes
// on (its holders are the job's processes), one the earlier broker held
// alone (told) is locked again (its copy died with that broker, and Slurm
// gave the job the devices), and one that was held and is free now ended
// meanwhile.

// record is a job's lease on disk.
type record struct {
	Job     uint32   `json:"job"`
	UID     uint32   `json:"uid"`
	User    string   `json:"user"`
	Devices []int    `json:"devices"`
	Lease   uint64   `json:"lease"`
	Since   int64    `json:"since"` // Unix ms
	FSDev   uint64   `json:"fsdev"`
	Inodes  []uint64 `json:"inodes"` // the lock files, in the order of Devices
	State   state    `json:"state"`
	Extern  int      `json:"extern,omitempty"`
	Start   uint64   `json:"extern_start,omitempty"`
}

// record is j's record, under Room.mu.
func (j *job) record() *record {
	rec := &record{Job: j.id, UID: j.uid, User: j.user, Devices: j.devices, State: j.state, Extern: j.extern.PID, Start: j.extern.Start,
		Since: j.since.UnixMilli()}
	files := j.files
	if l := j.l; l != nil {
		rec.Lease, rec.Since, files = l.ID, l.Since.UnixMilli(), l.Files
	}
	for _, f := range files {
		rec.FSDev = f.Dev
		rec.Inodes = append(rec.Inodes, f.Ino)
	}
	return rec
}

// files are the lock files rec names, in the order of its devices.
func (rec *record) files() []fileid.ID {
	out := make([]fileid.ID, len(rec.Inodes))
	for i, ino := range rec.Inodes {
		out[i] = fileid.ID{Dev: rec.FSDev, Ino: ino}
	}
	return out
}

// lease is the lease rec records, as a broker started later adopts it
// (id, where the record has none: its broker was killed as it began).
func (rec *record) lease(pool string, id func() uint64) *lease.Lease {
	if rec.Lease == 0 {
		rec.Lease = id()
	}
	return &lease.Lease{ID: rec.Lease, Pool: pool, Since: time.UnixMilli(rec.Since), Adopted: true, Devices: slices.Clone(rec.Devices), Files: rec.files(),
		Holder: lease.Holder{Kind: lease.Slurm, UID: rec.UID, User: rec.User, SlurmJob: rec.Job, PID: rec.Extern, PIDStart: rec.Start}}
}

// maxRecord bounds a record's size read back.
const maxRecord = 16 << 10

// placeholderRecord is a placeholder allocation on disk (allocate
// mode): STATE/slurm/placeholders/ID, written once sbatch answered,
// removed once the broker is done with it. A broker started later cancels
// those whose request it cannot know (an npurun's, a login's: they ask
// again as new requests; a task's queues again with a new one), and
// follows those whose lease goes on.
type placeholderRecord struct {
	Job  uint32 `json:"job"`
	UID  uint32 `json:"uid"`
	User string `json:"user"`
	Kind string `json:"kind"`
	Task uint64 `json:"task,omitempty"`
}

// records is the directory of the jobs' records.
type records struct {
	dir  string
	pdir string // the placeholders'
	max  int
	mu   sync.Mutex // one writer at a time; a record is written only while its job is known (Room.save)
	read []*record  // what an earlier broker left, until Resume
	// the placeholders an earlier broker left, until Resume
	placeholders []*placeholderRecord
}

// openRecords makes STATE/slurm/jobs if need be, and reads the records
// an earlier broker left: at most max (more are a directory not the
// broker's own, and are left out, said in the error).
func openRecords(state string, devices int) (*records, error) {
	if state == "" {
		return nil, errors.New("slurmjobs: no state directory")
	}
	rs := &records{dir: filepath.Join(state, "slurm", "jobs"), pdir: filepath.Join(state, "slurm", "placeholders"), max: 4*devices + 16}
	for _, dir := range []string{filepath.Join(state, "slurm"), rs.dir, rs.pdir} {
		if err := owndir.Make(dir, 0o700); err != nil {
			return nil, err
		}
	}
	err := readRecords(rs.dir, rs.max, func(id uint32, path string) bool {
		rec := new(record)
		if readRecord(path, rec) != nil || rec.Job != id || len(rec.Inodes) != len(rec.Devices) {
			return false
		}
		rs.read = append(rs.read, rec)
		return true
	})
	if err != nil {
		return rs, err
	}
	err = readRecords(rs.pdir, MaxPlaceholders, func(id uint32, path string) bool {
		rec := new(placeholderRecord)
		if readRecord(path, rec) != nil || rec.Job != id {
			return false
		}
		rs.placeholders = append(rs.placeholders, rec)
		return true
	})
	return rs, err
}

// readRecords calls take with each record of dir, at most max; a record
// take refuses is removed.
func readRecords(dir string, max int, take func(id uint32, path string) bool) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	n := 0
	for _, e := range entries {
		name := e.Name()
		path := filepath.Join(dir, name)
		if strings.HasPrefix(name, ".") {
			os.Remove(path) // a write cut short
			continue
		}
		id, err := strconv.ParseUint(name, 10, 32)
		if err != nil || !e.Type().IsRegular() {
			continue
		}
		if n == max {
			return fmt.Errorf("%s: more than %d records: the others are left out", dir, max)
		}
		if !take(uint32(id), path) {
			os.Remove(path)
			continue
		}
		n++
	}
	return nil
}

func readRecord(path string, rec any) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	buf := make([]byte, maxRecord+1)
	n, _ := io.ReadFull(f, buf)
	if n > maxRecord {
		return fmt.Errorf("%s: larger than %d bytes", path, maxRecord)
	}
	if err := json.Unmarshal(buf[:n], rec); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func recordPath(dir string, id uint32) string {
	return filepath.Join(dir, strconv.FormatUint(uint64(id), 10))
}

// write writes rec durably, under rs.mu.
func (rs *records) write(rec *record) error {
	return writeRecord(rs.dir, rec.Job, rec)
}

// writePlaceholder writes placeholder job id of w durably.
func (rs *records) writePlaceholder(id uint32, w *lease.Waiter) error {
	return writeRecord(rs.pdir, id, &placeholderRecord{Job: id, UID: w.UID, User: w.User, Kind: string(w.Kind), Task: w.Task})
}

// removePlaceholder removes placeholder job id's record.
func (rs *records) removePlaceholder(id uint32) {
	os.Remove(recordPath(rs.pdir, id))
}

// writeRecord writes rec as record id of dir, durably: a temporary file,
// fsync, rename, fsync of the directory.
func writeRecord(dir string, id uint32, rec any) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(recordPath(dir, id), append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("job record: %w", err)
	}
	return nil
}

// remove removes job id's record, under rs.mu.
func (rs *records) remove(id uint32) error {
	if err := os.Remove(recordPath(rs.dir, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove job record: %w", err)
	}
	return nil
}

// Adoptable returns the leases of the records whose lock files are held
// now (held: device id -> its held lock file), for the broker to adopt
// (lease.Table.Adopt) as the job's lease; a record's lease is adoptable
// only where every device of it is held on the file it names. poolOf
// names a device's pool.
func (r *Room) Adoptable(held map[int]fileid.ID, poolOf func(int) string) []*lease.Lease {
	var out []*lease.Lease
	for _, rec := range r.rec.read {
		files, all := rec.files(), true
		for i, id := range rec.Devices {
			all = all && held[id] == files[i] && files[i] != (fileid.ID{})
		}
		if all && len(rec.Devices) > 0 {
			out = append(out, rec.lease(poolOf(rec.Devices[0]), r.table.NewID))
		}
	}
	return out
}
