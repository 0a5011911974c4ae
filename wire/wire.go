// Package wire is the broker's protocol: the message types, their framing and
// the descriptors they carry, and the Go client that speaks it (Conn). Every
// program that talks to npubroker imports it, npubroker too; it imports only
// the standard library, x/sys/unix and small internal/ helpers (npurun's
// start path is hot: no encoding/json, no net; see jsoncodec) and must never
// import the daemon (broker/...). The diagram below is every exchange.
package wire

// The whole exchange between a client (npurun, later task-submit and the PAM
// module) and npubroker. One Unix socket of type SOCK_SEQPACKET; every
// message is one JSON object in one packet, at most MaxMessage bytes, with a
// protocol version "v". Descriptors travel as SCM_RIGHTS ancillary data in
// the same sendmsg as the grant that names them, one per device, in the
// order of the grant's "devices".
//
//	client                                   npubroker
//	  │ ── connect ──────────────────────────▶ │ identity: SO_PEERCRED only
//	  │ ── {"op":"acquire","n":1,"pool":…} ──▶ │ policy check, enqueue
//	  │ ◀── {"type":"queued","position":3,…} ─ │ again whenever it changes
//	  │ ◀── {"type":"queued","position":1} ─── │
//	  │ ◀── {"type":"grant","devices":[5],…} ─ │ + SCM_RIGHTS: npu5.lock, flock(LOCK_EX) held
//	  │   (the client now holds the lock; it  │ broker closes its copy and waits
//	  │    clears FD_CLOEXEC and execs)        │ in flock on a second open file
//	  │                                        │
//	  │ ── {"op":"ping"} ────────────────────▶ │
//	  │ ◀── {"type":"pong"} ────────────────── │
//	  │                                        │
//	  │ ── garbage / oversized / bad version ▶ │
//	  │ ◀── {"type":"error","code":"bad-request"} and the broker closes the connection
//
// A client cancels a wait by closing the connection. After a grant the same
// connection may ask again. The task exchange is in tasks.go; status and
// usage, who holds what and who used how much, in status.go; Slurm's
// Prolog, Epilog and SPANK plugin, in slurm.go; containers, and the
// leases they hold, in container.go.
//
// Sessions: pam_npurun.so (as root, on behalf of the user logging in) and
// npurun --login (as the user) ask what a login session gets. The broker
// decides from [restrict]; the client only carries the verdict out.
//
//	pam_npurun.so (uid 0)                      npubroker
//	  │ ── {"op":"session","user":"alice",     │ "user" is taken from uid 0 only (anyone
//	  │     "service":"login","tty":"tty1",    │ else: denied), resolved through NSS;
//	  │     "rhost":"","login":true} ────────▶ │ service, tty, rhost: the session's origin
//	  │ ◀── {"type":"ignore"} ──────────────── │ not restricted: PAM_IGNORE
//	  │ ◀── {"type":"hide","env":[…]} ──────── │ restricted, no lease: devices hidden
//	  │ ◀── {"type":"queued","wait_ms":30000} ─│ on_busy = "wait 30s": the answer comes
//	  │                                        │ within wait_ms (the client's deadline grows)
//	  │ ◀── {"type":"grant","devices":[4],     │ + SCM_RIGHTS, as for acquire; the broker
//	  │      "env":[…],"message":"npu 4 is…"}  │ added user:alice:rw to the nodes' ACLs first
//	  │ ◀── {"type":"hide","env":[…],"message"}│ nothing free (on_busy "hide", or the wait ran out)
//	  │ ◀── {"type":"error","code":"busy"|"denied","message":…}   session refused
//
// "login": false asks for no lease (a session that may be a command, scp,
// sftp: sshd's); the verdict is then ignore or hide. The session-policy
// file (SessionPolicyFile, beside the socket) says what to do while no
// broker answers.

import (
	"errors"
	"fmt"
	"github.com/npurun/npurun/internal/quantity"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Version is the protocol version every message carries.
const Version = 1

// MaxMessage is the hard cap on one message, in bytes.
const MaxMessage = 64 << 10

// MaxDevices is the most devices (and so descriptors) one grant carries.
const MaxDevices = 64

// Operations a client asks for.
const (
	OpAcquire = "acquire"
	OpPing    = "ping"
	OpSession = "session"
)

// Reply types.
const (
	TypeQueued = "queued"
	TypeGrant  = "grant"
	TypeError  = "error"
	TypePong   = "pong"
	TypeIgnore = "ignore" // session: not a restricted account
	TypeHide   = "hide"   // session: no lease, devices hidden
	// TypeEnded: Slurm ended job SlurmJob, the placeholder allocation of
	// the lease granted on this connection (allocate mode: scancel, its
	// time limit, preemption), or the broker ended that lease for another
	// reason (Slurm gave its devices to another job); Message says which.
	// The lease's processes are being ended. Sent once, after a grant that named SlurmJob, to an npurun that
	// kept its connection open.
	TypeEnded = "ended"
)

// Error codes carried by a reply of type "error".
const (
	CodeBadRequest = "bad-request" // malformed, oversized or unknown message
	CodeBusy       = "busy"        // nothing free and the client asked not to wait
	CodeDenied     = "denied"      // policy forbids the request
	CodeTooMany    = "too-many"    // a cap on waiters or connections was reached
	CodeNoSuchPool = "no-such-pool"
	CodeNoDevice   = "no-such-device"
	CodeNoAccess   = "no-access" // the broker could not open the devices' nodes to the user
)

// Request is a message from a client.
type Request struct {
	V       int    `json:"v"`
	Op      string `json:"op"`
	N       int    `json:"n,omitempty"`        // devices wanted (acquire)
	Pool    string `json:"pool,omitempty"`     // pool to take them from; "" is the default pool
	Devices []int  `json:"devices,omitempty"`  // exactly these physical ids
	NoWait  bool   `json:"no_wait,omitempty"`  // fail with "busy" instead of queueing
	Mem     int64  `json:"mem,omitempty"`      // a share of each device: the device memory declared, in MiB (npurun --mem); 0: whole devices
	TimeSec int64  `json:"time_sec,omitempty"` // a time limit, in seconds (npurun --time): the lease ends after it as a task's does; 0: none

	// sessions (and acquire on behalf of another user)
	User    string `json:"user,omitempty"`    // the account asked for; only uid 0 may name one
	Service string `json:"service,omitempty"` // PAM service (sshd, login, su-l)
	TTY     string `json:"tty,omitempty"`
	RHost   string `json:"rhost,omitempty"` // remote host
	Login   bool   `json:"login,omitempty"` // an interactive login shell: wants the login lease

	// tasks
	Task   *Submission `json:"task,omitempty"`     // submit
	ID     uint64      `json:"id,omitempty"`       // show, cancel, wait, task-done
	All    bool        `json:"all,omitempty"`      // list: everyone's
	After  uint64      `json:"after,omitempty"`    // list: the page after this task id (a reply's "next")
	Ended  bool        `json:"ended,omitempty"`    // list: the ended tasks alone, from SinceMS on
	Since  int64       `json:"since_ms,omitempty"` // list --ended, task-history: Unix ms
	Status *Status     `json:"status,omitempty"`   // task-done

	// status, usage (status.go)
	Watch bool        `json:"watch,omitempty"` // status: again after every change
	Usage *UsageQuery `json:"usage,omitempty"`
	// lease-history (leasehistory.go)
	History *HistoryQuery `json:"lease_history,omitempty"`

	// a Slurm job (slurm.go)
	Job *SlurmJob `json:"job,omitempty"`
	// containers (container.go): acquire on a container's behalf (a
	// label on the lease), and the container op (root names any lease,
	// another uid only its own)
	Container *ContainerRef `json:"container,omitempty"`

	// drain, undrain (drain.go); root only
	Device string `json:"device,omitempty"` // "npu3", "gpu3" or "3"
	Reason string `json:"reason,omitempty"`

	// reload: check this configuration file as a reload would take it
	// (an absolute path), and take nothing (npubroker check-config).
	Check string `json:"check,omitempty"`
}

// Reply is a message from the broker.
type Reply struct {
	V    int    `json:"v"`
	Type string `json:"type"`

	// queued
	Pool     string   `json:"pool,omitempty"`
	Position int      `json:"position,omitempty"` // 1 is next in line
	Ahead    []string `json:"ahead,omitempty"`    // users ahead, nearest first, at most a few
	Reason   string   `json:"reason,omitempty"`   // why it waits although first, e.g. a limit
	Start    int64    `json:"start,omitempty"`    // when it starts at the latest (Unix ms), by the time limits of what holds and waits ahead; absent: unknown
	WaitMS   int64    `json:"wait_ms,omitempty"`  // session: the final answer comes within this long

	// grant
	Devices  []int    `json:"devices,omitempty"` // physical ids, one descriptor each, same order
	Vendor   string   `json:"vendor,omitempty"`
	Env      []string `json:"env,omitempty"` // NAME=value entries selecting the devices
	WaitedMS int64    `json:"waited_ms,omitempty"`
	// grant: the Slurm job through which the lease is held (allocate
	// mode's placeholder allocation), 0 for none; ended: the job Slurm
	// ended
	SlurmJob uint32 `json:"slurm_job,omitempty"`
	// grant, backfilled (npubroker(8), Scheduling): its time limit ends
	// it by EndsBy (Unix ms), before the start of Before ("task 118")
	EndsBy int64  `json:"ends_by,omitempty"`
	Before string `json:"before,omitempty"`
	Beside bool   `json:"beside,omitempty"`

	// error
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
	Hint    string `json:"hint,omitempty"`

	// tasks
	ID    uint64     `json:"id,omitempty"`    // submitted
	State string     `json:"state,omitempty"` // submitted: the new task's state (failed at once: its --after did not succeed)
	Tasks []TaskInfo `json:"tasks,omitempty"` // tasks
	More  bool       `json:"more,omitempty"`  // tasks (list): more follow, ask again with "after": Next; usage: another reply follows
	Next  uint64     `json:"next,omitempty"`  // tasks (list): where the next page starts

	// submitted: the submission's token named a task already, and this is
	// that task; no other was made
	Existing bool `json:"existing,omitempty"`

	// status, usage (status.go)
	Board *Board       `json:"board,omitempty"`
	Usage *UsageReport `json:"usage,omitempty"`
	// lease-history (leasehistory.go)
	History *HistoryReport `json:"lease_history,omitempty"`

	// drained (drain.go)
	Drain *DrainInfo `json:"drain,omitempty"`

	// reloaded (reload.go)
	Reload *ReloadInfo `json:"reload,omitempty"`
}

// Ordinal writes a place in line as people read it: 1st, 2nd, 3rd, 11th.
func Ordinal(n int) string {
	suffix := "th"
	switch {
	case n%100 >= 11 && n%100 <= 13:
	case n%10 == 1:
		suffix = "st"
	case n%10 == 2:
		suffix = "nd"
	case n%10 == 3:
		suffix = "rd"
	}
	return strconv.Itoa(n) + suffix
}

// Wanted says what a request asks for, as npurun's progress line and
// status's line say it: n devices ("1 device", "2 devices"), or the n
// named (named: "npu 2,3"; "" when none are), a share's declaration of
// each in front ("12G of 1 device", "8G of each of npu 2,3").
func Wanted(n int, mem int64, named string) string {
	what := named
	if what == "" {
		what = quantity.Count(n, "device", "devices")
	}
	switch {
	case mem <= 0:
		return what
	case n > 1:
		return quantity.Size(mem) + " of each of " + what
	}
	return quantity.Size(mem) + " of " + what
}

// StartBy says when a waiting request starts at the latest, as people
// read it: "starts by 14:05" (a date before the time where it is not
// today), "starts now", or "start unknown" for 0 (something it waits for
// has no time limit). startMS is Unix ms.
func StartBy(startMS int64, now time.Time) string {
	if startMS == 0 {
		return "start unknown"
	}
	at := time.UnixMilli(startMS)
	if !at.After(now) {
		return "starts now"
	}
	if y, m, d := at.Date(); y == now.Year() && m == now.Month() && d == now.Day() {
		return "starts by " + at.Format("15:04")
	}
	return "starts by " + at.Format("Jan 2 15:04")
}

// Backfill says of a backfilled lease (npubroker(8), Scheduling) what it
// went ahead of: the request whose reserved devices it took, that starts
// first.
type Backfill struct {
	EndsBy      int64  `json:"ends_by"`                // Unix ms: its time limit ends it by then
	Before      string `json:"before"`                 // that request: "task 118", "alice's request (pid 4242)"
	BeforeStart int64  `json:"before_start,omitempty"` // its estimated start at the grant, Unix ms
	Beside      bool   `json:"beside,omitempty"`       // it took devices that request will not need by its start, and may end after it
}

// Backfilled is what npurun, status and task-submit show of a backfilled
// lease: "backfilled (ends by 14:05, before task 118's start)", or, for
// one that took devices that request will not need (beside), "backfilled
// (ends by 16:30, beside task 118, which does not need its devices)".
func Backfilled(endsByMS int64, before string, beside bool, now time.Time) string {
	at := time.UnixMilli(endsByMS)
	when := at.Format("15:04")
	if y, m, d := at.Date(); y != now.Year() || m != now.Month() || d != now.Day() {
		when = at.Format("Jan 2 15:04")
	}
	if beside {
		return "backfilled (ends by " + when + ", beside " + before + ", which does not need its devices)"
	}
	if strings.HasPrefix(before, "task ") {
		return "backfilled (ends by " + when + ", before " + before + "'s start)"
	}
	return "backfilled (ends by " + when + ", before the start of " + before + ")"
}

// Error is an error reply from the broker, usable with errors.As.
type Error struct {
	Code    string
	Message string
	Hint    string
}

func (e *Error) Error() string { return e.Message }

// Framing errors.
var (
	ErrTooLarge     = errors.New("message larger than the protocol allows")
	ErrFDsTruncated = errors.New("descriptors dropped in transit (file limit reached?)")
	ErrClosed       = errors.New("connection closed by peer")
)

// Codec encodes and decodes the messages that the lease exchange's own
// codec (codec.go) does not: those of tasks, status, usage and the like.
// Package jsoncodec registers encoding/json as the Codec; npurun, which
// speaks the lease exchange only, links neither.
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// full is the registered Codec, nil in npurun.
var full Codec

// UseCodec makes c the codec of the messages beyond the lease exchange.
func UseCodec(c Codec) { full = c }

// ErrNoCodec means a message beyond the lease exchange came or was to go,
// and no Codec is registered (a program that needs one imports
// wire/jsoncodec).
var ErrNoCodec = errors.New("a message beyond the lease exchange, and no codec for it")

// Encode marshals a message with the registered Codec and checks it
// against MaxMessage.
func Encode(v any) ([]byte, error) {
	if full == nil {
		return nil, ErrNoCodec
	}
	b, err := full.Marshal(v)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxMessage {
		return nil, ErrTooLarge
	}
	return b, nil
}

// SendMsg writes one packet, with fds as SCM_RIGHTS when there are any.
// flags is passed to sendmsg (MSG_NOSIGNAL is always added).
func SendMsg(fd int, b []byte, fds []int, flags int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	for {
		err := unix.Sendmsg(fd, b, oob, nil, flags|unix.MSG_NOSIGNAL)
		if err == unix.EINTR {
			continue
		}
		return err
	}
}

// oobSpace is room for MaxDevices descriptors.
var oobSpace = unix.CmsgSpace(MaxDevices * 4)

// RecvMsg reads one packet into buf with MSG_CMSG_CLOEXEC. It returns the
// payload and any descriptors that came with it. A packet larger than buf
// gives ErrTooLarge; dropped descriptors give ErrFDsTruncated; in both
// cases any descriptors that did arrive are closed. End of stream is
// ErrClosed. flags is added to the recvmsg flags (e.g. MSG_DONTWAIT).
func RecvMsg(fd int, buf, oob []byte, flags int) ([]byte, []int, error) {
	var n, oobn, rflags int
	var err error
	for {
		n, oobn, rflags, _, err = unix.Recvmsg(fd, buf, oob, flags|unix.MSG_CMSG_CLOEXEC)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, nil, err
	}
	var fds []int
	if oobn > 0 {
		fds, err = parseRights(oob[:oobn])
		if err != nil {
			return nil, nil, err
		}
	}
	switch {
	case rflags&unix.MSG_TRUNC != 0:
		closeAll(fds)
		return nil, nil, ErrTooLarge
	case rflags&unix.MSG_CTRUNC != 0:
		closeAll(fds)
		return nil, nil, ErrFDsTruncated
	case n == 0 && len(fds) == 0:
		return nil, nil, ErrClosed
	}
	return buf[:n], fds, nil
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("parse control message: %w", err)
	}
	var fds []int
	for i := range msgs {
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue // not SCM_RIGHTS: nothing to keep
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
