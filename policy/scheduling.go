package policy

import (
	"fmt"
	"time"

	"github.com/npurun/npurun/internal/quantity"
)

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

// TimeRefusal says why a time limit is refused (a task's --time, or the
// [tasks] time_limit it gets, and npurun's --time alike): it is longer
// than max_time. "" where it is allowed.
func (t Tasks) TimeRefusal(limit time.Duration) string {
	if t.MaxTime > 0 && limit > t.MaxTime {
		return fmt.Sprintf("time limit %s is longer than the %s allowed", quantity.Duration(limit), quantity.Duration(t.MaxTime))
	}
	return ""
}
