package status

import (
	"bytes"
	"encoding/json"
	"io"
	"log"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/npurun/npurun/wire"
)

// syncBuffer is a log destination safe for the writer goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func dev(id int) *int { return &id }

// noFigs is a live lease's utilization where none was sampled.
func noFigs(uint64) (*float64, int64) { return nil, 0 }

func startRec(id uint64, t int64, user, kind string, devices ...int) usageRec {
	return usageRec{T: t, Ev: "start", Lease: id, User: user, Kind: kind, Pool: "default", Devices: devices}
}

func endRec(id uint64, t int64, d int) usageRec {
	return usageRec{T: t, Ev: "end", Lease: id, Device: dev(d), How: endReleased}
}

// TestSumUsage: device time is summed per device, clipped to the window,
// by user, kind and pool; a live lease counts to the end of the window, a
// lease whose end was lost does not count and is said.
func TestSumUsage(t *testing.T) {
	recs := []usageRec{
		startRec(1, 1000, "alice", wire.KindInline, 0, 1),
		endRec(1, 3000, 1),
		startRec(2, 2500, "bob", wire.KindTask, 2),
		endRec(1, 5000, 0),
		startRec(3, 4000, "alice", wire.KindInline, 3), // live
		startRec(4, 4000, "carol", wire.KindInline, 4), // end lost
		startRec(5, 100, "dave", wire.KindHeld, 5),
		endRec(5, 1500, 5), // ended before the window
		{T: 4000, Ev: "open", Lease: 3, User: "alice", Kind: wire.KindInline, Pool: "default", Devices: []int{3}}, // a repeat: counted once
	}
	live := func(id uint64) bool { return id == 3 || id == 2 }
	rep := sumUsage([][]usageRec{recs}, time.UnixMilli(2000), time.UnixMilli(6000), "", live, noFigs)
	want := []wire.UsageRow{
		// alice: lease 1 from 2000 to 5000 on npu0 and to 3000 on npu1, lease 3 from 4000 to 6000
		{User: "alice", Kind: wire.KindInline, Pool: "default", Leases: 2, DeviceSeconds: 6},
		{User: "bob", Kind: wire.KindTask, Pool: "default", Leases: 1, DeviceSeconds: 3.5},
	}
	for i := range want {
		want[i].DeviceHours = want[i].DeviceSeconds / 3600
	}
	if got, _ := json.Marshal(rep.Rows); string(got) != string(mustJSON(want)) {
		t.Errorf("rows:\n%s\nwant\n%s", got, mustJSON(want))
	}
	if rep.Incomplete != 1 || rep.Since != 2000 || rep.Until != 6000 {
		t.Errorf("report: %+v", rep)
	}
	rep = sumUsage([][]usageRec{recs}, time.UnixMilli(0), time.UnixMilli(6000), "dave", live, noFigs)
	if len(rep.Rows) != 1 || rep.Rows[0].Kind != "held" || rep.Rows[0].DeviceSeconds != 1.4 {
		t.Errorf("dave's rows: %+v", rep.Rows)
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// TestOpenLeases: the leases a log leaves open, with the devices not yet
// ended.
func TestOpenLeases(t *testing.T) {
	open := openLeases([]usageRec{
		startRec(1, 1, "a", wire.KindInline, 0, 1),
		startRec(2, 2, "b", wire.KindInline, 2),
		endRec(1, 3, 0),
		endRec(2, 4, 2),
		{T: 1, Ev: "open", Lease: 1, Devices: []int{0, 1}}, // a repeat: the first record stands
	})
	if len(open) != 1 || open[1] == nil || len(open[1].held) != 1 || !open[1].held[1] {
		t.Fatalf("open leases: %+v", open)
	}
}

// TestReadUsageSkipsDamage: torn, garbled and oversized lines are
// skipped; the records around them are read.
func TestReadUsageSkipsDamage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.log")
	var b bytes.Buffer
	b.Write(mustJSON(startRec(1, 1, "a", wire.KindInline, 0)))
	b.WriteString("\n{\"t\":2,\"ev\":\"sta\n")
	b.WriteString("not json\n")
	b.WriteString("{\"t\":3,\"ev\":\"start\",\"lease\":9,\"user\":\"" + strings.Repeat("x", 100<<10) + "\"}\n")
	b.Write(mustJSON(endRec(1, 4, 0)))
	b.WriteString("\n{\"t\":5,\"ev\":\"end\"") // torn at the end
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	recs, err := readUsage(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].Lease != 1 || recs[1].Ev != "end" {
		t.Fatalf("records: %+v", recs)
	}
	if recs, err := readUsage("/dev/null"); err != nil || recs != nil {
		t.Errorf("a device read as a log: %v, %v", recs, err)
	}
	if recs, err := readUsage(filepath.Join(t.TempDir(), "none")); err != nil || recs != nil {
		t.Errorf("a missing log: %v, %v", recs, err)
	}
}

// TestUsageLogRotates: past its size the log moves to usage.log.1 (and
// up, keeping keep files), and the fresh file opens with the leases still
// held, so that their time is counted whole from the newest files alone.
func TestUsageLogRotates(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "usage.log")
	var logged syncBuffer
	held := startRec(1, 1000, "alice", wire.KindInline, 0)
	open := func() []usageRec {
		r := held
		r.Ev = "open"
		return []usageRec{r}
	}
	u := newUsageLog(path, 2048, 2, log.New(&logged, "", 0), open)
	go u.run()
	u.add(held)
	for i := range 100 {
		id := uint64(100 + i)
		u.add(startRec(id, 2000+int64(i)*10, "bob", wire.KindInline, 1))
		u.add(endRec(id, 2005+int64(i)*10, 1))
	}
	u.flush(10 * time.Second)
	for _, name := range []string{"usage.log", "usage.log.1", "usage.log.2"} {
		if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.Size() > 2048+1024 {
			t.Errorf("%s: %v, %v", name, st, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "usage.log.3")); err == nil {
		t.Error("usage.log.3 kept, with keep = 2")
	}
	cur, err := readUsage(path)
	if err != nil || len(cur) == 0 || cur[0].Ev != "open" || cur[0].Lease != 1 || cur[0].T != 1000 {
		t.Fatalf("fresh log of %d records (%v), want it to begin with lease 1 open", len(cur), err)
	}
	files, cut, err := u.readAll()
	if err != nil || len(files) != 3 || !cut {
		t.Fatalf("readAll: %d files, cut %v, %v", len(files), cut, err)
	}
	rep := sumUsage(files, time.UnixMilli(0), time.UnixMilli(10000), "alice", func(id uint64) bool { return id == 1 }, noFigs)
	if len(rep.Rows) != 1 || rep.Rows[0].DeviceSeconds != 9 || rep.Rows[0].Leases != 1 {
		t.Errorf("alice's open lease over rotations: %+v, want 9 s", rep.Rows)
	}
	if u.dropped.Load() != 0 || logged.String() != "" {
		t.Errorf("dropped %d; log: %s", u.dropped.Load(), logged.String())
	}
}

// TestUsageLogDropsAndRecovers: records that cannot be written are dropped
// and counted, said once; once the log can be written again the broker
// says so, with the count.
func TestUsageLogDropsAndRecovers(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "later")
	path := filepath.Join(dir, "usage.log")
	var logged syncBuffer
	u := newUsageLog(path, 1<<20, 1, log.New(&logged, "", 0), func() []usageRec { return nil })
	go u.run()
	for i := range 3 {
		u.add(startRec(uint64(i+1), 1, "a", wire.KindInline, 0))
		u.flush(10 * time.Second)
	}
	if u.dropped.Load() != 3 {
		t.Errorf("dropped %d, want 3", u.dropped.Load())
	}
	if n := strings.Count(logged.String(), "dropping records until it can be written again"); n != 1 {
		t.Errorf("said %d times:\n%s", n, logged.String())
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	u.add(startRec(9, 1, "a", wire.KindInline, 0))
	u.flush(10 * time.Second)
	if !strings.Contains(logged.String(), "writing again; 3 records were dropped") {
		t.Errorf("log:\n%s", logged.String())
	}
	if recs, err := readUsage(path); err != nil || len(recs) != 1 || recs[0].Lease != 9 {
		t.Errorf("log after recovery: %+v, %v", recs, err)
	}
}

// TestUsageSums: sum records count their leases, and their device time in
// proportion to the part of their span within the window; another user's
// are left out when one user's are asked for.
func TestUsageSums(t *testing.T) {
	recs := []usageRec{
		{T: 2000, Ev: "sum", User: "alice", Kind: wire.KindLogin, Pool: "default", From: 1000, Leases: 300, DevMS: 600},
		{T: 9000, Ev: "sum", User: "bob", Kind: wire.KindLogin, Pool: "default", From: 9000, Leases: 2, DevMS: 10},
		startRec(1, 1000, "alice", wire.KindLogin, 0),
		endRec(1, 3000, 0),
	}
	rep := sumUsage([][]usageRec{recs}, time.UnixMilli(1500), time.UnixMilli(10000), "alice", func(uint64) bool { return false }, noFigs)
	if len(rep.Rows) != 1 || rep.Rows[0].Leases != 301 || rep.Rows[0].DeviceSeconds != 1.5+0.3 {
		t.Errorf("alice from 1.5 s: %+v, want 301 leases, 1.8 s (1.5 of the lease, half the sum's 0.6)", rep.Rows)
	}
	rep = sumUsage([][]usageRec{recs}, time.UnixMilli(0), time.UnixMilli(10000), "", func(uint64) bool { return false }, noFigs)
	if len(rep.Rows) != 2 || rep.Rows[0].User != "alice" || rep.Rows[0].Leases != 301 || rep.Rows[1].Leases != 2 || rep.Rows[1].DeviceSeconds != 0.01 {
		t.Errorf("everyone: %+v", rep.Rows)
	}
}

// TestLogLimit: a user's leases are logged on their own 60 at once, then
// one every 6 s; another user's allowance is whole.
func TestLogLimit(t *testing.T) {
	ll := logLimit{}
	now := time.Now()
	n := 0
	for range 100 {
		if ll.allow(1, now) {
			n++
		}
	}
	if n != logBurst || !ll.allow(2, now) {
		t.Errorf("%d of 100 at once logged, want %d; another user's refused", n, logBurst)
	}
	if ll.allow(1, now.Add(logRefill/2)) || !ll.allow(1, now.Add(logRefill)) || ll.allow(1, now.Add(logRefill)) {
		t.Error("the allowance does not come back at one every logRefill")
	}
	ll.prune(now.Add((logBurst + 1) * logRefill))
	if len(ll) != 0 {
		t.Errorf("after a whole refill: %d users kept", len(ll))
	}
}

// TestReadSinceSkipsOld: a rotated file whose first and last lines are
// older than the start asked for (by the slack) is not read (a line in
// its middle, in the window, which no real log has, would count if it
// were), and the oldest time is its first line's all the same; asked for
// everything, it is read.
func TestReadSinceSkipsOld(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "usage.log")
	write := func(name string, recs ...usageRec) {
		var buf []byte
		for _, r := range recs {
			b, _ := json.Marshal(r)
			buf = append(append(buf, b...), '\n')
		}
		if err := os.WriteFile(filepath.Join(dir, name), buf, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	hour := int64(time.Hour / time.Millisecond)
	recs := []usageRec{startRec(1, 1000, "old", wire.KindInline, 0), startRec(2, 100*hour, "middle", wire.KindInline, 0), endRec(2, 100*hour+10, 0)}
	for i := range 2000 { // old lines after the middle: more than the tail read
		recs = append(recs, startRec(uint64(10+i), 1500, "old", wire.KindInline, 0), endRec(uint64(10+i), 1600, 0))
	}
	write("usage.log.1", append(recs, endRec(1, 2000, 0))...)
	write("usage.log", startRec(3, 100*hour, "now", wire.KindInline, 0), endRec(3, 100*hour+20, 0))
	u := newUsageLog(path, 1<<20, 1, log.New(io.Discard, "", 0), func() []usageRec { return nil })
	since := time.UnixMilli(99 * hour)
	files, cut, oldest, err := u.readSince(since)
	if err != nil || len(files) != 1 || !cut || oldest != 1000 {
		t.Fatalf("since 99 h: %d files, cut %v, oldest %d, %v; want the current file only, cut, oldest 1000", len(files), cut, oldest, err)
	}
	if _, ok := u.spans[rotated(path, 1)]; !ok {
		t.Error("the rotated file's span is not kept")
	}
	files, _, _, err = u.readSince(time.Time{})
	if err != nil || len(files) != 2 {
		t.Errorf("everything: %d files, %v", len(files), err)
	}
}

// TestSumUsageUtil: where leases were sampled, busy is the device time
// weighted by each lease's mean utilization over the device time of the
// leases sampled; idle device-hours are each device's idle time, in the
// part of the lease in the window; reclaimed counts a lease once; a live
// lease has the ledger's figures; a share weighs its part.
func TestSumUsageUtil(t *testing.T) {
	pct := func(f float64) *float64 { return &f }
	end := func(id uint64, at int64, d int, util *float64, idleMS int64, how string) usageRec {
		r := endRec(id, at, d)
		r.Util, r.IdleMS = util, idleMS
		if how != "" {
			r.How = how
		}
		return r
	}
	share := startRec(5, 0, "carol", wire.KindInline, 5)
	share.Share = 0.5
	recs := []usageRec{
		// bob: 2 devices, 3600 s each, 10% busy, idle 1800 s, reclaimed.
		startRec(1, 0, "bob", wire.KindInline, 0, 1),
		end(1, 3600_000, 0, pct(10), 1800_000, endReclaimed),
		end(1, 3600_000, 1, pct(10), 1800_000, endReclaimed),
		// bob: 1 device, 3600 s, 70% busy.
		startRec(2, 0, "bob", wire.KindInline, 2),
		end(2, 3600_000, 2, pct(70), 0, ""),
		// bob: 1 device, 3600 s, never sampled: device time only.
		startRec(3, 0, "bob", wire.KindInline, 3),
		end(3, 3600_000, 3, nil, 0, ""),
		// alice: live since 0, the ledger's figures: 90%, idle 360 s.
		startRec(4, 0, "alice", wire.KindInline, 4),
		// carol: half a device, 0% busy, idle all its 3600 s.
		share,
		end(5, 3600_000, 5, pct(0), 3600_000, ""),
	}
	live := func(id uint64) bool { return id == 4 }
	figs := func(id uint64) (*float64, int64) {
		if id == 4 {
			return pct(90), 360_000
		}
		return nil, 0
	}
	rep := sumUsage([][]usageRec{recs}, time.UnixMilli(0), time.UnixMilli(3600_000), "", live, figs)
	if !rep.Sampled {
		t.Errorf("report not marked sampled")
	}
	got := map[string]wire.UsageRow{}
	for _, r := range rep.Rows {
		got[r.User] = r
	}
	check := func(user string, busy float64, idleH float64, reclaimed int) {
		t.Helper()
		r := got[user]
		if r.Busy == nil || math.Abs(*r.Busy-busy) > 1e-9 || math.Abs(r.IdleDeviceHours-idleH) > 1e-9 || r.Reclaimed != reclaimed {
			t.Errorf("%s: busy %v, idle %v h, reclaimed %d; want %v, %v, %d", user, r.Busy, r.IdleDeviceHours, r.Reclaimed, busy, idleH, reclaimed)
		}
	}
	check("bob", (10+10+70)/3.0, 1, 1) // two idle half hours; one lease reclaimed
	check("alice", 90, 0.1, 0)
	check("carol", 0, 0.5, 0)
	// Half the window: half of each lease's idle time.
	rep = sumUsage([][]usageRec{recs}, time.UnixMilli(1800_000), time.UnixMilli(3600_000), "bob", live, figs)
	if len(rep.Rows) != 1 || math.Abs(rep.Rows[0].IdleDeviceHours-0.5) > 1e-9 {
		t.Errorf("bob's last half hour: %+v", rep.Rows)
	}
}

// TestSumUsageByDevice: summed by device, each device of a lease counts
// the lease once, its own device time, busy share, idle time and reclaim
// (a share its part); the rows come in the devices' order, named by the
// name given, with no user or kind; the leases summed past a user's rate
// name no device and make a row of their own, last; the per-device rows
// add up to the per-user ones.
func TestSumUsageByDevice(t *testing.T) {
	pct := func(f float64) *float64 { return &f }
	end := func(id uint64, at int64, d int, util *float64, idleMS int64, how string) usageRec {
		r := endRec(id, at, d)
		r.Util, r.IdleMS = util, idleMS
		if how != "" {
			r.How = how
		}
		return r
	}
	share := startRec(3, 0, "carol", wire.KindInline, 2)
	share.Share = 0.5
	recs := []usageRec{
		// bob: npu0 and npu1, 3600 s each, 10% busy, idle 1800 s, reclaimed.
		startRec(1, 0, "bob", wire.KindInline, 0, 1),
		end(1, 3600_000, 1, pct(10), 1800_000, endReclaimed),
		end(1, 3600_000, 0, pct(10), 1800_000, endReclaimed),
		// alice: npu1 after bob, 3600 s, 70% busy.
		startRec(2, 3600_000, "alice", wire.KindInline, 1),
		end(2, 7200_000, 1, pct(70), 0, ""),
		// carol: half of npu2, 0% busy, idle all its 3600 s.
		share,
		end(3, 3600_000, 2, pct(0), 3600_000, ""),
		// dave: 4 leases past the rate, 7200 s of device time, no device.
		{T: 7200_000, Ev: "sum", User: "dave", Kind: wire.KindInline, Pool: "default", From: 0, Leases: 4, DevMS: 7200_000},
	}
	name := func(id int) string { return "npu" + strconv.Itoa(id) }
	live := func(uint64) bool { return false }
	rep := sumUsageBy([][]usageRec{recs}, time.UnixMilli(0), time.UnixMilli(7200_000), "", wire.UsageByDevice, name, live, noFigs)
	if rep.By != wire.UsageByDevice || !rep.Sampled {
		t.Errorf("report by %q, sampled %v; want by device, sampled", rep.By, rep.Sampled)
	}
	type want struct {
		device      string
		leases      int
		hours, busy float64
		idleH       float64
		reclaimed   int
	}
	wants := []want{
		{"npu0", 1, 1, 10, 0.5, 1},
		{"npu1", 2, 2, 40, 0.5, 1}, // (10 + 70) / 2
		{"npu2", 1, 0.5, 0, 0.5, 0},
		{"", 4, 2, -1, 0, 0}, // the summed leases: no device, no figures
	}
	if len(rep.Rows) != len(wants) {
		t.Fatalf("rows %+v, want %d", rep.Rows, len(wants))
	}
	for i, w := range wants {
		r := rep.Rows[i]
		busyOK := (w.busy < 0 && r.Busy == nil) || (r.Busy != nil && math.Abs(*r.Busy-w.busy) < 1e-9)
		if r.Device != w.device || r.User != "" || r.Kind != "" || r.Pool != "default" || r.Leases != w.leases ||
			math.Abs(r.DeviceHours-w.hours) > 1e-9 || !busyOK || math.Abs(r.IdleDeviceHours-w.idleH) > 1e-9 || r.Reclaimed != w.reclaimed {
			t.Errorf("row %d = %+v (busy %v), want %+v", i, r, r.Busy, w)
		}
	}
	// The same records by user: the device-hours and idle hours add up.
	byUser := sumUsage([][]usageRec{recs}, time.UnixMilli(0), time.UnixMilli(7200_000), "", live, noFigs)
	var hu, hd, iu, id float64
	for _, r := range byUser.Rows {
		hu, iu = hu+r.DeviceHours, iu+r.IdleDeviceHours
	}
	for _, r := range rep.Rows {
		hd, id = hd+r.DeviceHours, id+r.IdleDeviceHours
	}
	if math.Abs(hu-hd) > 1e-9 || math.Abs(iu-id) > 1e-9 {
		t.Errorf("by user %v h (idle %v), by device %v h (idle %v): they differ", hu, iu, hd, id)
	}
	// One user's leases only, by device.
	rep = sumUsageBy([][]usageRec{recs}, time.UnixMilli(0), time.UnixMilli(7200_000), "alice", wire.UsageByDevice, name, live, noFigs)
	if len(rep.Rows) != 1 || rep.Rows[0].Device != "npu1" || rep.Rows[0].DeviceHours != 1 {
		t.Errorf("alice's by device: %+v", rep.Rows)
	}
}
