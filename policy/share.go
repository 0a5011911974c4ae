package policy

import (
	"github.com/npurun/npurun/internal/quantity"
)

// Share is the [share] table: which devices may hold several leases at
// once, shares packed by their declared device memory (npurun --mem).
// Sharing packs by declaration; it does not isolate one share's memory
// from another's.
type Share struct {
	// Pools whose devices may be shared; nil: none (no [share] table),
	// and ["*"] written as pools = "all": every pool.
	Pools []string
	// Capacity is each shared device's memory in MiB where the vendor's
	// tool cannot say (the fake vendor's only source), or to override
	// it; 0: the vendor's.
	Capacity int64
	// Capacities by device id, over Capacity ("capacities" = {"3" = "32G"}).
	Capacities map[int]int64
	// Margin is kept free on each shared device, in MiB.
	Margin int64
	// OverDeclared is what happens to a share that uses more than it
	// declared: OverReport or OverTerm.
	OverDeclared string
}

// DefaultShareMargin is the memory kept free on a shared device: 1 GiB.
const DefaultShareMargin = 1024

// What the broker does about a share over its declaration.
const (
	OverReport = "report" // shown in status, logged the first time
	OverTerm   = "term"   // and its processes sent SIGTERM
)

// Shares tells whether the devices of pool may hold shares.
func (s Share) Shares(pool string) bool {
	for _, p := range s.Pools {
		if p == "*" || p == pool {
			return true
		}
	}
	return false
}

// share reads the [share] table.
func (p *parser) share(raw map[string]any, c *Config, poolExists func(string) bool) {
	c.Share = Share{Margin: DefaultShareMargin, OverDeclared: OverReport}
	table := []string{"share"}
	t, ok := p.table(nil, raw, "share")
	if !ok {
		return
	}
	p.unknown(table, t, "pools", "capacity", "capacities", "margin", "over_declared")
	switch v := t["pools"].(type) {
	case nil:
		p.errorf(table, "pools", "missing: name the pools whose devices may be shared, or \"all\"")
	case string:
		if v != "all" {
			p.errorf(table, "pools", "want \"all\" or an array of pool names, not %q", v)
		} else {
			c.Share.Pools = []string{"*"}
		}
	default:
		names, ok := p.stringList(table, t, "pools")
		if !ok {
			break
		}
		for _, n := range names {
			if !poolExists(n) {
				p.errorf(table, "pools", "no pool %q in [pools]", n)
			}
		}
		c.Share.Pools = names
	}
	size := func(tbl []string, t map[string]any, key string) (int64, bool) {
		v, ok := t[key]
		if !ok {
			return 0, false
		}
		s, ok := v.(string)
		if !ok {
			p.errorf(tbl, key, "must be a size such as \"64G\", not %s", typeName(v))
			return 0, false
		}
		n, err := quantity.ParseSize(s)
		if err != nil {
			p.errorf(tbl, key, "%v", err)
			return 0, false
		}
		return n, true
	}
	if n, ok := size(table, t, "capacity"); ok {
		c.Share.Capacity = n
	}
	if caps, ok := p.table(table, t, "capacities"); ok {
		c.Share.Capacities = map[int]int64{}
		sub := []string{"share", "capacities"}
		for k := range caps {
			id, err := atoi(k)
			if err != nil {
				p.errorf(sub, k, "want a device id, not %q", k)
				continue
			}
			if n, ok := size(sub, caps, k); ok {
				c.Share.Capacities[id] = n
			}
		}
	}
	if t["margin"] == "0" {
		c.Share.Margin = 0
	} else if n, ok := size(table, t, "margin"); ok {
		c.Share.Margin = n
	}
	if s, ok := p.str(table, t, "over_declared"); ok {
		switch s {
		case OverReport, OverTerm:
			c.Share.OverDeclared = s
		default:
			p.errorf(table, "over_declared", "want \"report\" or \"term\", not %q", s)
		}
	}
}

// CapacityOf is device id's memory as the configuration gives it, in MiB;
// 0: the configuration does not say.
func (s Share) CapacityOf(id int) int64 {
	if n, ok := s.Capacities[id]; ok {
		return n
	}
	return s.Capacity
}
