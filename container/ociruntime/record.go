package ociruntime

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// A container that npurun started may start again without it: its engine
// restarts it (--restart), or someone runs `docker start`. The runtime
// then asks the broker for its devices on behalf of its owner, the user
// whose npurun handed it its first lease. The owner comes from the
// hand-over's socket (SO_PEERCRED), never from the container's own
// description, which anyone who may run containers writes; the runtime
// keeps it in a record of its own, one file a container in the state
// directory (root's, 0700). A record lives as long as the container's
// files do (the directory of its /etc/hostname, which docker rm and
// podman rm remove): each new record written removes those whose
// container is gone, and the oldest beyond maxRecords.

// maxRecords caps the records kept.
const maxRecords = 10000

// record is whose a container is.
type record struct {
	ID      string `json:"id"`
	Engine  string `json:"engine,omitempty"`
	Name    string `json:"name,omitempty"`
	UID     uint32 `json:"uid"`
	User    string `json:"user"`
	Devices []int  `json:"devices"`
	Home    string `json:"home,omitempty"` // the container's files: the record goes with them
	Created int64  `json:"created"`        // Unix ms
}

// writeRecord stores r in dir, atomically, and prunes the records of
// containers that are gone.
func writeRecord(dir string, r *record) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("record container %s: %w", r.ID, err)
	}
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("record container %s: %w", r.ID, err)
	}
	tmp := filepath.Join(dir, "."+r.ID+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("record container %s: %w", r.ID, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, r.ID)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("record container %s: %w", r.ID, err)
	}
	prune(dir, r.ID)
	return nil
}

// readRecord finds container id's record in dir; nil, nil when there is
// none.
func readRecord(dir, id string) (*record, error) {
	f, err := os.Open(filepath.Join(dir, id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the record of container %s: %w", id, err)
	}
	defer f.Close()
	r := &record{}
	if err := json.NewDecoder(io.LimitReader(f, 64<<10)).Decode(r); err != nil {
		return nil, fmt.Errorf("read the record of container %s: %w", id, err)
	}
	if r.ID != id {
		return nil, fmt.Errorf("read the record of container %s: it is %q's", id, r.ID)
	}
	return r, nil
}

// prune removes the records whose container's files are gone, and the
// oldest beyond maxRecords; keep is never removed.
func prune(dir, keep string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type kept struct {
		name string
		mod  time.Time
	}
	var left []kept
	for _, e := range entries {
		name := e.Name()
		if name == keep || !validID(name) {
			continue
		}
		r, err := readRecord(dir, name)
		if err != nil || r == nil {
			continue
		}
		if r.Home != "" {
			if _, err := os.Stat(r.Home); errors.Is(err, os.ErrNotExist) {
				os.Remove(filepath.Join(dir, name))
				continue
			}
		}
		if info, err := e.Info(); err == nil {
			left = append(left, kept{name, info.ModTime()})
		}
	}
	if len(left) < maxRecords {
		return
	}
	slices.SortFunc(left, func(a, b kept) int { return a.mod.Compare(b.mod) })
	for _, k := range left[:len(left)-maxRecords+1] {
		os.Remove(filepath.Join(dir, k.name))
	}
}

// validID tells whether id may name a container (and a file): letters,
// digits, "-", "_", ".", not starting with ".".
func validID(id string) bool {
	if id == "" || len(id) > 256 || id[0] == '.' {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}
