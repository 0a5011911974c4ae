package broker

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/npurun/npurun/wire"
)

// partsBefore is how the replies were cut before encodeInParts: each
// item marshalled to measure it, then the reply with its part marshalled
// whole. encodeInParts must send the same bytes.
func partsBefore[T any](items []T, reply func(part []T, more bool) any) [][]byte {
	var out [][]byte
	for {
		n, size := 0, 1024
		for n < len(items) && size < wire.MaxMessage/2 {
			b, _ := json.Marshal(&items[n])
			size += len(b) + 1
			n++
		}
		part := items[:n]
		items = items[n:]
		data, err := json.Marshal(reply(part, len(items) > 0))
		if err != nil {
			panic(err)
		}
		out = append(out, data)
		if len(items) == 0 {
			return out
		}
	}
}

func collect[T any](t *testing.T, items []T, key string, reply func(part []T, more bool) any) [][]byte {
	t.Helper()
	var got [][]byte
	if err := encodeInParts(items, key, reply, func(b []byte) error {
		got = append(got, b)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// The usage and lease-history replies are the same bytes as before, cut
// at the same rows, however many parts they take, none over the cap.
func TestEncodeInPartsAsBefore(t *testing.T) {
	for _, n := range []int{0, 1, 7, 3000} {
		rows := make([]wire.UsageRow, n)
		entries := make([]wire.HistoryEntry, n)
		for i := range rows {
			rows[i] = wire.UsageRow{User: fmt.Sprintf("user-<%d>-%s", i, strings.Repeat("é", i%40)), Kind: "lease", Pool: "default", DeviceHours: float64(i) / 3}
			entries[i] = wire.HistoryEntry{Lease: uint64(i), Device: i % 8, Name: fmt.Sprintf("npu%d", i%8)}
		}
		usage := &wire.UsageReport{Since: 1, Until: 2, Rows: rows, By: "user & \"device\""}
		if n == 0 {
			usage.Rows = nil
		}
		usageReply := func(part []wire.UsageRow, more bool) any {
			p := *usage
			p.Rows = part
			return &wire.Reply{V: wire.Version, Type: wire.TypeUsage, Usage: &p, More: more}
		}
		history := &wire.HistoryReport{Since: 1, Until: 2, Entries: entries, Cut: true}
		historyReply := func(part []wire.HistoryEntry, more bool) any {
			p := *history
			p.Entries = part
			return &wire.Reply{V: wire.Version, Type: wire.TypeLeaseHistory, History: &p, More: more}
		}
		for name, pair := range map[string][2][][]byte{
			"usage":   {collect(t, usage.Rows, "rows", usageReply), partsBefore(usage.Rows, usageReply)},
			"history": {collect(t, entries, "entries", historyReply), partsBefore(entries, historyReply)},
		} {
			got, want := pair[0], pair[1]
			if len(got) != len(want) {
				t.Fatalf("%s of %d: %d parts, want %d", name, n, len(got), len(want))
			}
			for i := range got {
				if string(got[i]) != string(want[i]) {
					t.Fatalf("%s of %d, part %d:\n%.300s\nwant\n%.300s", name, n, i, got[i], want[i])
				}
				if len(got[i]) > wire.MaxMessage {
					t.Errorf("%s of %d, part %d: %d bytes, over %d", name, n, i, len(got[i]), wire.MaxMessage)
				}
			}
			if n == 3000 && len(got) < 2 {
				t.Errorf("%s of %d: one part; the test wants several", name, n)
			}
		}
	}
}

// counted counts its encodings.
type counted struct {
	N     int
	calls *int
}

func (c counted) MarshalJSON() ([]byte, error) {
	*c.calls++
	return json.Marshal(c.N)
}

// Each item is marshalled once (it was twice: to measure, then to send).
func TestEncodeInPartsMarshalsOnce(t *testing.T) {
	calls := 0
	items := make([]counted, 20000)
	for i := range items {
		items[i] = counted{N: i, calls: &calls}
	}
	type msg struct {
		Rows []counted `json:"rows"`
		More bool      `json:"more,omitempty"`
	}
	got := collect(t, items, "rows", func(part []counted, more bool) any { return &msg{Rows: part, More: more} })
	if calls != len(items) {
		t.Errorf("%d items marshalled %d times, want once each", len(items), calls)
	}
	if len(got) < 2 {
		t.Fatalf("%d parts; the test wants several", len(got))
	}
	var all []int
	for _, b := range got {
		var m struct {
			Rows []int `json:"rows"`
		}
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("part %.100s: %v", b, err)
		}
		all = append(all, m.Rows...)
	}
	for i, v := range all {
		if v != i {
			t.Fatalf("item %d came back as %d", i, v)
		}
	}
	if len(all) != len(items) {
		t.Errorf("%d items came back, want %d", len(all), len(items))
	}
}
