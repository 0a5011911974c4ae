package broker

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"time"
)

// account is what the broker knows of a uid: its name and groups, read
// from the system's user database and kept for a short while.
type account struct {
	name   string
	groups []string
	gid    uint32   // primary group
	gids   []uint32 // supplementary groups, as initgroups would set them
	home   string
	shell  string // login shell for --run; /bin/sh where it refuses logins
	// hasShell: shell was looked up (lookup does, lookupLease does not).
	// An account handed out is never changed: a lookup that adds the
	// shell caches a copy.
	hasShell bool
	known    bool  // found in the user database (else: a stand-in, briefly kept)
	err      error // why the database could not be asked, when it was not "no such user"
	// groupsErr: some of its groups could not be read (the database
	// failed), so groups may lack one; kept briefly, as err.
	groupsErr error
	shellErr  error // why the login shell could not be looked up now (lookup: such an account is not kept)
	at        time.Time
}

type accounts struct {
	mu sync.Mutex
	m  map[uint32]*account
}

const accountTTL = 30 * time.Second

// unanswered is why the user database gave no answer about the account
// now (out of descriptors, a name service unreachable), nil when it
// answered: either part, the account or its groups, missing for such a
// reason is no answer. What depends on it (a task's submission, its start
// with the account's groups, a restricted account's ACLs) waits or fails
// closed, never takes a stand-in for the truth.
func (a *account) unanswered() error {
	switch {
	case !a.known && a.err != nil:
		return a.err
	case a.known && a.groupsErr != nil:
		return a.groupsErr
	}
	return nil
}

// lookup returns what the broker knows of uid, its login shell included.
func (a *accounts) lookup(uid uint32) *account { return a.get(uid, true) }

// nameGroups is uid's name and groups, and whether the user database
// knows it: the status room's look-up (status.Config.Account).
func (a *accounts) nameGroups(uid uint32) (string, []string, bool) {
	acct := a.lookup(uid)
	return acct.name, acct.groups, acct.known
}

// lookupLease is lookup without the login shell, which only a task's
// --run needs and which costs a getent, a fork and an exec (3 ms here):
// an npurun's request, on its way to a grant, does without (issue 9).
func (a *accounts) lookupLease(uid uint32) *account { return a.get(uid, false) }

func (a *accounts) get(uid uint32, withShell bool) *account {
	acc := a.cached(uid)
	if acc == nil {
		acc = resolveAccount(uid)
		a.store(uid, acc)
	}
	if withShell && acc.known && !acc.hasShell {
		c := *acc
		sh, err := loginShell(c.name)
		if err != nil {
			c.shellErr = err // asked again next time: that passes
			return &c
		}
		c.shell, c.hasShell = sh, true
		acc = &c
		a.store(uid, acc)
	}
	return acc
}

// cached is uid's account if it is in the cache and fresh (nil if not):
// what a lookup now would return without asking the user database.
func (a *accounts) cached(uid uint32) *account {
	a.mu.Lock()
	acc := a.m[uid]
	a.mu.Unlock()
	if acc == nil || time.Since(acc.at) >= accountTTL {
		return nil
	}
	return acc
}

func (a *accounts) store(uid uint32, acc *account) {
	a.mu.Lock()
	if a.m == nil {
		a.m = map[uint32]*account{}
	}
	a.m[uid] = acc
	a.mu.Unlock()
}

// resolveAccount asks the user database about uid, but for its login
// shell.
func resolveAccount(uid uint32) *account {
	acc := &account{name: "uid " + strconv.Itoa(int(uid)), gid: uid, home: "/", shell: "/bin/sh", at: time.Now()}
	if u, err := user.LookupId(strconv.Itoa(int(uid))); err != nil {
		acc.at = acc.at.Add(time.Second - accountTTL) // try again soon: NSS may be back
		var unknown user.UnknownUserIdError
		if !errors.As(err, &unknown) {
			acc.err = err // out of descriptors, NSS unreachable: not an answer
		}
	} else {
		acc.known = true
		acc.name, acc.home = u.Username, u.HomeDir
		if g, err := strconv.ParseUint(u.Gid, 10, 32); err == nil {
			acc.gid = uint32(g)
		}
		acc.groups, acc.gids, acc.groupsErr = accountGroups(u.GroupIds, user.LookupGroupId)
		if acc.groupsErr != nil {
			acc.at = acc.at.Add(time.Second - accountTTL) // try again soon
		}
	}
	return acc
}

// accountGroups returns the names and ids of an account's groups, from
// groupIDs (its group ids) and lookupGroup. An error other than "no such
// group" is the user database's (NSS out of descriptors, LDAP
// unreachable): the groups are then not known, which is not the same as
// none (access.go fails closed on it).
func accountGroups(groupIDs func() ([]string, error), lookupGroup func(gid string) (*user.Group, error)) ([]string, []uint32, error) {
	ids, err := groupIDs()
	if err != nil {
		return nil, nil, fmt.Errorf("groups: %w", err)
	}
	var names []string
	var gids []uint32
	var errs []error
	for _, gid := range ids {
		if n, err := strconv.ParseUint(gid, 10, 32); err == nil {
			gids = append(gids, uint32(n))
		}
		g, err := lookupGroup(gid)
		var unknown user.UnknownGroupIdError
		switch {
		case err == nil:
			names = append(names, g.Name)
		case !errors.As(err, &unknown):
			errs = append(errs, fmt.Errorf("group %s: %w", gid, err))
		}
	}
	return names, gids, errors.Join(errs...)
}

// loginShell is user's shell from the user database (through NSS, with
// getent), or /bin/sh when there is none or it refuses logins (nologin,
// false). An error is a lookup that could not be made now (getent not
// started, for want of descriptors or processes, or not answering): that
// passes, and is no answer.
func loginShell(name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "getent", "passwd", name).Output()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee) && ee.ExitCode() == 2: // no such entry
		return "/bin/sh", nil
	case err != nil:
		return "", fmt.Errorf("look up the login shell of %s: %w", name, err)
	}
	f := strings.Split(strings.TrimSpace(string(out)), ":")
	if len(f) != 7 || f[0] != name {
		return "/bin/sh", nil
	}
	sh := f[6]
	if !strings.HasPrefix(sh, "/") || strings.HasSuffix(sh, "/nologin") || strings.HasSuffix(sh, "/false") {
		return "/bin/sh", nil
	}
	return sh, nil
}
