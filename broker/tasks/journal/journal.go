package journal

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The journal is an append-only file of records, one JSON object a line,
// in the broker's state directory. Only this package writes it, and only
// from the transitions of life.go.
//
// A record is durable when its wait returns nil: records that arrive while
// a write is under way are written and synced together (group commit), so
// a burst of submissions costs one fdatasync per batch, not one each.
// Records are queued in the order the transitions were decided (under the
// broker's lock), so the journal's order is the order of the decisions.
//
// A record may also be waited for only until it is written (waitWritten):
// in the file, as any later reader of it sees it, though not yet on the
// disk. That is enough against the broker's own death, which loses nothing
// the kernel has; only the machine's can lose it. The batch's fdatasync
// then goes on in the background, and later batches wait for it as ever.
//
// A write that fails is cut off again (ftruncate to the end of the last
// good batch), so that later records never glue onto a torn one; its
// records were never durable and their transitions are not applied. A
// failed fdatasync leaves the file's contents unknown: nothing is written
// to it after that, until a rewrite replaces it.
//
// A rewrite (compaction) writes the state to carry on with to journal.new
// without holding the broker's lock, while appends go on to the old file;
// the records that became durable meanwhile are copied after the state,
// and journal.new is synced and renamed over the journal. A rewrite that
// fails leaves the old journal in place.

// journalName is the journal's file name in the state directory.
const journalName = "journal"

// maxRecord bounds one journal line.
const maxRecord = 4 << 20

// journal is the open journal file.
type journal struct {
	dir string

	mu       sync.Mutex
	cond     *sync.Cond
	f        *os.File
	size     int64  // bytes in f that are durable
	records  int    // records in f
	buf      []byte // records waiting for the next write
	bufRecs  int
	queued   uint64           // tickets handed out
	resolved uint64           // tickets whose write has ended
	written  uint64           // tickets in the file, synced or not (≥ resolved once written)
	failed   map[uint64]error // resolved tickets whose write failed, until waited for
	writing  bool
	broken   error // an fsync failed or a write could not be cut off: nothing is written until a rewrite

	// Entries not yet released by their transition, for compaction: the
	// records durable but not yet applied must be carried into a rewrite.
	pend      map[uint64]entry
	capturing bool
	capture   []byte // records durable since the rewrite's snapshot
	captured  int
	// captureErr is a batch's failure during the capture: its records may
	// have been applied already (a start that waited only for its write)
	// after the snapshot was taken, and are in neither; the rewrite fails.
	captureErr error

	// beforeSwap, when set (by tests), runs in a rewrite after the snapshot
	// is written and before the records appended meanwhile are copied.
	beforeSwap func()
	// beforeWrite, when set (by tests), runs as a batch is written, with
	// neither j.mu nor the broker's lock held.
	beforeWrite func()
	// syncFails, when set (by tests), fails a batch's sync with its error.
	syncFails func() error
}

// syncBatch syncs a batch written to f.
func (j *journal) syncBatch(f *os.File) error {
	if j.syncFails != nil {
		if err := j.syncFails(); err != nil {
			return fmt.Errorf("sync journal: %w", err)
		}
	}
	return syncFile(f)
}

type entry struct {
	data []byte
	recs int
}

// ticket identifies records queued for the journal.
type ticket uint64

func newJournal(dir string) *journal {
	j := &journal{dir: dir, failed: map[uint64]error{}, pend: map[uint64]entry{}}
	j.cond = sync.NewCond(&j.mu)
	return j
}

func (j *journal) path() string { return filepath.Join(j.dir, journalName) }

// enqueue queues data (n records) for the next write and returns its
// ticket; the caller waits for it with wait, then releases it.
func (j *journal) enqueue(data []byte, n int) (ticket, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.broken != nil {
		return 0, j.broken
	}
	if j.f == nil {
		return 0, errors.New("the journal is not open")
	}
	j.queued++
	j.buf = append(j.buf, data...)
	j.bufRecs += n
	j.pend[j.queued] = entry{data, n}
	return ticket(j.queued), nil
}

// wait returns once tk's records are durable, or their write failed.
func (j *journal) wait(tk ticket) error { return j.await(tk, false) }

// waitWritten returns once tk's records are in the file, synced or not, or
// their write failed; a batch it leads is synced in the background.
func (j *journal) waitWritten(tk ticket) error { return j.await(tk, true) }

func (j *journal) await(tk ticket, written bool) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	mine := uint64(tk)
	for j.resolved < mine && (!written || j.written < mine) {
		if j.writing {
			j.cond.Wait()
			continue
		}
		j.writeBatchLocked(written)
	}
	if err, bad := j.failed[mine]; bad {
		delete(j.failed, mine)
		return err
	}
	return nil
}

// writeBatchLocked leads one batch: everything queued so far goes in one
// write and one fdatasync, with j.mu released meanwhile. With background
// set, it returns once the write is made, and the sync and the batch's end
// follow in another goroutine.
func (j *journal) writeBatchLocked(background bool) {
	batch, n, lo, hi := j.buf, j.bufRecs, j.resolved, j.queued
	j.buf, j.bufRecs = nil, 0
	j.writing = true
	f, at := j.f, j.size
	err := j.broken
	j.mu.Unlock()
	if j.beforeWrite != nil {
		j.beforeWrite()
	}
	if err == nil {
		err = write(f, at, batch)
	}
	if err == nil && background {
		j.mu.Lock()
		j.written = hi
		j.cond.Broadcast()
		go func() {
			err := j.syncBatch(f)
			j.mu.Lock()
			j.endBatchLocked(f, at, batch, n, lo, hi, err)
			j.mu.Unlock()
		}()
		return
	}
	if err == nil {
		err = j.syncBatch(f)
	}
	j.mu.Lock()
	j.endBatchLocked(f, at, batch, n, lo, hi, err)
}

// endBatchLocked ends the batch of tickets lo+1 … hi, written to f at at
// (and synced) with the result err.
func (j *journal) endBatchLocked(f *os.File, at int64, batch []byte, n int, lo, hi uint64, err error) {
	j.writing = false
	switch {
	case err == nil:
		j.size += int64(len(batch))
		j.records += n
		if j.capturing {
			j.capture = append(j.capture, batch...)
			j.captured += n
		}
	case j.broken == nil:
		if j.capturing {
			j.captureErr = err
		}
		j.broken = err
		if errors.Is(err, errTorn) {
			// The data may be on disk in part: cut it off, so that the
			// next write does not glue onto a torn record.
			if terr := f.Truncate(at); terr == nil {
				j.broken = nil
			} else {
				j.broken = fmt.Errorf("%w; cut off the torn write: %v", err, terr)
			}
		}
	}
	for t := lo + 1; t <= hi; t++ {
		// A ticket whose owner has let it go (it waited only for the
		// write, and the sync failed after) is not kept for a wait.
		if _, owned := j.pend[t]; err != nil && owned {
			j.failed[t] = err
		}
	}
	j.resolved = hi
	j.written = max(j.written, hi)
	j.cond.Broadcast()
}

// errTorn marks a write that failed: what it wrote is to be cut off.
var errTorn = errors.New("write journal")

// writeAt writes b at offset at of f (its end) and syncs it.
func writeAt(f *os.File, at int64, b []byte) error {
	if err := write(f, at, b); err != nil {
		return err
	}
	return syncFile(f)
}

// write writes b at offset at of f.
func write(f *os.File, at int64, b []byte) error {
	if _, err := f.WriteAt(b, at); err != nil {
		return fmt.Errorf("%w: %w", errTorn, unwrapPath(err))
	}
	return nil
}

// syncFile makes what was written to f durable.
func syncFile(f *os.File) error {
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("sync journal: %w", err)
	}
	return nil
}

// unwrapPath drops the *PathError around err: messages name the journal
// themselves.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// release forgets tk: its transition has been applied (or refused).
func (j *journal) release(tk ticket) {
	j.mu.Lock()
	delete(j.pend, uint64(tk))
	delete(j.failed, uint64(tk))
	j.mu.Unlock()
}

// beginCapture starts a rewrite: it is called with the broker's lock held,
// as the snapshot is taken. Records durable but not yet applied are in no
// snapshot: they are carried over, and so is every record made durable from
// now until the rewrite ends. (A record both in the snapshot and carried
// over is applied twice on replay, which changes nothing.)
func (j *journal) beginCapture() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.capturing, j.capture, j.captured, j.captureErr = true, nil, 0, nil
	for _, t := range slices.Sorted(maps.Keys(j.pend)) {
		if _, bad := j.failed[t]; t <= j.resolved && !bad {
			e := j.pend[t]
			j.capture = append(j.capture, e.data...)
			j.captured += e.recs
		}
	}
}

// endCapture ends a capture (the rewrite is over, or was not made).
func (j *journal) endCapture() {
	j.mu.Lock()
	j.capturing, j.capture, j.captured = false, nil, 0
	j.mu.Unlock()
}

// countWriter counts what it writes.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// rewrite replaces the journal with a snapshot of n records, which
// snapshot writes (streamed to the file: a journal of many large tasks is
// never held twice in memory), and the records captured since
// beginCapture. It returns the snapshot's size. On failure the old journal
// stays in place.
func (j *journal) rewrite(snapshot func(io.Writer) error, n int) (int64, error) {
	defer j.endCapture()
	tmp := j.path() + ".new"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return 0, fmt.Errorf("rewrite journal: %w", unwrapPath(err))
	}
	fail := func(err error) (int64, error) {
		f.Close()
		os.Remove(tmp)
		return 0, fmt.Errorf("rewrite journal: %w", err)
	}
	cw := &countWriter{w: f}
	bw := bufio.NewWriterSize(cw, 256<<10)
	err = snapshot(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		return fail(unwrapPath(err))
	}
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fail(fmt.Errorf("sync journal: %w", err))
	}
	size := cw.n
	if j.beforeSwap != nil {
		j.beforeSwap()
	}
	// No batch starts until the new file is in place; appends meanwhile
	// wait, then go to the new file.
	j.mu.Lock()
	for j.writing {
		j.cond.Wait()
	}
	if err := j.captureErr; err != nil {
		j.mu.Unlock()
		return fail(fmt.Errorf("a write failed meanwhile: %w", err))
	}
	j.writing = true
	tail, m := j.capture, j.captured
	j.mu.Unlock()
	done := func() {
		j.mu.Lock()
		j.writing = false
		j.cond.Broadcast()
		j.mu.Unlock()
	}
	if err := writeAt(f, size, tail); err != nil {
		done()
		return fail(err)
	}
	if err := os.Rename(tmp, j.path()); err != nil {
		done()
		return fail(unwrapPath(err))
	}
	// The new file is the journal now, durable or not: appends go there.
	serr := syncDir(j.dir)
	j.mu.Lock()
	old := j.f
	j.f, j.size, j.records = f, size+int64(len(tail)), n+m
	j.broken = nil
	j.capturing, j.capture, j.captured = false, nil, 0
	if serr != nil {
		j.broken = fmt.Errorf("rewrite journal: %w", serr)
	}
	j.writing = false
	j.cond.Broadcast()
	j.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return size, j.broken
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return unwrapPath(err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, unwrapPath(err))
	}
	return nil
}

// appendTo opens the existing journal for appending at end, cutting off
// whatever follows (a torn last line): a rewrite could not be made.
func (j *journal) appendTo(end int64) error {
	f, err := os.OpenFile(j.path(), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("open journal: %w", unwrapPath(err))
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("open journal: %w", unwrapPath(err))
	}
	if st.Size() > end {
		if err := f.Truncate(end); err != nil {
			f.Close()
			return fmt.Errorf("cut off the journal's torn last line: %w", unwrapPath(err))
		}
	}
	j.mu.Lock()
	j.f, j.size = f, end
	j.mu.Unlock()
	return nil
}

// stats is the journal's size, its records, and why it cannot be written
// (nil when it can, as far as is known).
func (j *journal) stats() (int64, int, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.size, j.records, j.broken
}

// close closes the journal once what is queued is written.
func (j *journal) close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.resolved < j.queued {
		if j.writing {
			j.cond.Wait()
			continue
		}
		j.writeBatchLocked(false)
	}
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	return err
}

// damage is a line of the journal that could not be used.
type damage struct {
	line int
	size int
	err  error
}

func (d damage) String() string {
	return fmt.Sprintf("%s:%d: %v (%d bytes skipped)", journalName, d.line, d.err, d.size)
}

// replayed is what a replay found.
type replayed struct {
	end     int64    // offset after the last whole line
	records int      // records applied
	damaged []damage // lines skipped
	torn    int      // bytes of a last line without its newline, dropped
}

// recordStart begins every record: in JSON a '"' inside a string is
// escaped, so this never occurs within one, only where a record starts.
var recordStart = []byte(`{"op":`)

// replay reads the journal at path and calls apply for each record. A
// line that cannot be read is reported and skipped; where it holds the
// start of a record after a torn one (records glued onto a torn write by
// an older broker), that record is kept. A last line without its newline
// was never acknowledged and is dropped.
func replay(path string, apply func(*Record) error) (*replayed, error) {
	res := &replayed{}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return res, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open journal: %w", unwrapPath(err))
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<16)
	var line []byte
	for n := 1; ; n++ {
		var size int
		line, size, err = readLine(r, line[:0])
		if errors.Is(err, io.EOF) {
			res.torn = size
			return res, nil
		}
		if errors.Is(err, errLong) {
			res.damaged = append(res.damaged, damage{n, size, fmt.Errorf("record longer than %d bytes", maxRecord)})
			res.end += int64(size)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read journal: %w", unwrapPath(err))
		}
		res.end += int64(size)
		rec, err := decodeRecord(line)
		if err != nil {
			i := bytes.LastIndex(line, recordStart)
			if i <= 0 {
				res.damaged = append(res.damaged, damage{n, size, err})
				continue
			}
			glued, gerr := decodeRecord(line[i:])
			if gerr != nil {
				res.damaged = append(res.damaged, damage{n, size, err})
				continue
			}
			res.damaged = append(res.damaged, damage{n, i, fmt.Errorf("torn record: %w", err)})
			rec = glued
		}
		if err := apply(rec); err != nil {
			res.damaged = append(res.damaged, damage{n, size, err})
			continue
		}
		res.records++
	}
}

func decodeRecord(line []byte) (*Record, error) {
	var rec Record
	if err := json.Unmarshal(line, &rec); err != nil {
		return nil, err
	}
	if rec.Op == "" {
		return nil, errors.New("record without an op")
	}
	return &rec, nil
}

var errLong = errors.New("line too long")

// readLine reads one line with its newline into buf and returns it with
// the bytes it took. A line longer than maxRecord is consumed whole and
// reported as errLong; at the end of the file what is left comes back
// with io.EOF.
func readLine(r *bufio.Reader, buf []byte) ([]byte, int, error) {
	n, long := 0, false
	for {
		chunk, err := r.ReadSlice('\n')
		n += len(chunk)
		if !long && len(buf)+len(chunk) > maxRecord+1 {
			long, buf = true, buf[:0]
		}
		if !long {
			buf = append(buf, chunk...)
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err != nil:
			return buf, n, err
		case long:
			return nil, n, errLong
		}
		return buf, n, nil
	}
}

// keepDamaged keeps the journal as it was, damaged lines and all, beside
// it (a hard link: it needs no space) before a rewrite replaces it.
func keepDamaged(dir string) (string, error) {
	name := journalName + ".damaged." + strconv.FormatInt(time.Now().Unix(), 10)
	if err := os.Link(filepath.Join(dir, journalName), filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("keep the damaged journal: %w", unwrapPath(err))
	}
	return name, nil
}

// prepareDir makes the state directory, owned by us and open to nobody
// else: the journal holds users' commands and environments. It refuses a
// symbolic link or a directory owned by someone else.
func prepareDir(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("state directory %s: %w", dir, unwrapPath(err))
	}
	if err := unix.Mkdir(dir, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("create state directory %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("state directory %s: %w", dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("state directory %s: not a directory", dir)
	}
	if st.Uid != uint32(os.Geteuid()) {
		return fmt.Errorf("state directory %s: owned by uid %d, not by the broker's uid %d", dir, st.Uid, os.Geteuid())
	}
	if st.Mode&0o077 != 0 {
		if err := unix.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("state directory %s: %w", dir, err)
		}
	}
	return nil
}
