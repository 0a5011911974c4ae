package policy

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Slurm is the [slurm] table: the devices of this machine that Slurm
// manages (its GRES), in gres.conf's order, and how npurun shares them
// with Slurm.
//
// Slurm names a job's devices by their positions in gres.conf's File=
// order on the node (SLURM_JOB_GPUS=0,1), not by their device numbers:
// with File=/dev/davinci[4-7] a two-device job gets 0,1, which are
// physical 4 and 5. Devices[i] is the physical id at position i.
type Slurm struct {
	Devices      []int         // physical ids in gres.conf position order; nil when [slurm] is absent
	Mode         string        // ModeSplit or ModeAllocate
	GRES         string        // the GRES name in gres.conf and --gres ("gpu")
	GresConf     string        // gres.conf to compare with; "" for beside $SLURM_CONF, or /etc/slurm/gres.conf
	Node         string        // this node's Slurm NodeName; "" for the host's short name
	Partition    string        // allocate: the placeholders' partition; "" for Slurm's default
	PollInterval time.Duration // allocate: how often squeue is asked about placeholders
}

// Modes of [slurm].
const (
	// ModeSplit: Slurm's devices are leased to Slurm jobs only; npurun's
	// own pools are the other devices.
	ModeSplit = "split"
	// ModeAllocate: Slurm is the only allocator of its devices; a request
	// for them becomes a placeholder Slurm allocation for its user.
	ModeAllocate = "allocate"
)

// Defaults of the [slurm] table.
const (
	DefaultSlurmGRES         = "gpu"
	DefaultSlurmPollInterval = 2 * time.Second
	// MinSlurmPollInterval bounds how often the broker may ask squeue.
	MinSlurmPollInterval = time.Second
)

// Active tells whether the configuration has a [slurm] table.
func (s Slurm) Active() bool { return len(s.Devices) > 0 }

// Manages tells whether physical device id is one of Slurm's.
func (s Slurm) Manages(id int) bool { return slices.Contains(s.Devices, id) }

// Map turns gres.conf positions, as Slurm gives them to a job
// (SLURM_JOB_GPUS), into physical ids, in the positions' order. A
// position past gres_devices, or given twice, is an error: the map
// disagrees with Slurm's gres.conf.
func (s Slurm) Map(positions []int) ([]int, error) {
	if !s.Active() {
		return nil, fmt.Errorf("no [slurm] table: Slurm's devices are unknown")
	}
	ids := make([]int, 0, len(positions))
	for _, p := range positions {
		if p < 0 || p >= len(s.Devices) {
			return nil, fmt.Errorf("gres position %d is past [slurm] gres_devices, which lists %d devices: the map and gres.conf disagree", p, len(s.Devices))
		}
		if slices.Contains(ids, s.Devices[p]) {
			return nil, fmt.Errorf("gres position %d given twice", p)
		}
		ids = append(ids, s.Devices[p])
	}
	return ids, nil
}

// ParsePositions reads a list of gres.conf positions as Slurm writes it in
// SLURM_JOB_GPUS ("0,1,3"; ranges such as "0-3" are taken too). An empty
// list is no devices.
func ParsePositions(s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	list, err := parseOrdered(s)
	if err != nil {
		return nil, fmt.Errorf("gres positions %q: %w", s, err)
	}
	return list, nil
}

// slurmName is what a GRES, node or partition name may be here: Slurm's
// names, and nothing a command line could take for an option.
var slurmName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`)

// slurm reads the [slurm] table.
func (p *parser) slurm(raw map[string]any, c *Config) Slurm {
	s := Slurm{Mode: ModeSplit, GRES: DefaultSlurmGRES, PollInterval: DefaultSlurmPollInterval}
	table := []string{"slurm"}
	t, ok := p.table(nil, raw, "slurm")
	if !ok {
		return s
	}
	p.unknown(table, t, "gres_devices", "mode", "gres_name", "gres_conf", "node", "partition", "poll_interval")
	if text, ok := p.str(table, t, "gres_devices"); ok {
		ids, err := parseOrdered(text)
		switch {
		case strings.TrimSpace(text) == "":
			p.errorf(table, "gres_devices", "no devices in %q", text)
		case err != nil:
			p.errorf(table, "gres_devices", "%v", err)
		default:
			var outside []int
			for _, id := range ids {
				if c.IDs != nil && !slices.Contains(c.IDs, id) {
					outside = append(outside, id)
				}
			}
			if len(outside) > 0 {
				p.errorf(table, "gres_devices", "%s not in [devices] ids", plural(outside, "device", "devices"))
			} else {
				s.Devices = ids
			}
		}
	} else if _, present := t["gres_devices"]; !present {
		p.errorf(table, "", "names no devices: give gres_devices, the physical ids of Slurm's devices in gres.conf's File= order (e.g. \"4-7\")")
	}
	if v, ok := p.str(table, t, "mode"); ok {
		if v == ModeSplit || v == ModeAllocate {
			s.Mode = v
		} else {
			p.errorf(table, "mode", "unknown mode %q (want %q or %q)", v, ModeSplit, ModeAllocate)
		}
	}
	for _, f := range []struct {
		key string
		out *string
	}{{"gres_name", &s.GRES}, {"node", &s.Node}, {"partition", &s.Partition}} {
		if v, ok := p.str(table, t, f.key); ok {
			if !slurmName.MatchString(v) || len(v) > 256 {
				p.errorf(table, f.key, "bad name %q (letters, digits, _, . and -)", v)
			} else {
				*f.out = v
			}
		}
	}
	if v, ok := p.absPath(table, t, "gres_conf"); ok {
		s.GresConf = v
	}
	if d, ok := p.duration(table, t, "poll_interval"); ok {
		if d < MinSlurmPollInterval {
			p.errorf(table, "poll_interval", "must be at least %s", MinSlurmPollInterval)
		} else {
			s.PollInterval = d
		}
	}
	if s.Mode == ModeSplit {
		for _, k := range []string{"partition", "poll_interval"} {
			if _, set := t[k]; set {
				p.errorf(table, k, "applies to mode %q only (mode is %q)", ModeAllocate, s.Mode)
			}
		}
	}
	if s.Active() {
		p.slurmPools(c, s)
	}
	return s
}

// slurmPools checks [pools] against Slurm's devices. In split mode no
// pool may hold one of them: the broker grants them to Slurm jobs only.
// In allocate mode a pool holds Slurm's devices only or none of them, so
// that a request is either a placeholder Slurm allocation or an ordinary
// lease; where [pools] is absent, every device must then be Slurm's.
func (p *parser) slurmPools(c *Config, s Slurm) {
	if len(c.Pools) == 1 && c.Pools[0].IDs == nil {
		if s.Mode == ModeAllocate && c.IDs != nil {
			var others []int
			for _, id := range c.IDs {
				if !s.Manages(id) {
					others = append(others, id)
				}
			}
			if len(others) > 0 {
				p.errorf([]string{"slurm"}, "mode", "mode %q: %s not Slurm's, and no [pools] say which requests are Slurm's: give a pool of Slurm's devices and one of the others", ModeAllocate, plural(others, "device", "devices")+isAre(others))
			}
		}
		return
	}
	for _, pool := range c.Pools {
		var in, out []int
		for _, id := range pool.IDs {
			if s.Manages(id) {
				in = append(in, id)
			} else {
				out = append(out, id)
			}
		}
		switch {
		case len(in) == 0:
		case s.Mode == ModeSplit:
			p.errorf([]string{"pools"}, pool.Name, "%s Slurm's ([slurm] gres_devices), which mode %q leases to Slurm jobs only: take %s out of the pool", plural(in, "device", "devices")+isAre(in), ModeSplit, itThem(in))
		case len(out) > 0:
			p.errorf([]string{"pools"}, pool.Name, "holds Slurm's %s and %s, which %s not: in mode %q a pool holds Slurm's devices only or none", formatIDs(in), plural(out, "device", "devices"), isAreBare(out), ModeAllocate)
		}
	}
}

// SlurmPool tells whether pool holds Slurm's devices (in allocate mode,
// a request for it is a placeholder Slurm allocation). A pool of all
// devices ([pools] absent) is Slurm's when every device is.
func (c *Config) SlurmPool(pool Pool, all []int) bool {
	if !c.Slurm.Active() {
		return false
	}
	ids := pool.IDs
	if ids == nil {
		ids = all
	}
	if len(ids) == 0 {
		return false
	}
	for _, id := range ids {
		if !c.Slurm.Manages(id) {
			return false
		}
	}
	return true
}

// OwnDevices returns the devices of all that npurun leases in its own
// pools: in split mode those that are not Slurm's, otherwise all.
func (c *Config) OwnDevices(all []int) []int {
	if !c.Slurm.Active() || c.Slurm.Mode != ModeSplit {
		return all
	}
	var own []int
	for _, id := range all {
		if !c.Slurm.Manages(id) {
			own = append(own, id)
		}
	}
	return own
}

// parseOrdered reads a device list in the order written ("6-7,4-5" is
// 6, 7, 4, 5), each id once.
func parseOrdered(s string) ([]int, error) {
	var ids []int
	err := idRanges(s, "id", func(a, b int) error {
		if len(ids)+b-a >= maxIDs {
			return fmt.Errorf("too many ids in %q (at most %d)", s, maxIDs)
		}
		for id := a; id <= b; id++ {
			if slices.Contains(ids, id) {
				return fmt.Errorf("%d is listed twice", id)
			}
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ids, nil
}

func plural(ids []int, one, many string) string {
	if len(ids) == 1 {
		return one + " " + strconv.Itoa(ids[0])
	}
	return many + " " + formatIDs(slices.Sorted(slices.Values(ids)))
}

func isAre(ids []int) string {
	if len(ids) == 1 {
		return " is"
	}
	return " are"
}

func isAreBare(ids []int) string { return strings.TrimSpace(isAre(ids)) }

func itThem(ids []int) string {
	if len(ids) == 1 {
		return "it"
	}
	return "them"
}
