package wire

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/exitcode"
)

// Hint is the next step to suggest to a person after err from Dial or a
// request: for ErrNoBroker, to root how to start the broker, as fits this
// machine (systemctl where systemd runs it, npubroker serve where not),
// and to anyone else to ask their administrator, who starts it; for
// ErrNoAnswer, or a broker that went away before it answered (Gone), to
// root where its log is, and to anyone else to try again or tell their
// administrator. It is "" for any other error. npurun, task-submit and
// npubroker status all say it.
func Hint(err error) string {
	systemd := Systemd()
	root := os.Geteuid() == 0
	switch {
	case errors.Is(err, ErrNoBroker) && !root:
		return "the broker is not running: ask your administrator to start it, or point NPURUN_SOCKET at a running one"
	case errors.Is(err, ErrNoBroker) && systemd:
		return "start the broker with 'systemctl start npubroker', or point NPURUN_SOCKET at a running one"
	case errors.Is(err, ErrNoBroker):
		return "start the broker as root with 'npubroker serve' (npubroker(8), WITHOUT SYSTEMD), or point NPURUN_SOCKET at a running one"
	case errors.Is(err, ErrNoAnswer) && !root:
		return "the broker may be overloaded or stuck: try again later, or tell your administrator"
	case errors.Is(err, ErrNoAnswer) && systemd:
		return "the broker may be overloaded or stuck: see 'journalctl -u npubroker'"
	case errors.Is(err, ErrNoAnswer):
		return "the broker may be overloaded or stuck: see its log (its standard error, or the system log)"
	case Gone(err) && !root:
		return "it may be restarting, or failing: try again later, or tell your administrator"
	case Gone(err) && systemd:
		return "it may be restarting, or failing: try again, or see 'journalctl -u npubroker'"
	case Gone(err):
		return "it may be restarting, or failing: try again, or see its log (its standard error, or the system log)"
	}
	return ""
}

// Systemd tells whether systemd runs this machine, as sd_booted(3) does:
// /run/systemd/system is a directory.
func Systemd() bool {
	var st unix.Stat_t
	return unix.Stat("/run/systemd/system", &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR
}

// ExitStatus is the exit status of npurun, task-submit and npubroker's
// client commands for err, an error from Dial or a request (the table is
// package exitcode's): a broker's refusal by its code (busy and too-many,
// such as its connection cap: try again later; denied: not allowed; a
// request it calls malformed, an unknown pool or device: usage); no broker,
// none that answers, or one that went away before it answered:
// unavailable; anything else a failure.
func ExitStatus(err error) int {
	var be *Error
	switch {
	case err == nil:
		return exitcode.OK
	case errors.As(err, &be):
		switch be.Code {
		case CodeBusy, CodeTooMany, CodeSpool:
			return exitcode.TempFail
		case CodeDenied:
			return exitcode.Denied
		case CodeBadRequest, CodeNoSuchPool, CodeNoDevice:
			return exitcode.Usage
		}
		return exitcode.Failure
	case errors.Is(err, ErrSubmitUnknown):
		return exitcode.Unknown
	case errors.Is(err, ErrTimeout):
		return exitcode.TempFail
	case errors.Is(err, ErrNoBroker), errors.Is(err, ErrNoAnswer), Gone(err):
		return exitcode.Unavailable
	}
	return exitcode.Failure
}
