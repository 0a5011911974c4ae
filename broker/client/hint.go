package client

import (
	"errors"

	"golang.org/x/sys/unix"
)

// Hint is the next step to suggest to a person after err from Dial or a
// request: for ErrNoBroker, how to start the broker, as fits this machine
// (systemctl where systemd runs it, npubroker serve where not); for
// ErrNoAnswer, where its log is. It is "" for any other error. npurun,
// task-submit and npubroker status all say it.
func Hint(err error) string {
	systemd := Systemd()
	switch {
	case errors.Is(err, ErrNoBroker) && systemd:
		return "start the broker with 'systemctl start npubroker', or point NPURUN_SOCKET at a running one"
	case errors.Is(err, ErrNoBroker):
		return "start the broker as root with 'npubroker serve' (npubroker(8), WITHOUT SYSTEMD), or point NPURUN_SOCKET at a running one"
	case errors.Is(err, ErrNoAnswer) && systemd:
		return "the broker may be overloaded or stuck: see 'journalctl -u npubroker'"
	case errors.Is(err, ErrNoAnswer):
		return "the broker may be overloaded or stuck: see its log (its standard error, or the system log)"
	}
	return ""
}

// Systemd tells whether systemd runs this machine, as sd_booted(3) does:
// /run/systemd/system is a directory.
func Systemd() bool {
	var st unix.Stat_t
	return unix.Stat("/run/systemd/system", &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR
}
