package board

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// TestLeaseHistoryBounds: the lease-history request over the broker's
// socket, from an accounting log of 10,050 leases of the last day and 5
// of 8 days ago: the newest 10,000 entries, in as many replies as they
// take, cut said; nothing older than 7 days, even asked for 30; a start
// in the future refused.
func TestLeaseHistoryBounds(t *testing.T) {
	br := harness.NewBroker(t, harness.FakeConfig(4))
	if err := os.MkdirAll(br.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	now := time.Now().Add(-time.Minute).UnixMilli()
	rec := func(id int, start, end int64) {
		fmt.Fprintf(&buf, `{"t":%d,"ev":"start","lease":%d,"kind":"inline","user":"u%d","uid":%d,"pool":"default","devices":[%d]}`+"\n", start, id, id%7, 20000+id%7, id%4)
		fmt.Fprintf(&buf, `{"t":%d,"ev":"end","lease":%d,"device":%d,"how":"released"}`+"\n", end, id, id%4)
	}
	old := now - (8 * 24 * time.Hour).Milliseconds()
	for i := range 5 {
		rec(1+i, old+int64(i), old+int64(i)+1000)
	}
	const n = 10050
	for i := range n {
		start := now - (23 * time.Hour).Milliseconds() + int64(i)*1000
		rec(100+i, start, start+500)
	}
	if err := os.WriteFile(filepath.Join(br.StateDir, "usage.log"), buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	br.Start()
	c := br.Dial()
	rep, err := c.LeaseHistory(wire.HistoryQuery{SinceMS: time.Now().Add(-30 * 24 * time.Hour).UnixMilli()})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Entries) != wire.MaxHistoryEntries || !rep.Cut {
		t.Fatalf("%d entries, cut %v; want %d, cut", len(rep.Entries), rep.Cut, wire.MaxHistoryEntries)
	}
	if first, last := rep.Entries[0], rep.Entries[len(rep.Entries)-1]; first.Lease != 100+n-wire.MaxHistoryEntries || last.Lease != 100+n-1 {
		t.Errorf("leases %d to %d, want the newest: %d to %d", first.Lease, last.Lease, 100+n-wire.MaxHistoryEntries, 100+n-1)
	}
	if span := rep.Until - rep.Since; span > (wire.MaxHistorySpan + time.Minute).Milliseconds() {
		t.Errorf("the history spans %v, more than %v", time.Duration(span)*time.Millisecond, wire.MaxHistorySpan)
	}
	rep, err = c.LeaseHistory(wire.HistoryQuery{SinceMS: time.Now().Add(-30 * 24 * time.Hour).UnixMilli(), Max: 10})
	if err != nil || len(rep.Entries) != 10 || rep.Entries[9].Lease != 100+n-1 {
		t.Errorf("at most 10: %v, %+v", err, rep)
	}
	c2 := br.Dial()
	if _, err := c2.LeaseHistory(wire.HistoryQuery{SinceMS: time.Now().Add(time.Hour).UnixMilli()}); err == nil {
		t.Errorf("a start in the future was answered")
	}
}
