package status

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/wire"
)

// The [idle] policy (issue 29). After each utilization sample the ledger
// judges the leases idle since a sample: a lease of a kind [idle] kinds
// names, whose user's [idle] after (Config.IdleFor) is set, is reported
// once it has been idle that long (the log, status's mark); with action
// "warn" or "reclaim" its holders are told once, warn_before ahead
// (IdleOwner.Warn); with "reclaim" it is ended at after (IdleOwner.Reclaim:
// the broker ends it as a time limit ends a task's). The idle run is the
// samples': a busy or unknown sample ends it, and with it what was said
// of it, so a lease whose clock started again is never reclaimed for the
// run before, and one whose utilization is unknown never at all. The
// judgement reads the policy in force at each sample, so a reload that
// changes after applies to the leases held.

// IdleOwner acts on what the [idle] policy decides: the broker. It is
// called holding no lock of the ledger's.
type IdleOwner interface {
	// Warn tells the holders of lease l, where they will see it, msg.
	Warn(l *lease.Lease, msg string)
	// Reclaim ends lease l (why, for the log); msg is what its holders
	// are told.
	Reclaim(l *lease.Lease, why, msg string)
}

// idleState is what the [idle] policy said of a lease's current idle run.
type idleState struct {
	action    string    // the action that applies to it, at the last judgement; "": none
	ends      time.Time // action reclaim: when it is reclaimed unless used
	warned    bool      // its holders were warned
	reported  bool      // its idleness past after was logged
	reclaimed time.Time // when it was reclaimed; zero: not
	// A run kept across a broker restart (utilstate.go) whose holders
	// were not warned before it may have passed after while the broker
	// was down: it is warned first, and reclaimed no sooner than
	// warn_before after that warning (late), never at once.
	unwarned bool      // kept across a restart, not warned before it
	late     time.Time // the earliest it is reclaimed, so; zero: since + after
}

// endRun forgets what was said of an idle run that a busy or unknown
// sample ended; a reclaim, begun, goes on.
func (st *idleState) endRun() {
	st.action, st.ends, st.warned, st.reported = "", time.Time{}, false, false
	st.unwarned, st.late = false, time.Time{}
}

// idleAct is one thing the judgement does, once the ledger's lock is let
// go.
type idleAct struct {
	l         *lease.Lease
	warn      string // the warning for its holders
	reclaim   string // the reclaim's reason, for the log
	told      string // what its holders are told of the reclaim
	log       string // a line for the log
	reclaimed bool
}

// judgeIdle applies the [idle] policy to the leases after the sample
// taken at at.
func (g *Ledger) judgeIdle(at time.Time) {
	cfg := g.policy()
	type cand struct {
		e     *entry
		since time.Time
	}
	var cands []cand
	g.mu.Lock()
	for _, e := range g.leasesHeldLocked() {
		if u := e.util; u != nil && !u.idleSince.IsZero() {
			cands = append(cands, cand{e, u.idleSince})
		}
	}
	g.unlock()
	if len(cands) == 0 {
		return
	}
	// The users' rules, looked up with no lock held.
	type rule struct {
		after  time.Duration
		action string
	}
	rules := make([]rule, len(cands))
	for i, c := range cands {
		if !cfg.Idle.Applies(c.e.kind()) {
			continue
		}
		name, groups, _ := g.account(c.e.UID)
		if name == "" {
			name = c.e.User
		}
		rules[i].after, rules[i].action = cfg.IdleFor(name, groups)
	}
	var acts []idleAct
	g.mu.Lock()
	for i, c := range cands {
		e, r := c.e, rules[i]
		u := e.util
		if u == nil || !u.idleSince.Equal(c.since) || !e.anyHeld() {
			continue // busy or unknown since, or ended
		}
		st := &u.idle
		if r.after <= 0 || r.action == "" {
			st.action, st.ends = "", time.Time{}
			continue
		}
		st.action = r.action
		st.ends = time.Time{}
		idle := at.Sub(c.since)
		devs := g.heldDevicesLocked(e)
		what := fmt.Sprintf("%s %s been idle (under %s%%)", devs, hasHave(e), pct(cfg.Idle.Below))
		warnAt := max(r.after-cfg.Idle.WarnBefore, 0)
		warnNow := r.action != policy.IdleReport && !st.warned && idle >= warnAt && st.reclaimed.IsZero()
		if warnNow && st.unwarned {
			st.unwarned, st.late = false, at.Add(cfg.Idle.WarnBefore)
		}
		if r.action == policy.IdleReclaim {
			st.ends = c.since.Add(r.after)
			if st.late.After(st.ends) {
				st.ends = st.late
			}
		}
		if warnNow {
			st.warned = true
			msg := "npurun: " + what + " for " + approx(idle) + "; "
			if r.action == policy.IdleReclaim {
				msg += "its lease ends at " + clock(st.ends, r.after) + " unless it is used"
			} else {
				msg += "end its lease if you are done with it"
			}
			msg += " (npurun.conf: [idle])"
			acts = append(acts, idleAct{l: e.Lease, warn: msg,
				log: fmt.Sprintf("lease %d of %s: %s for %s: its holders are warned", e.ID, e.User, what, approx(idle))})
		}
		if idle < r.after {
			continue
		}
		if !st.reported {
			st.reported = true
			acts = append(acts, idleAct{log: fmt.Sprintf("lease %d of %s: %s for %s ([idle] after = %s, action = %s)",
				e.ID, e.User, what, approx(idle), approx(r.after), r.action)})
		}
		if r.action == policy.IdleReclaim && st.reclaimed.IsZero() && !at.Before(st.ends) {
			st.reclaimed = at
			g.metrics.reclaimed.WithLabelValues(e.User).Inc()
			told := "npurun: " + what + " for " + approx(idle) + ": its lease is reclaimed"
			if e.Kind == lease.Login {
				told += " and the device closed to you; your login goes on"
			} else {
				told += " and its processes ended"
			}
			told += " (npurun.conf: [idle])"
			acts = append(acts, idleAct{l: e.Lease, reclaimed: true, told: told,
				reclaim: fmt.Sprintf("lease %d of %s, idle (under %s%%) on %s for %s, is reclaimed ([idle] after = %s)",
					e.ID, e.User, pct(cfg.Idle.Below), devs, approx(idle), approx(r.after))})
		}
	}
	g.changedLocked()
	g.unlock()
	for _, a := range acts {
		if a.log != "" {
			g.log.Print(a.log)
		}
		switch {
		case g.idle == nil:
		case a.reclaimed:
			g.log.Print(a.reclaim)
			g.idle.Reclaim(a.l, a.reclaim, a.told)
		case a.warn != "":
			g.idle.Warn(a.l, a.warn)
		}
	}
}

// anyHeld tells whether any device of e is held still.
func (e *entry) anyHeld() bool {
	for _, h := range e.held {
		if h {
			return true
		}
	}
	return false
}

// heldDevicesLocked names the devices of e held still: "npu1", "npu0,npu1".
func (g *Ledger) heldDevicesLocked(e *entry) string {
	var names []string
	for _, id := range e.Devices {
		if e.held[id] {
			names = append(names, g.deviceName(id))
		}
	}
	return strings.Join(names, ",")
}

func hasHave(e *entry) string {
	n := 0
	for _, h := range e.held {
		if h {
			n++
		}
	}
	if n > 1 {
		return "have"
	}
	return "has"
}

// pct writes a percentage: 5, 2.5.
func pct(p float64) string { return strconv.FormatFloat(p, 'f', -1, 64) }

// approx is a duration for people, at least a second.
func approx(d time.Duration) string { return quantity.Approx(max(d, time.Second)) }

// clock is the time of day t, to the minute where after, the window, is
// a whole number of minutes of ten or more, else to the second.
func clock(t time.Time, after time.Duration) string {
	if after >= 10*time.Minute && after%time.Minute == 0 {
		return t.Format("15:04")
	}
	return t.Format("15:04:05")
}

// leaseIdleInfo puts what the [idle] policy said of lease e in li.
func leaseIdleInfo(e *entry, li *wire.LeaseInfo) {
	u := e.util
	if u == nil {
		return
	}
	st := u.idle
	if !st.reclaimed.IsZero() {
		li.IdleAction = policy.IdleReclaim
		li.Reclaimed = st.reclaimed.UnixMilli()
		return
	}
	if u.idleSince.IsZero() || u.resumed {
		return
	}
	li.IdleAction = st.action
	li.Warned = st.warned
	if !st.ends.IsZero() {
		li.IdleEnds = st.ends.UnixMilli()
	}
}

// reclaimedHelp documents the reclaimed leases' counter.
const reclaimedHelp = "Leases ended by the [idle] policy (action = \"reclaim\"), by user, since the broker started."

func newReclaimed() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "npurun_idle_reclaimed_total", Help: reclaimedHelp}, []string{"user"})
}
