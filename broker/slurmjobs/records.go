package slurmjobs

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
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
func (rec *record) files() []lease.FileID {
	out := make([]lease.FileID, len(rec.Inodes))
	for i, ino := range rec.Inodes {
		out[i] = lease.FileID{Dev: rec.FSDev, Ino: ino}
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

// records is the directory of the jobs' records.
type records struct {
	dir  string
	max  int
	mu   sync.Mutex // one writer at a time; a record is written only while its job is known (Room.save)
	read []*record  // what an earlier broker left, until Resume
}

// openRecords makes STATE/slurm/jobs if need be, and reads the records
// an earlier broker left: at most max (more are a directory not the
// broker's own, and are left out, said in the error).
func openRecords(state string, devices int) (*records, error) {
	if state == "" {
		return nil, errors.New("slurmjobs: no state directory")
	}
	dir := filepath.Join(state, "slurm", "jobs")
	if err := owndir.Make(filepath.Join(state, "slurm"), 0o700); err != nil {
		return nil, err
	}
	if err := owndir.Make(dir, 0o700); err != nil {
		return nil, err
	}
	rs := &records{dir: dir, max: 4*devices + 16}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			os.Remove(filepath.Join(dir, name)) // a write cut short
			continue
		}
		id, err := strconv.ParseUint(name, 10, 32)
		if err != nil || !e.Type().IsRegular() {
			continue
		}
		if len(rs.read) == rs.max {
			return rs, fmt.Errorf("%s: more than %d records: the others are left out", dir, rs.max)
		}
		rec, err := readRecord(filepath.Join(dir, name))
		if err != nil || rec.Job != uint32(id) || len(rec.Inodes) != len(rec.Devices) {
			os.Remove(filepath.Join(dir, name))
			continue
		}
		rs.read = append(rs.read, rec)
	}
	return rs, nil
}

func readRecord(path string) (*record, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	buf := make([]byte, maxRecord+1)
	n, _ := f.Read(buf)
	if n > maxRecord {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxRecord)
	}
	rec := new(record)
	if err := json.Unmarshal(buf[:n], rec); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rec, nil
}

func (rs *records) path(id uint32) string {
	return filepath.Join(rs.dir, strconv.FormatUint(uint64(id), 10))
}

// write writes rec durably, under rs.mu.
func (rs *records) write(rec *record) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	path := rs.path(rec.Job)
	tmp := filepath.Join(rs.dir, "."+filepath.Base(path)+".new")
	os.Remove(tmp)
	fd, err := unix.Open(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("write job record %s: %w", tmp, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.Write(append(data, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write job record %s: %w", path, err)
	}
	return syncDir(rs.dir)
}

// remove removes job id's record, under rs.mu.
func (rs *records) remove(id uint32) error {
	if err := os.Remove(rs.path(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove job record: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// Adoptable returns the leases of the records whose lock files are held
// now (held: device id -> its held lock file), for the broker to adopt
// (lease.Table.Adopt) as the job's lease; a record's lease is adoptable
// only where every device of it is held on the file it names. poolOf
// names a device's pool.
func (r *Room) Adoptable(held map[int]lease.FileID, poolOf func(int) string) []*lease.Lease {
	var out []*lease.Lease
	for _, rec := range r.rec.read {
		files, all := rec.files(), true
		for i, id := range rec.Devices {
			all = all && held[id] == files[i] && files[i] != (lease.FileID{})
		}
		if all && len(rec.Devices) > 0 {
			out = append(out, rec.lease(poolOf(rec.Devices[0]), r.table.NewID))
		}
	}
	return out
}
