package wire

// Draining a device: an administrator takes a device out of the line's
// service (a fault, maintenance) without stopping the broker.
//
//	npubroker drain (uid 0)                     npubroker
//	  │ ── {"op":"drain","device":"npu3",        │ root only (SO_PEERCRED); "device" is
//	  │     "reason":"ECC errors"} ────────────▶ │ "npu3", "gpu3" or "3"; written to the
//	  │ ◀── {"type":"drained","drain":{…}} ───── │ state directory before it takes effect:
//	  │                                          │ no new lease on it, its holder runs on
//	  │ ── {"op":"undrain","device":"npu3"} ───▶ │
//	  │ ◀── {"type":"drained","drain":{…}} ───── │ "drained": false, and the line is served
//	  │ ◀── {"type":"error","code":"denied"|"no-such-device",…}
//
// The board (status.go) shows a drained device's Drain; its state is
// DeviceDrained while no lease holds it.

import "fmt"

// Drain operations, their reply, and a drained device's state on the board.
const (
	OpDrain       = "drain"
	OpUndrain     = "undrain"
	TypeDrained   = "drained"
	DeviceDrained = "drained" // drained, and no lease holds it
)

// DrainInfo is a device's drain: on the board, and in drain's answer.
type DrainInfo struct {
	Device  string `json:"device,omitempty"` // drain's answer: "npu3"
	Drained bool   `json:"drained"`          // false: not drained (undrain's answer)
	By      string `json:"by,omitempty"`     // who drained it
	Reason  string `json:"reason,omitempty"`
	Since   int64  `json:"since,omitempty"`  // Unix ms
	Leased  bool   `json:"leased,omitempty"` // drain's answer: a lease holds it still, and runs on to its end
	Was     bool   `json:"was,omitempty"`    // it was drained before this request
}

// Drain drains device (npu3, gpu3 or 3) with reason.
func (c *Conn) Drain(device, reason string) (*DrainInfo, error) {
	return c.drainOp(&Request{Op: OpDrain, Device: device, Reason: reason})
}

// Undrain puts device back in service.
func (c *Conn) Undrain(device string) (*DrainInfo, error) {
	return c.drainOp(&Request{Op: OpUndrain, Device: device})
}

func (c *Conn) drainOp(req *Request) (*DrainInfo, error) {
	r, err := c.call(req)
	if err != nil {
		return nil, err
	}
	if r.Type != TypeDrained || r.Drain == nil {
		return nil, fmt.Errorf("unexpected reply %q to %s", r.Type, req.Op)
	}
	return r.Drain, nil
}
