package status

import (
	"time"

	"github.com/npurun/npurun/wire"
)

// One user may make leases as fast as the broker grants them (a raw
// session request, ended and asked again, is a login lease a few
// milliseconds long), and each writes a start and an end to the
// accounting log: one user alone could rotate everyone's history away in
// a minute. So the log takes each user's leases at a bounded rate
// (logBurst at once, then one every logRefill). A lease past the rate is
// not written on its own: if it ends within usageSumEvery, its device
// time is added to a "sum" record of the user, kind and pool, written
// every usageSumEvery; if it lasts longer, its start is written then, and
// its end as any other's, so that a broker restart takes it up. Usage
// sums the sums with the rest (and those not written yet), so the hours
// are all counted; what a summed lease loses is its line of its own (pid,
// task, origin, wait).

// Bounds of the accounting log's records per user.
const (
	logBurst      = 60
	logRefill     = 6 * time.Second // 600 leases an hour, each logged
	usageSumEvery = time.Minute
	maxSums       = 4096 // users, kinds and pools summed at once
)

// logLimit is each user's allowance of leases logged on their own: a
// token bucket per uid, under Ledger.limitMu.
type logLimit map[uint32]*bucket

type bucket struct {
	tokens float64
	at     time.Time
}

// allow tells whether uid's lease that starts now is logged on its own,
// and takes one from its allowance if so.
func (ll logLimit) allow(uid uint32, now time.Time) bool {
	b := ll[uid]
	if b == nil {
		b = &bucket{tokens: logBurst, at: now}
		ll[uid] = b
	}
	b.tokens = min(logBurst, b.tokens+float64(now.Sub(b.at))/float64(logRefill))
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// prune forgets the users whose allowance is whole again.
func (ll logLimit) prune(now time.Time) {
	for uid, b := range ll {
		if b.tokens+float64(now.Sub(b.at))/float64(logRefill) >= logBurst {
			delete(ll, uid)
		}
	}
}

// sumKey names one sum record.
type sumKey struct {
	uid              uint32
	user, kind, pool string
}

// usageSums are the sum records not written yet, under Ledger.mu.
type usageSums map[sumKey]*usageRec

// add counts device time of l, not logged on its own, that ended now (one
// device's end), and l itself once its last device has ended.
func (us usageSums) add(l *entry, now time.Time) {
	k := sumKey{uid: l.UID, user: l.User, kind: l.kind(), pool: l.Pool}
	r := us[k]
	if r == nil {
		if len(us) >= maxSums {
			return // dropped: as a full queue drops records
		}
		r = &usageRec{Ev: "sum", Kind: l.kind(), User: l.User, UID: l.UID, Pool: l.Pool, From: l.Since.UnixMilli()}
		us[k] = r
	}
	r.From = min(r.From, l.Since.UnixMilli())
	r.T = max(r.T, now.UnixMilli())
	ms := now.Sub(l.Since).Milliseconds()
	if l.Share > 0 && l.Share < 1 {
		ms = int64(float64(ms) * l.Share) // a share weighs its part of the device
	}
	r.DevMS += ms
	if len(l.held) == 0 {
		r.Leases++
	}
}

// pending returns copies of the sum records not written yet.
func (us usageSums) pending() []usageRec {
	out := make([]usageRec, 0, len(us))
	for _, r := range us {
		out = append(out, *r)
	}
	return out
}

// sumLoop writes the sums, and the starts of leases past the rate that
// are still held, every usageSumEvery for the broker's life.
func (g *Ledger) sumLoop() {
	t := time.NewTicker(usageSumEvery)
	defer t.Stop()
	for range t.C {
		g.writeSums(time.Now().Add(-usageSumEvery))
	}
}

// writeSums queues the sum records for the log, and the start of every
// lease not logged that began before old; with a zero old, every lease
// not logged (Stop).
func (g *Ledger) writeSums(old time.Time) {
	g.mu.Lock()
	for _, l := range g.uniqueLocked() {
		if !l.logged && (old.IsZero() || l.Since.Before(old)) {
			l.logged = true
			g.usage.add(l.record("start"))
		}
	}
	for k, r := range g.sums {
		g.usage.add(*r)
		delete(g.sums, k)
	}
	g.unlock()
	g.limitMu.Lock()
	g.logLimit.prune(time.Now())
	g.limitMu.Unlock()
}

// Stop, as the broker stops, puts every lease the ledger knows in the
// accounting log, and waits a while for the log to be written.
func (g *Ledger) Stop() {
	g.writeSums(time.Time{})
	g.usage.flush(2 * time.Second)
}

// usageSum adds r, a sum record, to rows: its leases, and its device time
// in proportion to how much of From to T lies within lo to hi.
func usageSum(r usageRec, lo, hi int64) (leases int, ms float64) {
	if r.T < lo || r.From > hi {
		return 0, 0
	}
	if span := r.T - r.From; span > 0 {
		return r.Leases, float64(r.DevMS) * float64(min(r.T, hi)-max(r.From, lo)) / float64(span)
	}
	return r.Leases, float64(r.DevMS)
}

// sumKind is the usage row's kind of a record's.
func sumKind(kind string) string {
	if kind == wire.KindHeld {
		return "held"
	}
	return kind
}
