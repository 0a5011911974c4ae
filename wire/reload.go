package wire

// Reloading the configuration: an administrator changes npurun.conf and
// the broker takes it up without a restart (npubroker reload, systemctl
// reload, SIGHUP).
//
//	npubroker reload (uid 0)                    npubroker
//	  │ ── {"op":"reload"} ───────────────────▶ │ root only (SO_PEERCRED); reads the file it
//	  │                                         │ was started with, validates it, refuses a
//	  │                                         │ change that needs a restart by name, then
//	  │                                         │ hands each room its part
//	  │ ◀── {"type":"reloaded","reload":{…}} ── │ taken: what changed, the waiters it refused
//	  │ ◀── {"type":"error","code":"config-refused"|"denied",…}
//
// npubroker check-config, as root where a broker answers, sends
// {"op":"reload","check":"/abs/FILE"}: the broker checks FILE as a reload
// of its own would take it, takes nothing, and answers as above.
//
// A waiter that the new configuration refuses gets its own error reply,
// code "denied", on its connection.

import "fmt"

// The reload operation, its reply, and its refusal.
const (
	OpReload          = "reload"
	TypeReloaded      = "reloaded"
	CodeConfigRefused = "config-refused" // the file does not validate, or changes what needs a restart
)

// ReloadInfo is what a reload did.
type ReloadInfo struct {
	Config  string   `json:"config"`            // the file read
	Changed []string `json:"changed,omitempty"` // the tables that changed: "[limits]", "[pools]"
	Refused int      `json:"refused,omitempty"` // requests waiting in line that the new configuration refused (told, ended)
}

// Reload asks the broker to read its configuration file again.
func (c *Conn) Reload() (*ReloadInfo, error) {
	r, err := c.call(&Request{Op: OpReload})
	if err != nil {
		return nil, err
	}
	if r.Type != TypeReloaded || r.Reload == nil {
		return nil, fmt.Errorf("unexpected reply %q to reload", r.Type)
	}
	return r.Reload, nil
}

// CheckReload asks the broker whether a reload would take the
// configuration file at path (absolute), taking nothing: what it would
// change, or the broker's refusal (code config-refused).
func (c *Conn) CheckReload(path string) (*ReloadInfo, error) {
	r, err := c.call(&Request{Op: OpReload, Check: path})
	if err != nil {
		return nil, err
	}
	if r.Type != TypeReloaded || r.Reload == nil {
		return nil, fmt.Errorf("unexpected reply %q to reload", r.Type)
	}
	return r.Reload, nil
}
