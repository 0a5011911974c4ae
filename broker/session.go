package broker

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"time"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/internal/atomicfile"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/pam"
	"github.com/npurun/npurun/wire"
)

// Origin is where a session or a request on behalf of a user comes from,
// kept with its waiter and its lease for listings.
type Origin struct {
	User    string // the account the session is for
	Service string // PAM service (sshd, login, su-l), or "npurun --login"
	TTY     string
	RHost   string
	ByRoot  bool // asked by root (the PAM module): the fields are the module's; else the user's own claim
}

// Caps on a session request's origin fields.
const (
	maxServiceBytes = 64
	maxTTYBytes     = 256
	maxRHostBytes   = 1024
)

// login is a waiting login session's decision, kept on its connection.
type login struct {
	d      pam.Decision
	w      *lease.Waiter
	queued time.Time
}

// accountFor is the account a request is for: the caller's own, or the
// user that root names. A refusal is sent to c, and ok is false.
func (s *Server) accountFor(c *conn, user string) (uid uint32, acct *account, ok bool) {
	if user == "" {
		return c.uid, c.acct, true
	}
	uid, acct, rep := s.onBehalf(c, user)
	if rep != nil {
		s.mu.Lock()
		c.sendLocked(rep)
		s.mu.Unlock()
		return 0, nil, false
	}
	return uid, acct, true
}

// onBehalf resolves the account a request names. Only root may name one;
// anyone else, or a name the user database does not know, gets the reply
// to send instead.
func (s *Server) onBehalf(c *conn, name string) (uint32, *account, *wire.Reply) {
	if c.uid != 0 {
		return 0, nil, errReply(wire.CodeDenied, fmt.Sprintf("only root may ask on behalf of another user (asked for %q)", name), "")
	}
	u, err := user.Lookup(name)
	if err != nil {
		return 0, nil, errReply(wire.CodeDenied, fmt.Sprintf("no user %q here", name), "")
	}
	id, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return 0, nil, errReply(wire.CodeDenied, fmt.Sprintf("user %q has uid %q", name, u.Uid), "")
	}
	acct := s.users.lookup(uint32(id))
	if !acct.known {
		return 0, nil, errReply(wire.CodeDenied, fmt.Sprintf("no user %q here", name), "")
	}
	return uint32(id), acct, nil
}

// session serves a session request: pam_npurun.so's, as root on behalf of
// the user logging in, or npurun --login's, for its own user.
func (s *Server) session(c *conn, req *wire.Request) bool {
	switch {
	case len(req.Service) > maxServiceBytes, len(req.TTY) > maxTTYBytes, len(req.RHost) > maxRHostBytes:
		s.mu.Lock()
		c.sendLocked(errReply(wire.CodeBadRequest, fmt.Sprintf("service, tty or rhost too long (at most %d, %d, %d bytes)", maxServiceBytes, maxTTYBytes, maxRHostBytes), ""))
		s.mu.Unlock()
		return false
	}
	uid, acct, ok := s.accountFor(c, req.User)
	if !ok {
		return true
	}
	d := pam.Decide(s.policy(), pam.Account{Name: acct.name, Groups: acct.groups}, req.Login)
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.w != nil {
		c.sendLocked(errReply(wire.CodeBadRequest, "this connection already waits for devices", ""))
		return false
	}
	c.origin = &Origin{User: acct.name, Service: req.Service, TTY: req.TTY, RHost: req.RHost, ByRoot: c.uid == 0}
	switch d.Verdict {
	case pam.Ignore:
		c.sendLocked(&wire.Reply{Type: wire.TypeIgnore})
		return true
	case pam.Hide:
		c.sendLocked(&wire.Reply{Type: wire.TypeHide, Env: npu.HiddenEnv()})
		return true
	}
	if s.leaseWaits[uid] >= s.policy().MaxWaitingPerUser {
		c.sendLocked(errReply(wire.CodeTooMany, fmt.Sprintf("%s already has %s waiting, the most the broker queues for one user", acct.name, quantity.Count(s.policy().MaxWaitingPerUser, "request", "requests")), ""))
		return true
	}
	w, rep := s.admitLocked(c.holder(lease.Login, uid, acct), acct, d.N, nil, d.Pool, 0)
	if rep != nil {
		c.sendLocked(rep)
		return true
	}
	l := &login{d: d, w: w, queued: time.Now()}
	w.Ref, c.w, c.login = c, w, l
	s.leaseWaits[uid]++
	s.table.Add(w)
	s.scheduleLocked()
	if c.w != w {
		return true // granted at once, or the grant failed and said so
	}
	if d.Wait == 0 {
		if !s.awaitEndsLocked(c, w) {
			s.busyLocked(c, l)
		}
		return true
	}
	c.sendLocked(&wire.Reply{Type: wire.TypeQueued, Pool: w.Pool, WaitMS: d.Wait.Milliseconds()})
	time.AfterFunc(d.Wait, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if c.w == w && !c.closed && !s.awaitEndsLocked(c, w) && !c.closed {
			s.busyLocked(c, l)
		}
	})
	s.progressLocked()
	return true
}

// busyLocked ends a login's wait for a lease that found nothing free: it
// logs in without one (hide) or is refused (deny), as on_busy says.
func (s *Server) busyLocked(c *conn, l *login) {
	s.table.Remove(l.w)
	s.unwaitLocked(c)
	s.scheduleLocked()
	s.progressLocked()
	var waited time.Duration
	if l.d.Wait > 0 {
		waited = time.Since(l.queued).Round(time.Second)
	}
	msg := pam.BusyMessage(l.d.Busy, l.w.N, l.w.Pool, waited)
	if l.d.Busy == pam.Deny {
		c.sendLocked(errReply(wire.CodeBusy, msg, ""))
		return
	}
	c.sendLocked(&wire.Reply{Type: wire.TypeHide, Env: npu.HiddenEnv(), Message: msg})
}

// writeSessionPolicy writes the session-policy file into the run
// directory: what pam_npurun.so and npurun --login do while no broker
// answers. Accounts are resolved now; one unknown now is listed by name.
//
// Without [restrict] there is no such file (one left by an earlier
// configuration is removed), and the module lets every session be.
func (s *Server) writeSessionPolicy(runDir string) error {
	r := s.policy().Restrict
	path := filepath.Join(runDir, wire.SessionPolicyFile)
	if !r.Active() {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove session policy: %w", err)
		}
		return nil
	}
	p := &wire.SessionPolicy{OnBrokerDown: r.OnBrokerDown}
	for _, name := range r.Users {
		a := wire.Account{Name: name, ID: -1}
		if u, err := user.Lookup(name); err == nil {
			if id, err := strconv.ParseInt(u.Uid, 10, 64); err == nil {
				a.ID = id
			}
		}
		p.Users = append(p.Users, a)
	}
	for _, name := range r.Groups {
		a := wire.Account{Name: name, ID: -1}
		if g, err := user.LookupGroup(name); err == nil {
			if id, err := strconv.ParseInt(g.Gid, 10, 64); err == nil {
				a.ID = id
			}
		}
		p.Groups = append(p.Groups, a)
	}
	if err := atomicfile.Write(path, p.Marshal(), 0o644); err != nil {
		return fmt.Errorf("write session policy: %w", err)
	}
	return nil
}
