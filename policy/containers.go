package policy

import (
	"time"
)

// What npurun-runtime does with a container that asks for devices without
// a lease (started without npurun, or asking for more than its lease):
// the [containers] table's "unleased".
const (
	ContainersRefuse = "refuse" // the engine's create fails, saying why
	ContainersLease  = "lease"  // it waits for a lease of those devices, as root, as any request waits
	ContainersReport = "report" // it runs; the broker reports its use as unleased
)

// Defaults of the [containers] table.
const (
	DefaultContainersUnleased = ContainersRefuse
	DefaultContainersStateDir = "/var/lib/npurun/containers"
	// MaxRestartWait bounds restart_wait: an engine's create should not
	// hang for longer.
	MaxRestartWait = 24 * time.Hour
)

// Containers configures npurun-runtime, the OCI runtime that hands a lease
// to a container ([containers]). The broker reads the table too, for
// check-config.
type Containers struct {
	Unleased    string        // ContainersRefuse, ContainersLease or ContainersReport
	RestartWait time.Duration // how long a restarted container waits for its devices; 0: as long as it takes
	StateDir    string        // the runtime's record of whose each container is, for its restarts
}

// containers reads the [containers] table.
func (p *parser) containers(raw map[string]any, c *Config) {
	c.Containers = Containers{Unleased: DefaultContainersUnleased, StateDir: DefaultContainersStateDir}
	table := []string{"containers"}
	t, ok := p.table(nil, raw, "containers")
	if !ok {
		return
	}
	p.unknown(table, t, "unleased", "restart_wait", "state_dir")
	if s, ok := p.str(table, t, "unleased"); ok {
		switch s {
		case ContainersRefuse, ContainersLease, ContainersReport:
			c.Containers.Unleased = s
		default:
			p.errorf(table, "unleased", "unknown value %q (want \"refuse\", \"lease\" or \"report\")", s)
		}
	}
	if d, ok := p.duration(table, t, "restart_wait"); ok {
		if d > MaxRestartWait {
			p.errorf(table, "restart_wait", "longer than %s", "1d")
		} else {
			c.Containers.RestartWait = d
		}
	}
	if s, ok := p.absPath(table, t, "state_dir"); ok {
		c.Containers.StateDir = s
	}
}
