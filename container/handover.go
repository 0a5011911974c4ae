package container

// The hand-over: how a lease gets from npurun to the container's runtime.
// npurun holds the lease while the engine's command line runs; the
// engine calls the runtime (npurun-runtime, as Docker's runtime "npurun")
// for `create`, and the runtime takes the lease's descriptors from npurun
// over a Unix socket, then passes them to runc. One Unix socket of type
// SOCK_SEQPACKET in the abstract namespace (no file to clean up, nothing
// a user could link elsewhere), named in the container's environment as
// NPURUN_HANDOVER=@npurun-handover/<32 hex digits>; one text message a
// packet:
//
//	npurun-runtime (create, root)              npurun (the lease's holder)
//	  │ ── connect ────────────────────────────▶ │ peer: uid 0, or npurun's own uid
//	  │                                          │ (a rootless engine's runtime)
//	  │ ── "take 1 <container id>" ────────────▶ │
//	  │ ◀── "lease 1 <vendor> <id,id,…>" ─────── │ + SCM_RIGHTS: one descriptor a device,
//	  │                                          │ in that order; npurun closes its own
//	  │                                          │ copies and the socket: served once
//	  │ ◀── "refused <why>" ──────────────────── │ (a peer of another uid)
//
// The runtime learns the lease's owner from the socket (SO_PEERCRED), never
// from a message, and checks each descriptor against the broker's current
// lock file of its device, with the flock held (wire.HoldsLock), before
// the container gets it. Nobody listening at the address (npurun is gone:
// a restart of the container, or `docker start` later) is ErrGone; so is
// anyone else listening there (the address is no secret: /proc/net/unix
// lists it, the container's environment has it, and once npurun is gone
// any user may bind it): a peer of another uid than the container's
// recorded owner, or one whose lease the broker says is not its uid's.

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
)

// HandoverVar names the variable, in the container's environment, whose
// value is the hand-over's address.
const HandoverVar = "NPURUN_HANDOVER"

// handoverPrefix starts every hand-over address; the runtime connects to
// no other.
const handoverPrefix = "@npurun-handover/"

// maxHandoverMessage caps one hand-over message.
const maxHandoverMessage = 4096

// handoverTimeout bounds a hand-over: npurun's each step once connected,
// the runtime's whole take (a variable for tests).
var handoverTimeout = 10 * time.Second

// refusedWait bounds what npurun waits for the request of a peer it will
// refuse.
const refusedWait = 200 * time.Millisecond

// ErrGone means that nobody serves a hand-over at the address: the npurun
// that held the lease has ended (or never was).
var ErrGone = errors.New("no npurun serves the hand-over")

// Handover serves a lease to the runtime of the container it is for.
type Handover struct {
	Addr    string // "@npurun-handover/…", for NPURUN_HANDOVER
	vendor  string
	devices []int
	fds     []int // copies of the lease's descriptors, close-on-exec
	ln      int
	stopR   int // Stop writes to stopW; Serve polls stopR
	stopW   int
	uid     int // npurun's own uid: a rootless engine's runtime runs as it
	taken   string
}

// NewHandover listens for the runtime that will take the lease of
// devices, held at fds (one each, in that order). It keeps copies of the
// descriptors (close-on-exec), so the caller may close its own.
func NewHandover(vendor string, devices, fds []int) (*Handover, error) {
	if len(devices) != len(fds) || len(devices) == 0 || len(devices) > wire.MaxDevices {
		return nil, fmt.Errorf("hand-over: %d devices and %d descriptors", len(devices), len(fds))
	}
	var name [16]byte
	// getrandom(2) rather than crypto/rand, which npurun would pay for
	// at every start.
	if n, err := unix.Getrandom(name[:], 0); err != nil || n != len(name) {
		return nil, fmt.Errorf("hand-over: name: %w", err)
	}
	h := &Handover{Addr: handoverPrefix + hex.EncodeToString(name[:]), vendor: vendor, devices: devices, ln: -1, stopR: -1, stopW: -1, uid: unix.Getuid()}
	for _, fd := range fds {
		c, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("hand-over: copy descriptor: %w", err)
		}
		h.fds = append(h.fds, c)
	}
	ln, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("hand-over: socket: %w", err)
	}
	h.ln = ln
	if err := unix.Bind(ln, &unix.SockaddrUnix{Name: h.Addr}); err != nil {
		h.Close()
		return nil, fmt.Errorf("hand-over: bind %s: %w", h.Addr, err)
	}
	if err := unix.Listen(ln, 4); err != nil {
		h.Close()
		return nil, fmt.Errorf("hand-over: listen: %w", err)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		h.Close()
		return nil, fmt.Errorf("hand-over: pipe: %w", err)
	}
	h.stopR, h.stopW = p[0], p[1]
	return h, nil
}

// Env is the NPURUN_HANDOVER entry for the container's environment.
func (h *Handover) Env() string { return HandoverVar + "=" + h.Addr }

// Taken is the id of the container that took the lease, "" while none has.
func (h *Handover) Taken() string { return h.taken }

// Serve hands the lease to the first runtime that asks for it, and
// returns once it has (Taken says which container took it), once
// watch (a pidfd: the engine's command line ending; -1 for none) is
// readable, or once Stop is called. The lease's copies are closed once
// handed over. A peer that may not take it is refused, and Serve goes
// on.
func (h *Handover) Serve(watch int) error {
	for h.taken == "" {
		fds := []unix.PollFd{{Fd: int32(h.ln), Events: unix.POLLIN}, {Fd: int32(h.stopR), Events: unix.POLLIN}}
		if watch >= 0 {
			fds = append(fds, unix.PollFd{Fd: int32(watch), Events: unix.POLLIN})
		}
		if _, err := unix.Poll(fds, -1); err != nil {
			if err == unix.EINTR {
				continue
			}
			return fmt.Errorf("hand-over: poll: %w", err)
		}
		if fds[1].Revents != 0 || (watch >= 0 && fds[2].Revents != 0) {
			return nil
		}
		if fds[0].Revents == 0 {
			continue
		}
		c, _, err := unix.Accept4(h.ln, unix.SOCK_CLOEXEC)
		if err != nil {
			if err == unix.EINTR || err == unix.EAGAIN || err == unix.ECONNABORTED {
				continue
			}
			return fmt.Errorf("hand-over: accept: %w", err)
		}
		h.serveOne(c)
		unix.Close(c)
	}
	return nil
}

// serveOne answers one connection: the lease to a runtime that may take
// it, a refusal to any other peer.
func (h *Handover) serveOne(c int) {
	cred, err := unix.GetsockoptUcred(c, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return
	}
	allowed := cred.Uid == 0 || int(cred.Uid) == h.uid
	wait := handoverTimeout
	if !allowed {
		// Anyone may connect (the address is no secret): a peer that
		// may not take the lease keeps the runtime's turn a moment only.
		wait = refusedWait
	}
	tv := unix.NsecToTimeval(int64(wait))
	unix.SetsockoptTimeval(c, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	unix.SetsockoptTimeval(c, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	// The request is read before any answer: a connection closed with
	// a packet unread is reset, and the answer would be lost with it.
	buf := make([]byte, maxHandoverMessage)
	oob := make([]byte, unix.CmsgSpace(4*wire.MaxDevices))
	msg, stray, err := wire.RecvMsg(c, buf, oob, 0)
	closeFDs(stray)
	if err != nil {
		return
	}
	if !allowed {
		wire.SendMsg(c, []byte(fmt.Sprintf("refused uid %d may not take this lease: only root's runtime (or one of uid %d) may", cred.Uid, h.uid)), nil, 0)
		return
	}
	f := strings.Fields(string(msg))
	if len(f) != 3 || f[0] != "take" || f[1] != "1" || !validID(f[2]) {
		wire.SendMsg(c, []byte("refused bad request"), nil, 0)
		return
	}
	reply := "lease 1 " + h.vendor + " " + npu.JoinIDs(h.devices)
	if err := wire.SendMsg(c, []byte(reply), h.fds, 0); err != nil {
		return
	}
	// In flight, the descriptors are the socket's: this process's copies
	// go now, and the lease is the runtime's (or, should it die before
	// reading, nobody's).
	h.taken = f[2]
	closeFDs(h.fds)
	h.fds = nil
	unix.Close(h.ln)
	h.ln = -1
}

// Stop makes Serve return.
func (h *Handover) Stop() {
	if h.stopW >= 0 {
		unix.Write(h.stopW, []byte{0})
	}
}

// Close closes the listening socket and what is left of the lease's
// copies: a lease not handed over is no longer this process's.
func (h *Handover) Close() {
	closeFDs(h.fds)
	h.fds = nil
	for _, fd := range []*int{&h.ln, &h.stopR, &h.stopW} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

// Received is a lease taken from npurun.
type Received struct {
	Vendor  string
	Devices []int
	FDs     []int  // one a device, close-on-exec
	UID     uint32 // the lease's owner: npurun's uid, from the socket
	PID     int    // npurun's pid, from the socket
}

// Take takes the lease npurun serves at addr (an NPURUN_HANDOVER value)
// for container id, from a peer of uid owner (SO_PEERCRED; -1 for any: a
// container's first create, whose owner is whoever hands it its lease).
// Nobody at addr gives ErrGone; so does a peer of another uid, in an error
// that wraps it and says who answered: the address is in /proc/net/unix
// and in the container's environment, and once its npurun is gone anyone
// may bind it. All of it is done within handoverTimeout.
func Take(addr, id string, owner int) (*Received, error) {
	if !validAddr(addr) {
		return nil, fmt.Errorf("hand-over: %q is not an npurun hand-over address", addr)
	}
	c, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("hand-over: socket: %w", err)
	}
	defer unix.Close(c)
	deadline := time.Now().Add(handoverTimeout)
	// Each step may wait for what is left of the time, no more: a peer
	// that answers nothing, or slowly, keeps the runtime (root, on the
	// engine's create path) for handoverTimeout in all.
	left := func() bool {
		d := time.Until(deadline)
		if d <= 0 {
			return false
		}
		tv := unix.NsecToTimeval(int64(d))
		unix.SetsockoptTimeval(c, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		unix.SetsockoptTimeval(c, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
		return true
	}
	left()
	for {
		err = unix.Connect(c, &unix.SockaddrUnix{Name: addr})
		if err != unix.EINTR || !left() {
			break
		}
	}
	if err == unix.ECONNREFUSED || err == unix.ENOENT {
		return nil, ErrGone
	}
	if err != nil {
		return nil, fmt.Errorf("hand-over: connect %s: %w", addr, err)
	}
	cred, err := unix.GetsockoptUcred(c, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return nil, fmt.Errorf("hand-over: peer: %w", err)
	}
	if owner >= 0 && int(cred.Uid) != owner {
		// Nothing is sent to it, nothing taken from it.
		return nil, fmt.Errorf("%w: %s is answered by pid %d of uid %d, not by the container's owner, uid %d", ErrGone, addr, cred.Pid, cred.Uid, owner)
	}
	if !left() {
		return nil, fmt.Errorf("hand-over: no answer in %s", handoverTimeout)
	}
	if err := wire.SendMsg(c, []byte("take 1 "+id), nil, 0); err != nil {
		return nil, fmt.Errorf("hand-over: send: %w", err)
	}
	if !left() {
		return nil, fmt.Errorf("hand-over: no answer in %s", handoverTimeout)
	}
	buf := make([]byte, maxHandoverMessage)
	oob := make([]byte, unix.CmsgSpace(4*wire.MaxDevices))
	msg, fds, err := wire.RecvMsg(c, buf, oob, 0)
	if err == unix.EAGAIN {
		err = fmt.Errorf("no answer in %s", handoverTimeout)
	}
	if err != nil {
		return nil, fmt.Errorf("hand-over: receive: %w", err)
	}
	r, err := parseLease(string(msg), fds)
	if err != nil {
		closeFDs(fds)
		return nil, fmt.Errorf("hand-over: %w", err)
	}
	r.UID, r.PID = cred.Uid, int(cred.Pid)
	return r, nil
}

// parseLease reads npurun's answer, with the descriptors that came with it.
func parseLease(msg string, fds []int) (*Received, error) {
	if why, ok := strings.CutPrefix(msg, "refused "); ok {
		return nil, fmt.Errorf("npurun refused: %s", why)
	}
	f := strings.Fields(msg)
	if len(f) != 4 || f[0] != "lease" || f[1] != "1" {
		return nil, fmt.Errorf("unexpected answer %.80q", msg)
	}
	r := &Received{Vendor: f[2]}
	for part := range strings.SplitSeq(f[3], ",") {
		id, err := strconv.Atoi(part)
		if err != nil || id < 0 {
			return nil, fmt.Errorf("bad device %q in %.80q", part, msg)
		}
		r.Devices = append(r.Devices, id)
	}
	if len(r.Devices) != len(fds) {
		return nil, fmt.Errorf("%d devices and %d descriptors", len(r.Devices), len(fds))
	}
	r.FDs = fds
	return r, nil
}

func validAddr(addr string) bool {
	name, ok := strings.CutPrefix(addr, handoverPrefix)
	if !ok || len(name) != 32 {
		return false
	}
	_, err := hex.DecodeString(name)
	return err == nil
}

// validID tells whether id may be a container's id: a runtime's ids are
// letters, digits and a few signs, and go in one word.
func validID(id string) bool {
	if id == "" || len(id) > 1024 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
