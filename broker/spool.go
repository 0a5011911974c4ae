package broker

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// The spool is an append-only journal of task records, one JSON object a
// line, in the broker's state directory. A record is durable when Append
// returns: appends that arrive while a write is under way are written and
// synced together (group commit), so a burst of submissions costs one
// fdatasync per batch, not one each. At start the journal is replayed and
// rewritten compactly (write, fsync, rename, fsync the directory); a torn
// last line, left by a crash in mid-write, is dropped: its writer never
// heard that it was durable.

// journalName is the journal's file name in the state directory.
const journalName = "journal"

// Spool is the journal of tasks.
type Spool struct {
	dir string

	mu      sync.Mutex
	cond    *sync.Cond
	f       *os.File
	buf     []byte // records waiting for the next write
	queued  uint64 // batches handed to Append so far
	synced  uint64 // batches durable so far
	writing bool
	err     error // a failed write poisons the spool: nothing is acknowledged after it
	records int   // records in the journal file
}

// OpenSpool replays the journal in dir and calls apply for each record in
// order, then rewrites the journal from the records keep returns (the state
// to carry on with) and opens it for appending.
func OpenSpool(dir string, apply func(*record) error, keep func() []*record) (*Spool, error) {
	if err := prepareStateDir(dir); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, journalName)
	if err := replay(path, apply); err != nil {
		return nil, err
	}
	s := &Spool{dir: dir}
	s.cond = sync.NewCond(&s.mu)
	if err := s.rewrite(keep()); err != nil {
		return nil, err
	}
	return s, nil
}

func prepareStateDir(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	// The journal holds users' commands and environments: root's alone.
	return prepareLockDir(dir)
}

// maxRecord bounds one journal line.
const maxRecord = 4 << 20

func replay(path string, apply func(*record) error) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open spool: %w", err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<16)
	for n := 1; ; n++ {
		line, err := r.ReadBytes('\n')
		if err == io.EOF {
			return nil // a line without its newline is torn: never acknowledged
		}
		if err != nil {
			return fmt.Errorf("read spool %s: %w", path, err)
		}
		if len(line) > maxRecord {
			return fmt.Errorf("spool %s:%d: record larger than %d bytes", path, n, maxRecord)
		}
		var rec record
		if err := json.Unmarshal(line, &rec); err != nil {
			return fmt.Errorf("spool %s:%d: %w", path, n, err)
		}
		if err := apply(&rec); err != nil {
			return fmt.Errorf("spool %s:%d: %w", path, n, err)
		}
	}
}

// rewrite replaces the journal with recs, atomically, and opens it for
// appending.
func (s *Spool) rewrite(recs []*record) error {
	path := filepath.Join(s.dir, journalName)
	tmp := path + ".new"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("rewrite spool: %w", err)
	}
	w := bufio.NewWriterSize(f, 1<<16)
	for _, rec := range recs {
		b, err := json.Marshal(rec)
		if err != nil {
			f.Close()
			return err
		}
		w.Write(b)
		w.WriteByte('\n')
	}
	if err := w.Flush(); err == nil {
		err = f.Sync()
	}
	if err != nil {
		f.Close()
		return fmt.Errorf("rewrite spool: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		f.Close()
		return fmt.Errorf("rewrite spool: %w", err)
	}
	if err := syncDir(s.dir); err != nil {
		f.Close()
		return err
	}
	s.mu.Lock()
	old := s.f
	s.f, s.records = f, len(recs)
	s.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// Records is the number of records in the journal, for compaction.
func (s *Spool) Records() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.records
}

// Append writes recs and returns once they are durable.
func (s *Spool) Append(recs ...*record) error {
	var line bytes.Buffer
	for _, rec := range recs {
		b, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		if len(b) > maxRecord {
			return fmt.Errorf("spool record of %d bytes, more than %d", len(b), maxRecord)
		}
		line.Write(b)
		line.WriteByte('\n')
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	s.buf = append(s.buf, line.Bytes()...)
	s.records += len(recs)
	s.queued++
	mine := s.queued
	for s.synced < mine && s.err == nil {
		if s.writing {
			s.cond.Wait()
			continue
		}
		// Lead a batch: everything appended so far goes in one write.
		s.writing = true
		batch, upto := s.buf, s.queued
		s.buf = nil
		f := s.f
		s.mu.Unlock()
		_, err := f.Write(batch)
		if err == nil {
			err = unix.Fdatasync(int(f.Fd()))
		}
		s.mu.Lock()
		s.writing = false
		if err != nil {
			s.err = fmt.Errorf("write spool: %w", err)
		} else {
			s.synced = upto
		}
		s.cond.Broadcast()
	}
	if s.synced >= mine {
		return nil
	}
	return s.err
}

// Compact replaces the journal with recs, waiting for a batch being
// written to finish; appends wait meanwhile and go to the new journal.
// The caller must make sure recs reflect every record appended so far.
func (s *Spool) Compact(recs []*record) error {
	s.mu.Lock()
	for s.writing {
		s.cond.Wait()
	}
	s.writing = true // no leader starts a batch on the old file
	s.mu.Unlock()
	err := s.rewrite(recs)
	s.mu.Lock()
	s.writing = false
	s.cond.Broadcast()
	s.mu.Unlock()
	return err
}

// Close closes the journal.
func (s *Spool) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.f.Close()
}
