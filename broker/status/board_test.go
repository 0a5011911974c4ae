package status

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/npurun/npurun/wire"
)

// TestEncodeBoardFits: a board too large for one message is cut until it
// fits, and says so.
func TestEncodeBoardFits(t *testing.T) {
	b := &wire.Board{}
	for id := range 4096 {
		d := wire.DeviceState{ID: id, Name: "npu" + strconv.Itoa(id), State: wire.DeviceLeased,
			Lease: &wire.LeaseInfo{User: "alice", Holders: []wire.Holder{{PID: id, Command: strings.Repeat("x", 200)}, {PID: id + 1}}}}
		b.Devices = append(b.Devices, d)
	}
	for range 100 {
		b.Unleased = append(b.Unleased, wire.Unleased{Command: strings.Repeat("y", 200)})
	}
	data := EncodeBoard(b)
	if len(data) > wire.MaxMessage {
		t.Fatalf("board of %d bytes, more than %d", len(data), wire.MaxMessage)
	}
	var r wire.Reply
	if err := json.Unmarshal(data, &r); err != nil || r.Board == nil || !r.Board.Truncated || len(r.Board.Devices) == 0 {
		t.Fatalf("cut board: %v, %+v", err, r.Board)
	}
	small := EncodeBoard(&wire.Board{Devices: []wire.DeviceState{{ID: 0, Name: "npu0", State: wire.DeviceFree}}})
	if strings.Contains(string(small), "truncated") {
		t.Errorf("a small board was cut: %s", small)
	}
}
