package broker

import (
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/internal/printable"
	"github.com/npurun/npurun/internal/quantity"
)

// The broker's log. Every line of it passes through one writer (Log), which
// makes the line printable as the status table makes its cells
// (printable.String: control characters, a newline inside a message,
// bytes that are not UTF-8 become '?') and cuts it at MaxLogLine, so that
// no call site can let a user's text — a command line, a process name,
// a path — forge a line of the log or drive the reader's terminal.
//
// Where the lines go (LogTo): standard error, or the system log (syslog's
// /dev/log, which journald serves too). In "auto", the default, the
// broker writes to standard error unless it goes nowhere (closed, or
// /dev/null, as a daemon started by a System V script or start-stop-daemon
// has it), and then to /dev/log where something listens there. Under
// systemd standard error is the journal's stream already (and a terminal
// or a file is someone's), so the broker never writes a line twice.

// Where the log goes.
const (
	LogAuto   = "auto"
	LogStderr = "stderr"
	LogSyslog = "syslog"
)

// MaxLogLine caps one line of the log, in bytes: a longer one is cut, and
// ends with "…".
const MaxLogLine = 4096

// SyslogSocket is where the system log listens.
const SyslogSocket = "/dev/log"

// NewLog returns the broker's logger, writing as to says: LogAuto,
// LogStderr or LogSyslog; the second result names where the lines go.
// LogSyslog fails where nothing listens at SyslogSocket; LogAuto falls
// back to standard error.
func NewLog(to string) (*log.Logger, string, error) {
	switch to {
	case LogStderr:
	case LogAuto, LogSyslog:
		if to == LogAuto && !stderrGoesNowhere() {
			break
		}
		sl, err := dialSyslog(SyslogSocket, "npubroker")
		if err == nil {
			return newSyslogLogger(sl), "the system log (" + SyslogSocket + ")", nil
		}
		if to == LogSyslog {
			return nil, "", err
		}
	default:
		return nil, "", fmt.Errorf("log to %q: want auto, stderr or syslog", to)
	}
	return StderrLog(os.Stderr), "standard error", nil
}

// StderrLog is a logger to w whose every line is made printable and cut
// as the broker's log is, prefixed "npubroker: ".
func StderrLog(w io.Writer) *log.Logger {
	return log.New(&logWriter{w: w, nl: true}, "npubroker: ", 0)
}

// newSyslogLogger is a logger to sw, each line made printable and cut as
// the broker's log is; syslog names the program, so no prefix.
func newSyslogLogger(sw *syslogWriter) *log.Logger {
	return log.New(&logWriter{w: sw}, "", 0)
}

// logWriter is the writer every line of the broker's log passes through:
// log.Logger writes each message with one Write (and its own lock held),
// ending in one newline.
type logWriter struct {
	w  io.Writer
	nl bool // end each line with a newline (not for syslog's datagrams)
}

func (lw *logWriter) Write(p []byte) (int, error) {
	line := LogLine(strings.TrimSuffix(string(p), "\n"))
	if lw.nl {
		line += "\n"
	}
	_, err := io.WriteString(lw.w, line)
	return len(p), err
}

// LogLine is msg as the broker's log writes it: made printable, and cut
// at MaxLogLine bytes (on a character's boundary, ending in "…").
func LogLine(msg string) string {
	msg = printable.String(msg)
	if len(msg) <= MaxLogLine {
		return msg
	}
	cut := MaxLogLine - len("…")
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "…"
}

// stderrGoesNowhere tells whether standard error is closed or /dev/null.
func stderrGoesNowhere() bool {
	var st unix.Stat_t
	if err := unix.Fstat(2, &st); err != nil {
		return errors.Is(err, unix.EBADF)
	}
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && unix.Major(st.Rdev) == 1 && unix.Minor(st.Rdev) == 3
}

// syslogWriter sends each line as one datagram to the system log, in the
// local form glibc's syslog(3) uses: <PRI>Mmm dd hh:mm:ss TAG[PID]: MSG,
// facility daemon, severity warning for a line that starts "warning:",
// info otherwise. It never blocks the broker: a line the system log has
// no room for is dropped and counted, and the next line that gets through
// says how many were; a system log that restarted is connected to again.
type syslogWriter struct {
	path, tag string

	mu      sync.Mutex
	fd      int // -1 when not connected
	dropped int
}

const (
	logDaemon  = 3 << 3
	logWarning = 4
	logInfo    = 6
)

func dialSyslog(path, tag string) (*syslogWriter, error) {
	sw := &syslogWriter{path: path, tag: tag, fd: -1}
	if err := sw.connect(); err != nil {
		return nil, fmt.Errorf("log to the system log: %w", err)
	}
	return sw, nil
}

func (sw *syslogWriter) connect() error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: sw.path}); err != nil {
		unix.Close(fd)
		return fmt.Errorf("connect %s: %w", sw.path, err)
	}
	sw.fd = fd
	return nil
}

func (sw *syslogWriter) Write(p []byte) (int, error) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	msg := string(p)
	if sw.dropped > 0 {
		msg = quantity.Count(sw.dropped, "line", "lines") + " of this log dropped (the system log took none); " + msg
	}
	sev := logInfo
	if strings.HasPrefix(string(p), "warning:") {
		sev = logWarning
	}
	pkt := "<" + strconv.Itoa(logDaemon|sev) + ">" + time.Now().Format(time.Stamp) + " " + sw.tag + "[" + strconv.Itoa(os.Getpid()) + "]: " + msg
	err := sw.send(pkt)
	if err != nil && !errors.Is(err, unix.EAGAIN) {
		// The system log restarted (its socket is a new one), or went:
		// connect again, once.
		if sw.fd >= 0 {
			unix.Close(sw.fd)
			sw.fd = -1
		}
		if err = sw.connect(); err == nil {
			err = sw.send(pkt)
		}
	}
	if err != nil {
		sw.dropped++
		return len(p), err
	}
	sw.dropped = 0
	return len(p), nil
}

func (sw *syslogWriter) send(pkt string) error {
	if sw.fd < 0 {
		return unix.ENOTCONN
	}
	for {
		err := unix.Send(sw.fd, []byte(pkt), unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
