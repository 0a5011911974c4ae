package status

import (
	"bytes"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/internal/fileid"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
)

// syncBuf is a log the test reads while the ledger writes it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// keepRoom is a room whose ledger logs to a buffer, with entries of
// leases "adopted" (held from before this start) put in by hand on
// devices the table does not lease: what restoreUtil reads the file for.
type keepRoom struct {
	*room
	dir string
	log *syncBuf
}

func newKeepRoom(t *testing.T, extra ...string) keepRoom {
	r, usage := newRoom(t, 3, "fake_util = \"/nonexistent\"\n[status]\nutil_interval = \"1s\"\n"+strings.Join(extra, ""))
	lb := &syncBuf{}
	r.g.log = log.New(lb, "", 0)
	r.g.repeat = r.g.log.Printf
	return keepRoom{r, filepath.Dir(usage), lb}
}

// adopted enters a lease id, held since since on device dev, as one the
// ledger took up at its start (adopted) or granted since (not).
func (k keepRoom) adopted(t *testing.T, id uint64, dev int, since time.Time, adopted bool) *entry {
	e := newEntry(&lease.Lease{ID: id, Since: since, Adopted: adopted, Devices: []int{dev}, Files: []fileid.ID{{Dev: 1, Ino: id}},
		Holder: lease.Holder{Kind: lease.Inline, UID: 1001, User: "u1001"}})
	k.g.mu.Lock()
	k.g.leases[dev] = e
	k.g.unlock()
	t.Cleanup(func() {
		k.g.mu.Lock()
		delete(k.g.leases, dev)
		k.g.unlock()
	})
	return e
}

func (k keepRoom) write(t *testing.T, data []byte) string {
	path := filepath.Join(k.dir, utilStateName)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func info(e *entry) wire.LeaseInfo {
	var li wire.LeaseInfo
	leaseUtilInfo(e, &li)
	leaseIdleInfo(e, &li)
	return li
}

func samples(ps ...float64) map[int]npu.Util {
	m := map[int]npu.Util{}
	for id, p := range ps {
		m[id] = npu.Util{Percent: p, MemUsed: -1, MemTotal: -1}
	}
	return m
}

// TestUtilStateRoundTrip: what a sample leaves of the leases held is
// written to the state directory's util.json (one record per lease
// sampled, mode 0600), and read back at the next start for the leases
// adopted alone: a lease granted since with an id the file names, a lease
// of another start (another since), and a lease the file does not name
// start again. The mean goes on before the first sample; the idle run is
// not shown until a sample says it goes on.
func TestUtilStateRoundTrip(t *testing.T) {
	k := newKeepRoom(t)
	t0 := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	a := k.adopted(t, 41, 0, t0, true)
	b := k.adopted(t, 42, 1, t0, true)
	k.g.utilPath = filepath.Join(k.dir, utilStateName)
	k.g.sampled(t0.Add(time.Second), samples(10, 2, 0), nil)
	k.g.sampled(t0.Add(2*time.Second), samples(20, 1, 0), nil)
	b.util.idle.warned = true // as the [idle] policy marks it
	k.g.sampled(t0.Add(3*time.Second), samples(30, 0, 0), nil)
	st, err := os.Stat(k.g.utilPath)
	if err != nil || st.Mode().Perm() != 0o600 || st.Size() > 1024 {
		t.Fatalf("util.json: %v, %v; want a small file, 0600", st, err)
	}
	recs, err := readUtilState(k.g.utilPath)
	if err != nil || len(recs) != 2 {
		t.Fatalf("read back: %+v, %v; want the 2 leases", recs, err)
	}
	want := utilRecord{Lease: 42, Since: t0.UnixMilli(), Sum: 3, N: 3, IdleMS: 2000, IdleSince: t0.Add(time.Second).UnixMilli(),
		LastMS: t0.Add(3 * time.Second).UnixMilli(), Warned: true}
	if recs[1] != want {
		t.Errorf("lease 42's record %+v, want %+v", recs[1], want)
	}

	// The next start: lease 41 adopted, 42 held since another time (its
	// id taken again), 43 granted since with no record.
	k2 := newKeepRoom(t)
	data, _ := os.ReadFile(k.g.utilPath)
	path := k2.write(t, data)
	a2 := k2.adopted(t, 41, 0, t0, true)
	b2 := k2.adopted(t, 42, 1, t0.Add(time.Millisecond), true)
	c2 := k2.adopted(t, 43, 2, t0, false)
	k2.g.restoreUtil(path)
	if a2.util == nil || a2.util.sum != a.util.sum || a2.util.n != 3 {
		t.Fatalf("lease 41 after a restart: %+v; want the sum and count kept", a2.util)
	}
	if b2.util != nil || c2.util != nil {
		t.Errorf("lease 42 of another start: %+v, lease 43 not adopted: %+v; want nothing taken up", b2.util, c2.util)
	}
	if li := info(a2); li.UtilHeld == nil || *li.UtilHeld != 20 || li.Util != nil || li.IdleSince != 0 {
		t.Errorf("lease 41 before the first sample: %+v; want held 20, now unknown, not idle", li)
	}
	if !strings.Contains(k2.log.String(), "the figures of 1 lease(s) from before this start go on") {
		t.Errorf("log: %q", k2.log.String())
	}
}

// TestUtilStateIdleKept: across a restart a lease's idle run, and what
// the [idle] policy said of it, goes on where the first sample after it
// finds the lease idle still (the time the broker was down counted
// idle, as between any two samples), and ends where it finds it busy or
// unknown; the mean goes on either way.
func TestUtilStateIdleKept(t *testing.T) {
	t0 := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	idleSince := t0.Add(10 * time.Second)
	rec := utilRecord{Lease: 7, Since: t0.UnixMilli(), Sum: 10, N: 4, IdleMS: 30000, IdleSince: idleSince.UnixMilli(),
		LastMS: t0.Add(40 * time.Second).UnixMilli(), Warned: true, Reported: true}
	restart := t0.Add(100 * time.Second)
	for _, tc := range []struct {
		name     string
		sample   map[int]npu.Util
		errs     map[int]error
		kept     bool
		held     float64
		idleTime time.Duration
	}{
		{"idle", samples(1), nil, true, 11.0 / 5, 90 * time.Second},
		{"busy", samples(50), nil, false, 60.0 / 5, 30 * time.Second},
		{"unknown", map[int]npu.Util{}, map[int]error{0: os.ErrDeadlineExceeded}, false, 10.0 / 4, 30 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newKeepRoom(t)
			path := k.write(t, encodeUtilState(t0.Add(40*time.Second), []utilRecord{rec}))
			e := k.adopted(t, 7, 0, t0, true)
			k.g.restoreUtil(path)
			k.g.sampled(restart, tc.sample, tc.errs)
			li := info(e)
			if tc.kept {
				if li.IdleSince != idleSince.UnixMilli() || !li.Warned {
					t.Errorf("first sample idle: idle since %d, warned %v; want %d kept, warned", li.IdleSince, li.Warned, idleSince.UnixMilli())
				}
			} else if li.IdleSince != 0 || e.util.idle.warned || e.util.idle.reported {
				t.Errorf("first sample %s: idle since %d, %+v; want the run ended", tc.name, li.IdleSince, e.util.idle)
			}
			if li.UtilHeld == nil || *li.UtilHeld != tc.held {
				t.Errorf("held %v, want %v", li.UtilHeld, tc.held)
			}
			if e.util.idleTotal != tc.idleTime {
				t.Errorf("idle time %v, want %v", e.util.idleTotal, tc.idleTime)
			}
		})
	}
}

// TestUtilStateBad: a file that cannot be read as one — not JSON, cut
// short, larger than maxUtilState, another version, unknown fields, a
// link — is logged and left, never fatal, and the leases' figures start
// again; a file that is not there is nothing to say.
func TestUtilStateBad(t *testing.T) {
	good := encodeUtilState(time.Now(), []utilRecord{{Lease: 7, Since: 1000, Sum: 10, N: 1}})
	big := append([]byte(`{"v":1,"leases":[`), bytes.Repeat([]byte(`{"lease":9,"since_ms":1,"sum":1,"n":1,"idle_ms":0},`), maxUtilState/40)...)
	big = append(big[:len(big)-1], "]}\n"...)
	for _, tc := range []struct{ name, content, want string }{
		{"garbage", "\x00\x01not json", "invalid character"},
		{"cut", string(good[:len(good)/2]), "unexpected EOF"},
		{"big", string(big), "larger than 1048576 bytes"},
		{"version", `{"v":2,"leases":[]}`, "version 2, this broker reads version 1"},
		{"unknown field", `{"v":1,"leases":[{"lease":7,"since_ms":1000,"sum":10,"n":1,"evil":1}]}`, `unknown field "evil"`},
		{"link", "", "too many levels of symbolic links"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newKeepRoom(t)
			path := filepath.Join(k.dir, utilStateName)
			if tc.name == "link" {
				target := filepath.Join(t.TempDir(), "elsewhere")
				os.WriteFile(target, good, 0o600)
				if err := os.Symlink(target, path); err != nil {
					t.Fatal(err)
				}
			} else {
				k.write(t, []byte(tc.content))
			}
			e := k.adopted(t, 7, 0, time.UnixMilli(1000), true)
			k.g.restoreUtil(path)
			if e.util != nil {
				t.Errorf("figures taken up from a bad file: %+v", e.util)
			}
			if lg := k.log.String(); !strings.Contains(lg, "utilization state "+path) || !strings.Contains(lg, tc.want) {
				t.Errorf("log %q; want the file named and %q", lg, tc.want)
			}
		})
	}
	k := newKeepRoom(t)
	k.g.restoreUtil(filepath.Join(k.dir, utilStateName))
	if lg := k.log.String(); strings.Contains(lg, "utilization") {
		t.Errorf("no file: log %q, want nothing", lg)
	}
}

// TestUtilStateWrites: the file is written once a sample has changed
// what it keeps, not again for a sample that changed nothing, and a
// lease gone is gone from it at the next sample; a state directory that
// cannot take it is logged, not fatal.
func TestUtilStateWrites(t *testing.T) {
	k := newKeepRoom(t)
	t0 := time.Now().Truncate(time.Millisecond)
	path := filepath.Join(k.dir, utilStateName)
	k.g.utilPath = path
	k.g.sampled(t0, samples(0, 0, 0), nil) // no lease: an empty record
	recs, err := readUtilState(path)
	if err != nil || len(recs) != 0 {
		t.Fatalf("no lease: %+v, %v", recs, err)
	}
	st1, _ := os.Stat(path)
	k.g.sampled(t0.Add(time.Second), samples(0, 0, 0), nil)
	if st2, _ := os.Stat(path); !os.SameFile(st1, st2) {
		t.Errorf("written again for a sample that changed nothing")
	}
	e := k.adopted(t, 5, 0, t0, false)
	k.g.sampled(t0.Add(2*time.Second), samples(3, 0, 0), nil)
	if recs, err := readUtilState(path); err != nil || len(recs) != 1 || recs[0].Lease != 5 {
		t.Errorf("a lease held: %+v, %v", recs, err)
	}
	k.g.mu.Lock()
	delete(k.g.leases, 0)
	k.g.unlock()
	_ = e
	k.g.sampled(t0.Add(3*time.Second), samples(3, 0, 0), nil)
	if recs, err := readUtilState(path); err != nil || len(recs) != 0 {
		t.Errorf("the lease gone: %+v, %v", recs, err)
	}
	k.g.utilPath = filepath.Join(k.dir, "usage.log", utilStateName) // not a directory
	k.adopted(t, 6, 1, t0, false)
	k.g.sampled(t0.Add(4*time.Second), samples(0, 3, 0), nil)
	if !strings.Contains(k.log.String(), "the leases' figures are not kept across a restart") {
		t.Errorf("log %q", k.log.String())
	}
}

// TestUtilStateWarnFirst: a lease whose idle run is kept across a
// restart, its holders not warned before it, may have passed [idle]
// after while the broker was down: the first sample warns it, and it is
// reclaimed no sooner than warn_before later (kept across a second
// restart too), never at once; one warned before the restart, whose end
// the warning gave passed meanwhile, is reclaimed at the first sample.
func TestUtilStateWarnFirst(t *testing.T) {
	const reclaim = "\n[idle]\nafter = \"1h\"\naction = \"reclaim\"\nwarn_before = \"10m\"\n"
	at := time.Now().Truncate(time.Millisecond)
	t0 := at.Add(-3 * time.Hour)
	rec := utilRecord{Lease: 7, Since: t0.UnixMilli(), Sum: 1, N: 1, IdleSince: t0.Add(time.Minute).UnixMilli(), LastMS: t0.Add(time.Minute).UnixMilli()}

	k := newKeepRoom(t, reclaim)
	e := k.adopted(t, 7, 0, t0, true)
	k.g.restoreUtil(k.write(t, encodeUtilState(t0, []utilRecord{rec})))
	k.g.sampled(at, samples(1), nil)
	li := info(e)
	if !li.Warned || li.Reclaimed != 0 || li.IdleEnds != at.Add(10*time.Minute).UnixMilli() {
		t.Fatalf("first sample after the restart, not warned before it: %+v; want warned, to end at %d", li, at.Add(10*time.Minute).UnixMilli())
	}
	if lg := k.log.String(); !strings.Contains(lg, "its holders are warned") || strings.Contains(lg, "is reclaimed") {
		t.Errorf("log %q; want a warning and no reclaim", lg)
	}
	k.g.sampled(at.Add(5*time.Minute), samples(1), nil)
	if li := info(e); li.Reclaimed != 0 {
		t.Fatalf("reclaimed 5m after its warning, warn_before 10m: %+v", li)
	}
	// A second restart keeps when it ends.
	data, _ := os.ReadFile(k.g.utilPath)
	k2 := newKeepRoom(t, reclaim)
	e2 := k2.adopted(t, 7, 0, t0, true)
	k2.g.restoreUtil(k2.write(t, data))
	k2.g.sampled(at.Add(6*time.Minute), samples(1), nil)
	if li := info(e2); li.Reclaimed != 0 || li.IdleEnds != at.Add(10*time.Minute).UnixMilli() || strings.Contains(k2.log.String(), "its holders are warned") {
		t.Fatalf("after a second restart: %+v, log %q; want still to end at %d, not warned again", li, k2.log.String(), at.Add(10*time.Minute).UnixMilli())
	}
	k2.g.sampled(at.Add(10*time.Minute), samples(1), nil)
	if li := info(e2); li.Reclaimed != at.Add(10*time.Minute).UnixMilli() {
		t.Errorf("warn_before after its warning: %+v; want reclaimed", li)
	}

	// Warned before the restart: its end passed while the broker was
	// down, so the first sample reclaims it.
	rec.Warned = true
	k3 := newKeepRoom(t, reclaim)
	e3 := k3.adopted(t, 7, 0, t0, true)
	k3.g.restoreUtil(k3.write(t, encodeUtilState(t0, []utilRecord{rec})))
	k3.g.sampled(at, samples(1), nil)
	if li := info(e3); li.Reclaimed != at.UnixMilli() {
		t.Errorf("warned before the restart, its end passed: %+v; want reclaimed at the first sample", li)
	}
}
