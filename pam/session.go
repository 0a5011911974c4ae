package pam

import (
	"fmt"
	"time"

	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
)

// Verdict is what a session gets.
type Verdict string

// The verdicts, as the broker answers them (the reply types of the
// session operation).
const (
	// Ignore: not a restricted account; the module steps aside at once
	// (PAM_IGNORE) and the session is left as it is.
	Ignore Verdict = "ignore"
	// Hide: a restricted account's session without a lease: the
	// variables hide every device (and the ACLs keep the nodes closed).
	Hide Verdict = "hide"
	// Lease: a restricted account's interactive login: a lease of N
	// devices from Pool, held for the session.
	Lease Verdict = "lease"
	// Deny: the session is refused, with a message.
	Deny Verdict = "deny"
)

// Account is the user a session is for.
type Account struct {
	Name   string
	Groups []string
}

// Decision is what the broker does with one session request.
type Decision struct {
	Verdict Verdict
	N       int    // Lease: devices
	Pool    string // Lease: pool; "" is the default pool
	// Wait is how long a Lease that finds nothing free waits in line
	// before Busy applies; 0 applies it at once.
	Wait time.Duration
	// Busy is the verdict when nothing is free (after Wait): Hide or
	// Deny.
	Busy Verdict
}

// Decide returns what a session of account a gets. login says that the
// session is an interactive login shell that asks for its lease (the PAM
// module's lease mode, npurun --login); any other session of a restricted
// account has its devices hidden.
func Decide(c *policy.Config, a Account, login bool) Decision {
	r := c.Restrict
	switch {
	case !c.Restricted(a.Name, a.Groups):
		return Decision{Verdict: Ignore}
	case !login || r.LoginDevices == 0:
		return Decision{Verdict: Hide}
	}
	d := Decision{Verdict: Lease, N: r.LoginDevices, Pool: r.LoginPool, Busy: Hide}
	switch r.OnBusy {
	case "wait":
		d.Wait = r.BusyWait
	case "deny":
		d.Busy = Deny
	}
	return d
}

// GrantMessage tells the user of a login lease what is theirs.
func GrantMessage(v npu.Vendor, devices []int, pool string) string {
	return fmt.Sprintf("%s %s yours until you log out (pool %q)", v.Format(devices), isAre(devices), pool)
}

func isAre(devices []int) string {
	if len(devices) == 1 {
		return "is"
	}
	return "are"
}

// BusyMessage tells the user of a login that found nothing free what
// happens instead: verdict Hide or Deny, after waiting waited (0: none).
func BusyMessage(verdict Verdict, n int, pool string, waited time.Duration) string {
	what := fmt.Sprintf("no device free in pool %q", pool)
	if n > 1 {
		what = fmt.Sprintf("fewer than %d devices free in pool %q", n, pool)
	}
	if waited > 0 {
		what += " after " + quantity.Duration(waited)
	}
	if verdict == Deny {
		return what + `: login refused (on_busy = "deny")`
	}
	return what + "; logged in without one (npurun CMD waits for a device)"
}
