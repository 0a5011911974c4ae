package status

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/wire"
)

// The accounting log is an append-only file of lease starts and ends, one
// JSON object a line: usage.log in the state directory unless [usage] log
// names another file. A start names the lease's user, kind, pool, devices
// and the inodes of their lock files; an end names one device of a lease
// and how it ended. A lease that is still held at a broker's start is
// known by its lock files' inodes (a lock file serves one lease) and goes
// on; one whose devices are free by then is closed with the time it was
// found gone. When the file reaches its size it becomes usage.log.1 (the
// older ones move up, the oldest beyond [usage] keep is dropped), and the
// fresh file starts with an "open" copy of every lease still held, so the
// newest file alone tells which leases are open.
//
// Writing never holds up a lease: records go through a bounded queue to a
// writer of their own, without fsync (a broker killed with -9 loses
// nothing the kernel was given). Records that cannot be written (a full
// disk, a full queue) are dropped, counted and said so in the broker's
// log, and npubroker usage reports the count.

// usageName is the log's file name in the state directory.
const usageName = "usage.log"

// usageQueue bounds the records waiting for the writer.
const usageQueue = 4096

// maxUsageLine bounds one line read back; longer ones are skipped.
const maxUsageLine = 64 << 10

// How a device's lease ended.
const (
	endReleased = "released"      // its last holder closed the lock or exited
	endGone     = "gone-at-start" // ended while the broker was down; closed when found
	// endReclaimed: the [idle] policy ended it (idle.go); its holders
	// were signalled, or a login's let go of it
	endReclaimed = "reclaimed"
)

// holder is the holder of the lease that start record r names, as a
// broker started after it takes the lease up.
func (r *usageRec) holder() lease.Holder {
	return lease.Holder{Kind: lease.Kind(r.Kind), UID: r.UID, User: r.User, PID: r.PID, PIDStart: r.PIDStart, Task: r.Task,
		Service: r.Service, TTY: r.TTY, RHost: r.RHost, Claimed: r.Claimed, SlurmJob: r.SlurmJob, Container: r.Container,
		Limit: time.Duration(r.LimitMS) * time.Millisecond}
}

// usageRec is one line of the accounting log.
type usageRec struct {
	T     int64  `json:"t"`     // Unix ms: a start's (and open's) start, an end's end
	Ev    string `json:"ev"`    // "start", "open" (a start carried into a fresh file), "end", "kind"
	Lease uint64 `json:"lease"` // unique in the log

	// start, open
	Kind     string   `json:"kind,omitempty"`
	User     string   `json:"user,omitempty"`
	UID      uint32   `json:"uid"`
	Pool     string   `json:"pool,omitempty"`
	Devices  []int    `json:"devices,omitempty"`
	FSDev    uint64   `json:"fsdev,omitempty"`  // the lock files' file system
	Inodes   []uint64 `json:"inodes,omitempty"` // the lock files' inodes, in the order of Devices
	Task     uint64   `json:"task,omitempty"`
	PID      int      `json:"pid,omitempty"`
	PIDStart uint64   `json:"pid_start,omitempty"`
	Service  string   `json:"service,omitempty"`
	TTY      string   `json:"tty,omitempty"`
	RHost    string   `json:"rhost,omitempty"`
	Claimed  bool     `json:"claimed,omitempty"` // service, tty and rhost are the user's own claim (a session request not made by root)
	SlurmJob uint32   `json:"slurm_job,omitempty"`
	WaitedMS int64    `json:"waited_ms,omitempty"`
	Found    bool     `json:"found,omitempty"` // found held at a broker's start with no record: T is when found
	// A share's (npurun --mem): the memory it declared, in MiB, and the
	// fraction of each device it weighs in device-hours (its declaration
	// over what the device's shares may declare together).
	Mem   int64   `json:"mem,omitempty"`
	Share float64 `json:"share,omitempty"`
	// Backfilled ([scheduling] backfill): it started ahead of a request
	// that had reserved some of its devices, and its limit ends it before
	// that one's estimated start.
	Backfill *wire.Backfill `json:"backfill,omitempty"`
	// LimitMS: its holder's limit (npurun --time and [tasks] kill_grace),
	// which a broker started after takes up with the lease
	LimitMS int64 `json:"limit_ms,omitempty"`

	// start, open, kind ("kind": the lease is a container's from T on,
	// Kind and Container its new kind and container)
	Container *wire.ContainerRef `json:"container,omitempty"`

	// end
	Device *int   `json:"device,omitempty"`
	How    string `json:"how,omitempty"`
	DurMS  int64  `json:"dur_ms,omitempty"`
	Peak   int64  `json:"peak,omitempty"` // a share's: the most device memory its processes were seen to use, MiB
	// The lease's utilization, where sampled ([status] util_interval):
	// the mean of its known samples since its start (or the broker's
	// start: the figures are the broker's memory), and its idle time,
	// the time between samples that both found it idle ([idle] below).
	Util   *float64 `json:"util,omitempty"`
	IdleMS int64    `json:"idle_ms,omitempty"`

	// sum (Lease 0; Kind, User, UID, Pool as a start's): leases of one
	// user, kind and pool past the user's rate, that ended between From
	// and T, and the device time they took (usagelimit.go)
	From   int64 `json:"from,omitempty"`
	Leases int   `json:"leases,omitempty"`
	DevMS  int64 `json:"dev_ms,omitempty"`
}

// usageLog writes the accounting log.
type usageLog struct {
	path    string
	maxSize int64
	keep    int
	log     *log.Logger
	open    func() []usageRec // "open" records of the leases held now, for a fresh file

	ch      chan usageRec
	flushCh chan chan struct{}
	dropped atomic.Int64

	// readers': what the first and last lines of each rotated file say
	spanMu sync.Mutex
	spans  map[string]spanEntry

	// the writer's own
	f       *os.File
	size    int64
	failing bool // the last write failed: said so once
	torn    bool // a write may have left half a line
	lost    int64
}

// newUsageLog prepares the log at path; the writer starts with run.
func newUsageLog(path string, maxSize int64, keep int, lg *log.Logger, open func() []usageRec) *usageLog {
	return &usageLog{path: path, maxSize: maxSize, keep: keep, log: lg, open: open,
		ch: make(chan usageRec, usageQueue), flushCh: make(chan chan struct{})}
}

// add queues r for writing; it never blocks.
func (u *usageLog) add(r usageRec) {
	select {
	case u.ch <- r:
	default:
		if u.dropped.Add(1) == 1 {
			u.log.Printf("usage log %s: more than %d records waiting to be written; dropping records", u.path, usageQueue)
		}
	}
}

// flush waits up to timeout for the records queued so far to be written.
func (u *usageLog) flush(timeout time.Duration) {
	done := make(chan struct{})
	select {
	case u.flushCh <- done:
	case <-time.After(timeout):
		return
	}
	select {
	case <-done:
	case <-time.After(timeout):
	}
}

// run is the writer, for the broker's life.
func (u *usageLog) run() {
	var buf []byte
	var batch []usageRec
	for {
		var flushed chan struct{}
		select {
		case r := <-u.ch:
			batch = append(batch[:0], r)
		case flushed = <-u.flushCh:
			batch = batch[:0]
		}
	drain:
		for len(batch) < 512 {
			select {
			case r := <-u.ch:
				batch = append(batch, r)
			default:
				break drain
			}
		}
		buf = buf[:0]
		n := int64(0)
		for i := range batch {
			b, err := json.Marshal(&batch[i])
			if err != nil {
				continue
			}
			if u.ensureOpen() == nil && u.size+int64(len(buf)+len(b)) >= u.maxSize && u.size+int64(len(buf)) > 0 {
				u.write(buf, n)
				buf, n = buf[:0], 0
				if err := u.rotate(); err != nil {
					u.log.Printf("usage log %s: rotate: %v; writing on past its size", u.path, err)
				}
			}
			buf = append(append(buf, b...), '\n')
			n++
		}
		if n > 0 {
			u.write(buf, n)
		}
		if flushed != nil {
			close(flushed)
		}
	}
}

// write appends buf (n records). A failure drops the records and is said
// once.
func (u *usageLog) write(buf []byte, n int64) {
	if len(buf) == 0 {
		return
	}
	err := u.ensureOpen()
	if err == nil {
		if u.torn {
			buf = append([]byte{'\n'}, buf...)
		}
		var w int
		w, err = u.f.Write(buf)
		u.size += int64(w)
		u.torn = err != nil && w > 0
		if err == nil {
			u.torn = false
		}
	}
	if err != nil {
		u.lost += n
		u.dropped.Add(n)
		if !u.failing {
			u.log.Printf("usage log %s: %v; dropping records until it can be written again (leases are not affected)", u.path, err)
			u.failing = true
		}
		return
	}
	if u.failing {
		u.log.Printf("usage log %s: writing again; %d records were dropped", u.path, u.lost)
		u.failing, u.lost = false, 0
	}
}

func (u *usageLog) ensureOpen() error {
	if u.f != nil {
		return nil
	}
	f, err := openAppend(u.path)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	u.f, u.size = f, st.Size()
	return nil
}

// openAppend opens the log for appending, never through a symbolic link.
func openAppend(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
}

// rotate starts a fresh log: the open leases go to a new file, which is
// renamed into place after the old files move up one.
func (u *usageLog) rotate() error {
	tmp := u.path + ".new"
	os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	var buf []byte
	for _, r := range u.open() {
		b, err := json.Marshal(&r)
		if err == nil {
			buf = append(append(buf, b...), '\n')
		}
	}
	if _, err := f.Write(buf); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	for i := u.keep; i >= 1; i-- {
		from := rotated(u.path, i-1)
		if i == u.keep {
			os.Remove(rotated(u.path, i))
		}
		if err := os.Rename(from, rotated(u.path, i)); err != nil && !errors.Is(err, os.ErrNotExist) {
			f.Close()
			os.Remove(tmp)
			return err
		}
	}
	if err := os.Rename(tmp, u.path); err != nil {
		f.Close()
		return err
	}
	if u.f != nil {
		u.f.Close()
	}
	u.f, u.size, u.torn = f, int64(len(buf)), false
	return nil
}

// rotated is the name of the i-th rotated file: path itself for 0.
func rotated(path string, i int) string {
	if i == 0 {
		return path
	}
	return path + "." + strconv.Itoa(i)
}

// readUsage reads the records of one log file; lines that do not parse (a
// torn write) are skipped. A missing file has none.
func readUsage(path string) ([]usageRec, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, nil // a device such as /dev/full, for tests: nothing to read back
	}
	var recs []usageRec
	r := bufio.NewReaderSize(f, 64<<10)
	for {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			for errors.Is(err, bufio.ErrBufferFull) { // too long: skip it
				_, err = r.ReadSlice('\n')
			}
			continue
		}
		if len(bytes.TrimSpace(line)) > 0 && len(line) <= maxUsageLine {
			var rec usageRec
			if json.Unmarshal(line, &rec) == nil && (rec.Lease != 0 || rec.Ev == "sum") {
				recs = append(recs, rec)
			}
		}
		if err == io.EOF {
			return recs, nil
		}
		if err != nil {
			return recs, fmt.Errorf("read %s: %w", path, err)
		}
	}
}

// openLeases returns the leases that recs start (or carry open) and do not
// end on every device, with the devices they still hold.
func openLeases(recs []usageRec) map[uint64]*openLease {
	open := map[uint64]*openLease{}
	for _, r := range recs {
		switch r.Ev {
		case "start", "open":
			if _, seen := open[r.Lease]; !seen && len(r.Devices) > 0 {
				ol := &openLease{rec: r, held: map[int]bool{}}
				for _, d := range r.Devices {
					ol.held[d] = true
				}
				open[r.Lease] = ol
			}
		case "kind":
			if ol := open[r.Lease]; ol != nil {
				ol.rec.Kind, ol.rec.Container = r.Kind, r.Container
			}
		case "end":
			if ol := open[r.Lease]; ol != nil && r.Device != nil {
				delete(ol.held, *r.Device)
				if len(ol.held) == 0 {
					delete(open, r.Lease)
				}
			}
		}
	}
	return open
}

// openLease is a lease the log shows open.
type openLease struct {
	rec  usageRec
	held map[int]bool // devices not yet ended
}

// sumUsage adds up device time from since to until per user, kind and
// pool (sumUsageBy, by user).
func sumUsage(files [][]usageRec, since, until time.Time, user string, live func(uint64) bool, liveFigs func(uint64) (*float64, int64)) *wire.UsageReport {
	return sumUsageBy(files, since, until, user, "", nil, live, liveFigs)
}

// sumUsageBy adds up device time from since to until per user, kind and
// pool, or with by = wire.UsageByDevice per device (named by name) and
// pool, from the records of the log's files, oldest first. A device of a
// lease with no end counts until until if the lease is live, else not at
// all (its end was lost). Sum records (usagelimit.go) count their leases
// and the part of their device time within since to until; they name no
// device, so by device they make a row of their own with none.
func sumUsageBy(files [][]usageRec, since, until time.Time, user, by string, name func(int) string, live func(uint64) bool, liveFigs func(uint64) (*float64, int64)) *wire.UsageReport {
	byDevice := by == wire.UsageByDevice
	// key is a row's: user, kind and pool, or (by device) the device
	// (-1: none) and pool.
	type key struct {
		user, kind, pool string
		dev              int
	}
	starts := map[uint64]usageRec{}
	var order []uint64
	ends := map[uint64]map[int]int64{}
	endRecs := map[uint64]map[int]usageRec{}
	var sums []usageRec
	rep := &wire.UsageReport{Since: since.UnixMilli(), Until: until.UnixMilli()}
	if byDevice {
		rep.By = wire.UsageByDevice
	}
	for _, recs := range files {
		for _, r := range recs {
			if r.Ev != "open" && (rep.Oldest == 0 || r.T < rep.Oldest) {
				rep.Oldest = r.T
			}
			switch r.Ev {
			case "start", "open":
				if _, seen := starts[r.Lease]; !seen {
					starts[r.Lease] = r
					order = append(order, r.Lease)
				}
			case "end":
				if r.Device != nil {
					if ends[r.Lease] == nil {
						ends[r.Lease] = map[int]int64{}
					}
					ends[r.Lease][*r.Device] = r.T
					if endRecs[r.Lease] == nil {
						endRecs[r.Lease] = map[int]usageRec{}
					}
					endRecs[r.Lease][*r.Device] = r
				}
			case "sum":
				sums = append(sums, r)
			case "kind": // a lease counts under the kind it had last
				if st, ok := starts[r.Lease]; ok {
					st.Kind = r.Kind
					starts[r.Lease] = st
				}
			}
		}
	}
	rows := map[key]*wire.UsageRow{}
	var keys []key
	rowOf := func(k key) *wire.UsageRow {
		row := rows[k]
		if row == nil {
			row = &wire.UsageRow{User: k.user, Kind: k.kind, Pool: k.pool}
			if k.dev >= 0 && name != nil {
				row.Device = name(k.dev)
			}
			rows[k] = row
			keys = append(keys, k)
		}
		return row
	}
	// The utilization's sums, by row: device time weighted by the
	// lease's mean utilization, and the device time of leases sampled.
	type utilSum struct{ busy, sampled float64 }
	utils := map[key]*utilSum{}
	// part is what one device of a lease adds to a row.
	type part struct {
		ms                  int64
		busy, sampled, idle float64
		counted, reclaimed  bool
	}
	add := func(k key, p part) {
		row := rowOf(k)
		row.Leases++
		row.DeviceSeconds += float64(p.ms) / 1000
		row.IdleDeviceHours += p.idle / 3600e3
		if p.reclaimed {
			row.Reclaimed++
		}
		if p.sampled > 0 {
			if utils[k] == nil {
				utils[k] = &utilSum{}
			}
			utils[k].busy += p.busy
			utils[k].sampled += p.sampled
		}
	}
	lo, hi := since.UnixMilli(), until.UnixMilli()
	for _, id := range order {
		st := starts[id]
		if user != "" && st.User != user {
			continue
		}
		parts := make([]part, len(st.Devices))
		for i, d := range st.Devices {
			p := &parts[i]
			end, ok := ends[id][d]
			var util *float64
			var idleMS int64
			if ok {
				er := endRecs[id][d]
				util, idleMS = er.Util, er.IdleMS
				p.reclaimed = er.How == endReclaimed
			} else {
				if !live(id) {
					rep.Incomplete++
					continue
				}
				end = hi
				util, idleMS = liveFigs(id)
			}
			a, b := max(st.T, lo), min(end, hi)
			if b > a {
				p.ms = b - a
				// The lease's figures, in the part of it in the window.
				if util != nil {
					p.busy = float64(b-a) * *util / 100
					p.sampled = float64(b - a)
				}
				if full := end - st.T; full > 0 && idleMS > 0 {
					p.idle = float64(idleMS) * float64(b-a) / float64(full)
				}
			}
			p.counted = end >= lo && st.T <= hi
			if st.Share > 0 && st.Share < 1 {
				// a share weighs its part of the device
				p.ms = int64(float64(p.ms) * st.Share)
				p.busy, p.sampled, p.idle = p.busy*st.Share, p.sampled*st.Share, p.idle*st.Share
			}
		}
		if byDevice {
			for i, d := range st.Devices {
				if parts[i].counted {
					add(key{pool: st.Pool, dev: d}, parts[i])
				}
			}
			continue
		}
		// By user: the lease once, its devices' parts summed.
		var all part
		for _, p := range parts {
			all.ms += p.ms
			all.busy += p.busy
			all.sampled += p.sampled
			all.idle += p.idle
			all.counted = all.counted || p.counted
			all.reclaimed = all.reclaimed || p.reclaimed
		}
		if all.counted {
			add(key{user: st.User, kind: sumKind(st.Kind), pool: st.Pool, dev: -1}, all)
		}
	}
	for _, r := range sums {
		if user != "" && r.User != user {
			continue
		}
		if n, ms := usageSum(r, lo, hi); n > 0 || ms > 0 {
			k := key{user: r.User, kind: sumKind(r.Kind), pool: r.Pool, dev: -1}
			if byDevice {
				k = key{pool: r.Pool, dev: -1}
			}
			row := rowOf(k)
			row.Leases += n
			row.DeviceSeconds += ms / 1000
		}
	}
	slices.SortFunc(keys, func(a, b key) int {
		if byDevice { // in the devices' order, the summed leases last
			if a.dev != b.dev {
				if a.dev < 0 || b.dev < 0 {
					return cmp.Compare(b.dev, a.dev)
				}
				return cmp.Compare(a.dev, b.dev)
			}
			return cmp.Compare(a.pool, b.pool)
		}
		if c := rows[b].DeviceSeconds - rows[a].DeviceSeconds; c != 0 {
			if c > 0 {
				return 1
			}
			return -1
		}
		if a.user != b.user {
			return cmp.Compare(a.user, b.user)
		}
		if a.kind != b.kind {
			return cmp.Compare(a.kind, b.kind)
		}
		return cmp.Compare(a.pool, b.pool)
	})
	rep.Rows = make([]wire.UsageRow, 0, len(keys))
	for _, k := range keys {
		row := rows[k]
		row.DeviceHours = row.DeviceSeconds / 3600
		if u := utils[k]; u != nil {
			b := 100 * u.busy / u.sampled
			row.Busy = &b
			rep.Sampled = true
		}
		rep.Sampled = rep.Sampled || row.Reclaimed > 0 || row.IdleDeviceHours > 0
		rep.Rows = append(rep.Rows, *row)
	}
	return rep
}

// usagePath is the accounting log's path: the configured one, or
// usage.log in the state directory.
func usagePath(configured, stateDir string) string {
	if configured != "" {
		return configured
	}
	return filepath.Join(stateDir, usageName)
}

// readAll reads the log's files, oldest first. cut tells whether records
// older than these were dropped by a rotation: the oldest file kept is
// there, or (keeping none) the current file starts with "open" records.
func (u *usageLog) readAll() (files [][]usageRec, cut bool, err error) {
	files, cut, _, err = u.readSince(time.Time{})
	return files, cut, err
}

// spanSlack is how much older than since a rotated file's newest record
// must be for readSince to leave the file out: records are written in
// the order of their times, give or take a clock's step.
const spanSlack = time.Hour

// readSince is readAll for a sum from since on: a rotated file whose
// newest record is older than that (by spanSlack) adds nothing to the sum
// (the leases still open when it was rotated are carried into the next
// file as "open" records) and is not read, only the first and last lines
// of it, once. oldest is the time of the oldest record of the files, read
// or not ("open" records aside).
func (u *usageLog) readSince(since time.Time) (files [][]usageRec, cut bool, oldest int64, err error) {
	for i := u.keep; i >= 0; i-- {
		path := rotated(u.path, i)
		if i > 0 && !since.IsZero() {
			sp, ok, err := u.spanOf(path)
			if err != nil {
				return nil, false, 0, err
			}
			if ok && sp.last < since.Add(-spanSlack).UnixMilli() {
				if sp.size > 0 {
					if i == u.keep {
						cut = true
					}
					if sp.first != 0 && (oldest == 0 || sp.first < oldest) {
						oldest = sp.first
					}
				}
				continue
			}
		}
		recs, err := readUsage(path)
		if err != nil {
			return nil, false, 0, err
		}
		if len(recs) > 0 {
			if i == u.keep && (i > 0 || recs[0].Ev == "open") {
				cut = true
			}
			for _, r := range recs {
				if r.Ev != "open" && (oldest == 0 || r.T < oldest) {
					oldest = r.T
				}
			}
			files = append(files, recs)
		}
	}
	return files, cut, oldest, nil
}

// span is what the index knows of a rotated file: the times of its oldest
// record ("open" records aside) and its newest, 0 where none was found.
type span struct {
	first, last int64
	size        int64
}

// spanKey names one version of a file: a rotated file does not change,
// and one that does (renamed over) has another inode or size.
type spanKey struct {
	ino, size uint64
	mtime     int64
}

// spanOf returns the span of the rotated file at path, from the index or
// from its first and last lines; ok is false where they do not tell (the
// file must be read). A missing file has an empty span.
func (u *usageLog) spanOf(path string) (sp span, ok bool, err error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return span{}, true, nil
	}
	if err != nil {
		return span{}, false, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return span{}, false, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return span{}, false, nil
	}
	k := spanKey{ino: st.Ino, size: uint64(st.Size), mtime: st.Mtim.Nano()}
	u.spanMu.Lock()
	cached, hit := u.spans[path]
	u.spanMu.Unlock()
	if hit && cached.key == k {
		return cached.span, cached.ok, nil
	}
	sp, ok = readSpan(f, st.Size)
	u.spanMu.Lock()
	if u.spans == nil {
		u.spans = map[string]spanEntry{}
	}
	u.spans[path] = spanEntry{key: k, span: sp, ok: ok}
	u.spanMu.Unlock()
	return sp, ok, nil
}

// spanEntry is the index's entry of one file.
type spanEntry struct {
	key  spanKey
	span span
	ok   bool
}

// spanRead is how much of each end of a file readSpan reads.
const spanRead = 64 << 10

// readSpan reads the first records of f (of size bytes) up to one that is
// not "open", and the last ones, for their times.
func readSpan(f *os.File, size int64) (span, bool) {
	sp := span{size: size}
	if size == 0 {
		return sp, true
	}
	head := make([]byte, min(size, spanRead))
	if _, err := f.ReadAt(head, 0); err != nil {
		return sp, false
	}
	for _, line := range bytes.Split(head, []byte{'\n'}) {
		var r usageRec
		if json.Unmarshal(line, &r) == nil && r.Ev != "" && r.Ev != "open" {
			sp.first = r.T
			break
		}
	}
	tail := make([]byte, min(size, spanRead))
	if _, err := f.ReadAt(tail, size-int64(len(tail))); err != nil {
		return sp, false
	}
	lines := bytes.Split(tail, []byte{'\n'})
	if int64(len(tail)) < size {
		lines = lines[1:] // the first may be cut
	}
	for _, line := range lines {
		var r usageRec
		if json.Unmarshal(line, &r) == nil && r.Ev != "" {
			sp.last = max(sp.last, r.T)
		}
	}
	return sp, sp.last != 0
}

// ErrBadQuery is the answer to a usage query without a start time in the
// past.
var ErrBadQuery = errors.New("usage needs a start time in the past")

// ErrBadBy is the answer to a usage query that sums by neither user nor
// device.
var ErrBadBy = errors.New("usage sums by user or by device")

// usageReads bounds the usage queries reading the accounting log at once.
var usageReads = make(chan struct{}, 2)

// Usage sums the accounting log for npubroker usage, from q's start time
// until now: the records written, the sums not written yet, and the
// leases held now, counted until now.
func (g *Ledger) Usage(q *wire.UsageQuery) (*wire.UsageReport, error) {
	now := time.Now()
	if q == nil || q.SinceMS < 0 || q.SinceMS > now.UnixMilli() {
		return nil, ErrBadQuery
	}
	if q.By != "" && q.By != wire.UsageByUser && q.By != wire.UsageByDevice {
		return nil, ErrBadBy
	}
	usageReads <- struct{}{}
	g.usage.flush(time.Second)
	files, cut, oldest, err := g.usage.readSince(time.UnixMilli(q.SinceMS))
	<-usageReads
	if err != nil {
		return nil, fmt.Errorf("read the usage log: %w", err)
	}
	g.mu.Lock()
	live := map[uint64]bool{}
	type figs struct {
		util   *float64
		idleMS int64
	}
	liveFigs := map[uint64]figs{}
	for _, e := range g.leases {
		live[e.ID] = true
		var f figs
		f.util, f.idleMS = e.util.figures()
		liveFigs[e.ID] = f
	}
	// Leases past their user's rate that ended lately are not in the log
	// yet: counted all the same.
	files = append(files, g.sums.pending())
	g.unlock()
	rep := sumUsageBy(files, time.UnixMilli(q.SinceMS), now, q.User, q.By, g.deviceName, func(id uint64) bool { return live[id] },
		func(id uint64) (*float64, int64) { f := liveFigs[id]; return f.util, f.idleMS })
	rep.Dropped = g.usage.dropped.Load()
	rep.Oldest = 0
	if cut {
		rep.Oldest = oldest
	}
	return rep, nil
}
