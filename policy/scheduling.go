package policy

// Scheduling is the [scheduling] table: how the line is served.
type Scheduling struct {
	// Backfill lets a request whose time limit is known (a task's
	// --time, npurun's --time) start ahead of a request that reserved
	// devices, where it ends, by its limit and [tasks] kill_grace, before
	// that request's estimated start. Default true; reloadable.
	Backfill bool
}

// scheduling reads the [scheduling] table.
func (p *parser) scheduling(raw map[string]any, c *Config) {
	c.Scheduling = Scheduling{Backfill: true}
	table := []string{"scheduling"}
	t, ok := p.table(nil, raw, "scheduling")
	if !ok {
		return
	}
	p.unknown(table, t, "backfill")
	if v, ok := t["backfill"]; ok {
		if b, isBool := v.(bool); isBool {
			c.Scheduling.Backfill = b
		} else {
			p.errorf(table, "backfill", "must be a boolean, not %s", typeName(v))
		}
	}
}
