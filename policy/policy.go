// Package policy reads the configuration file and decides what each user
// may ask for. It imports nothing of the project but internal/quantity, and
// must never do I/O beyond reading the file it is given: no sockets, no
// /proc, no devices.
package policy

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/npurun/npurun/internal/quantity"
)

// Defaults of the [broker] table.
const (
	DefaultMaxConnections    = 16384
	DefaultMaxWaitingPerUser = 1024
)

// maxIDs bounds a device list, as npu.ParseIDs does.
const maxIDs = 4096

// Config is a validated configuration file.
type Config struct {
	Vendor            string        // as written; "auto" when absent
	IDs               []int         // nil when absent
	DevDir            string        // "/dev" when absent
	NPUSmi            string        // "" when absent: npu-smi in PATH
	NVIDIASmi         string        // "" when absent: nvidia-smi in PATH
	HealthInterval    time.Duration // [devices] health_interval: how often the vendor's tool is asked; 0: never
	FakeHealth        string        // [devices] fake_health: the fake vendor's health file
	FakeUtil          string        // [devices] fake_util: the directory of the fake vendor's utilization files
	MaxConnections    int
	MaxWaitingPerUser int
	DefaultPool       string
	Pools             []Pool           // file order; one pool "default" of all devices when [pools] is absent
	Default           Limit            // the [limits] table
	Users             map[string]Limit // [user.NAME], merged with Default
	Groups            map[string]Limit // [group.NAME], merged with Default
	Tasks             Tasks            // [tasks]
	MetricsListen     string           // [broker] metrics_listen: host:port for Prometheus; "" for none
	Status            Status           // [status]
	Usage             Usage            // [usage]
	Board             Board            // [board]: npuboard's
	Restrict          Restrict         // [restrict]
	Slurm             Slurm            // [slurm]
	Containers        Containers       // [containers]: npurun-runtime's
	Share             Share            // [share]: devices that hold shares of their memory
	Idle              Idle             // [idle]: when a lease is idle
	Cluster           Cluster          // [cluster]: a login node's scheduler
	Scheduling        Scheduling       // [scheduling]: how the line is served

	file string    // the file name as given to Parse, for warnings
	idx  lineIndex // where each table and key is, for warnings
}

// Defaults of the [tasks] table.
const (
	DefaultStateDir  = "/var/spool/npurun"
	DefaultMaxTasks  = 100000
	DefaultKeepEnded = 10000
	DefaultKillGrace = 10 * time.Second
	// MaxKillGrace bounds kill_grace: a day between SIGTERM and SIGKILL
	// is more than any command takes to end, and a limit plus it stays
	// far from a duration's range.
	MaxKillGrace = 24 * time.Hour
	// DefaultMaxQueued caps one user's waiting tasks unless the policy
	// says otherwise (max_queued_tasks = 0 lifts it).
	DefaultMaxQueued = 1000
)

// DefaultKeepEndedPerUser caps one user's ended tasks kept.
const DefaultKeepEndedPerUser = 1000

// Tasks configures detached tasks (task-submit).
type Tasks struct {
	StateDir     string        // the spool
	CPUSlots     int           // --no-device tasks running at once
	CPUThreads   int           // threads per CPU slot (OMP_NUM_THREADS and the like)
	IdlePriority bool          // --no-device tasks run at nice 19 in the idle I/O class
	MaxTasks     int           // tasks pending, blocked or running, all users together
	KeepEnded    int           // ended tasks remembered for list and show, all users together
	KeepEndedPer int           // ended tasks remembered per user (keep_ended_per_user)
	KillGrace    time.Duration // SIGTERM → SIGKILL
	TimeLimit    time.Duration // a task's limit when it asks for none; 0: none
	MaxTime      time.Duration // the longest --time allowed; 0: no cap
	Cgroup       string        // "auto", "off", or the cgroup v2 directory tasks' control groups are made in
	Notify       string        // the notify command of a task that names none (and no --no-notify); "": none
}

// Restrict is the [restrict] table: the accounts that reach a device only
// through a lease, and what their login sessions get.
type Restrict struct {
	Users        []string      // restricted accounts by name
	Groups       []string      // restricted accounts by group
	LoginDevices int           // devices of an interactive login's lease; 0: none
	LoginPool    string        // pool of the login lease; the default pool when absent
	OnBusy       string        // "wait", "hide" or "deny": the login lease finds nothing free
	BusyWait     time.Duration // for OnBusy "wait": how long, then as "hide"
	OnBrokerDown string        // "hide" or "deny": a login while the broker cannot be reached
}

// Defaults of the [restrict] table.
const (
	DefaultLoginDevices = 1
	DefaultOnBusy       = "hide"
	DefaultOnBrokerDown = "hide"
	// MaxBusyWait bounds on_busy = "wait D": a login waits at most this.
	MaxBusyWait = 10 * time.Minute
)

// Active tells whether [restrict] names any account.
func (r Restrict) Active() bool { return len(r.Users) > 0 || len(r.Groups) > 0 }

// Restricted tells whether user, a member of groups, is a restricted
// account. Root never is.
func (c *Config) Restricted(user string, groups []string) bool {
	if user == "root" {
		return false
	}
	if slices.Contains(c.Restrict.Users, user) {
		return true
	}
	for _, g := range groups {
		if slices.Contains(c.Restrict.Groups, g) {
			return true
		}
	}
	return false
}

// Pool is a named set of devices.
type Pool struct {
	Name string
	IDs  []int // nil: all devices of the broker
}

// Limit is what one user may ask for.
type Limit struct {
	MaxDevices int      // devices held at once; 0: no limit
	MaxQueued  int      // tasks waiting (pending or blocked) at once; 0: no limit
	MaxRunning int      // tasks running at once; 0: no limit
	Pools      []string // pools allowed; nil: all
	// IdleAfter and IdleAction override [idle] after and action for the
	// user or group ([user.NAME], [group.NAME]: idle_after, idle_action);
	// nil and "": not given (Config.IdleFor).
	IdleAfter  *time.Duration
	IdleAction string
	Source     string // where the limit came from, for denial messages: "user alice", "group students", "the default [limits]"
}

// AllowsPool reports whether the limit lets its user ask for pool name.
func (l Limit) AllowsPool(name string) bool {
	return l.Pools == nil || slices.Contains(l.Pools, name)
}

// Pool returns the pool called name.
func (c *Config) Pool(name string) (Pool, bool) {
	for _, p := range c.Pools {
		if p.Name == name {
			return p, true
		}
	}
	return Pool{}, false
}

// LimitFor returns the limit of user, a member of groups: the [user.NAME]
// entry if there is one; else the most permissive of the entries of the
// user's groups (largest max_devices, 0 being largest; union of pools);
// else the default.
func (c *Config) LimitFor(user string, groups []string) Limit {
	if l, ok := c.Users[user]; ok {
		return l
	}
	var (
		found  []string
		merged Limit
	)
	for _, g := range groups {
		l, ok := c.Groups[g]
		if !ok || slices.Contains(found, g) {
			continue
		}
		if len(found) == 0 {
			merged = Limit{MaxDevices: l.MaxDevices, MaxQueued: l.MaxQueued, MaxRunning: l.MaxRunning, Pools: slices.Clone(l.Pools)}
		} else {
			merged.MaxDevices = looser(merged.MaxDevices, l.MaxDevices)
			merged.MaxQueued = looser(merged.MaxQueued, l.MaxQueued)
			merged.MaxRunning = looser(merged.MaxRunning, l.MaxRunning)
			if merged.Pools != nil {
				if l.Pools == nil {
					merged.Pools = nil
				} else {
					for _, p := range l.Pools {
						if !slices.Contains(merged.Pools, p) {
							merged.Pools = append(merged.Pools, p)
						}
					}
				}
			}
		}
		found = append(found, g)
	}
	switch len(found) {
	case 0:
		return c.Default
	case 1:
		merged.Source = "group " + found[0]
	default:
		merged.Source = "groups " + strings.Join(found, ", ")
	}
	return merged
}

// looser is the more permissive of two caps where 0 means none.
func looser(a, b int) int {
	if a == 0 || b == 0 {
		return 0
	}
	return max(a, b)
}

// Load reads and parses the configuration file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(path, data)
}

// Parse parses and validates a configuration file. filename names the file
// in errors. A file that does not validate gives an *Errors listing every
// problem found.
func Parse(filename string, data []byte) (*Config, error) {
	var raw map[string]any
	md, err := toml.Decode(string(data), &raw)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, &Errors{{File: filename, Line: pe.Position.Line, Msg: lowerFirst(strings.TrimSuffix(pe.Message, "."))}}
		}
		return nil, &Errors{{File: filename, Msg: err.Error()}}
	}
	p := &parser{file: filename, idx: newLineIndex(data)}
	c := p.config(raw, md.Keys())
	if len(p.errs) > 0 {
		sort.SliceStable(p.errs, func(i, j int) bool { return p.errs[i].Line < p.errs[j].Line })
		return nil, &p.errs
	}
	c.file, c.idx = filename, p.idx
	return c, nil
}

var poolName = regexp.MustCompile(`^[a-z0-9_-]+$`)

type parser struct {
	file string
	idx  lineIndex
	errs Errors
}

// errorf records a problem with key (or with the table itself when key is
// "") of table.
func (p *parser) errorf(table []string, key, format string, args ...any) {
	name := "[" + strings.Join(table, ".") + "]"
	path := table
	if key != "" {
		name += " " + key
		path = append(slices.Clone(table), key)
	}
	if len(table) == 0 {
		name, path = key, []string{key}
	}
	p.errs = append(p.errs, Error{File: p.file, Line: p.idx.line(path...), Key: name, Msg: fmt.Sprintf(format, args...)})
}

// table returns raw[key] as a table, recording an error if it is something
// else.
func (p *parser) table(parent []string, raw map[string]any, key string) (map[string]any, bool) {
	v, ok := raw[key]
	if !ok {
		return nil, false
	}
	t, ok := v.(map[string]any)
	if !ok {
		p.errorf(parent, key, "must be a table, not %s", typeName(v))
		return nil, false
	}
	return t, true
}

// unknown records an error for each key of t not in known.
func (p *parser) unknown(table []string, t map[string]any, known ...string) {
	for _, k := range slices.Sorted(maps.Keys(t)) {
		if !slices.Contains(known, k) {
			p.errorf(table, k, "unknown key (known: %s)", strings.Join(known, ", "))
		}
	}
}

func (p *parser) str(table []string, t map[string]any, key string) (string, bool) {
	v, ok := t[key]
	if !ok {
		return "", false
	}
	s, ok := v.(string)
	if !ok {
		p.errorf(table, key, "must be a string, not %s", typeName(v))
	}
	return s, ok
}

// absPath is key's string, which must be an absolute path: a relative
// one is an error, and not ok.
func (p *parser) absPath(table []string, t map[string]any, key string) (string, bool) {
	s, ok := p.str(table, t, key)
	if ok && !filepath.IsAbs(s) {
		p.errorf(table, key, "must be an absolute path, not %q", s)
		return "", false
	}
	return s, ok
}

func (p *parser) integer(table []string, t map[string]any, key string, lowest int) (int, bool) {
	v, ok := t[key]
	if !ok {
		return 0, false
	}
	n, ok := v.(int64)
	if !ok {
		p.errorf(table, key, "must be an integer, not %s", typeName(v))
		return 0, false
	}
	switch {
	case n < int64(lowest):
		p.errorf(table, key, "must be at least %d, not %d", lowest, n)
		return 0, false
	case n > 1<<31-1:
		p.errorf(table, key, "must be at most %d, not %d", 1<<31-1, n)
		return 0, false
	}
	return int(n), true
}

// duration reads a duration such as "10s", "6h" or "1d" (as every
// command reads one: quantity.ParseDuration); "" or "0" is none.
func (p *parser) duration(table []string, t map[string]any, key string) (time.Duration, bool) {
	s, ok := p.str(table, t, key)
	if !ok {
		return 0, false
	}
	if s == "" || s == "0" {
		return 0, true
	}
	d, err := quantity.ParseDuration(s)
	if err != nil {
		p.errorf(table, key, "%v (want e.g. \"10s\", \"90m\", \"6h\", \"1d\")", err)
		return 0, false
	}
	if d%time.Second != 0 {
		p.errorf(table, key, "%q is not a whole number of seconds", s)
		return 0, false
	}
	return d, true
}

// MinHealthInterval is the shortest [devices] health_interval.
const MinHealthInterval = time.Second

// health reads [devices] health_interval and fake_health: the fake
// vendor's health is its file's, and only its.
func (p *parser) health(table []string, t map[string]any, c *Config) {
	if d, ok := p.duration(table, t, "health_interval"); ok {
		if d != 0 && d < MinHealthInterval {
			p.errorf(table, "health_interval", "must be at least %v, not %v", MinHealthInterval, d)
		} else {
			c.HealthInterval = d
		}
	}
	s, ok := p.str(table, t, "fake_health")
	switch {
	case !ok:
	case c.Vendor != "fake":
		p.errorf(table, "fake_health", "is the fake vendor's health file: vendor %q asks its own tool", c.Vendor)
	case !filepath.IsAbs(s):
		p.errorf(table, "fake_health", "must be an absolute path, not %q", s)
	default:
		c.FakeHealth = s
	}
	s, ok = p.str(table, t, "fake_util")
	switch {
	case !ok:
	case c.Vendor != "fake":
		p.errorf(table, "fake_util", "is the fake vendor's utilization directory: vendor %q asks its own tool", c.Vendor)
	case !filepath.IsAbs(s) || s != filepath.Clean(s):
		p.errorf(table, "fake_util", "must be a clean absolute path to a directory, not %q", s)
	default:
		c.FakeUtil = s
	}
}

func (p *parser) ids(table []string, t map[string]any, key string) ([]int, string, bool) {
	s, ok := p.str(table, t, key)
	if !ok {
		return nil, "", false
	}
	ids, err := parseIDs(s)
	if err != nil {
		p.errorf(table, key, "%v", err)
		return nil, "", false
	}
	if len(ids) == 0 {
		p.errorf(table, key, "no devices in %q", s)
		return nil, "", false
	}
	return ids, s, true
}

// tables are npurun.conf's tables, but for [user.NAME] and [group.NAME],
// in the order an error lists them.
var tables = []string{"devices", "broker", "pools", "limits", "tasks", "status", "usage", "restrict", "slurm", "containers", "share", "idle", "scheduling", "cluster", "board"}

func (p *parser) config(raw map[string]any, keys []toml.Key) *Config {
	c := &Config{
		Vendor:            "auto",
		DevDir:            "/dev",
		MaxConnections:    DefaultMaxConnections,
		MaxWaitingPerUser: DefaultMaxWaitingPerUser,
		Users:             map[string]Limit{},
		Groups:            map[string]Limit{},
		Tasks: Tasks{
			StateDir:     DefaultStateDir,
			CPUSlots:     max(1, runtime.NumCPU()/2),
			IdlePriority: true,
			MaxTasks:     DefaultMaxTasks,
			KeepEnded:    DefaultKeepEnded,
			KeepEndedPer: DefaultKeepEndedPerUser,
			KillGrace:    DefaultKillGrace,
			Cgroup:       "auto",
		},
	}
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		if slices.Contains(tables, k) || k == "user" || k == "group" {
			continue
		}
		if _, isTable := raw[k].(map[string]any); isTable {
			p.errs = append(p.errs, Error{File: p.file, Line: p.idx.line(k), Key: "[" + k + "]",
				Msg: "unknown table (known: " + strings.Join(tables, ", ") + ", user.NAME, group.NAME)"})
		} else {
			p.errorf(nil, k, "unknown key (keys belong in a table such as [devices])")
		}
	}

	// [devices]
	devices := []string{"devices"}
	var idsText string
	if t, ok := p.table(nil, raw, "devices"); ok {
		p.unknown(devices, t, "vendor", "ids", "dev_dir", "npu_smi", "nvidia_smi", "health_interval", "fake_health", "fake_util")
		if v, ok := p.str(devices, t, "vendor"); ok {
			switch v {
			case "ascend", "nvidia", "fake", "auto":
				c.Vendor = v
			default:
				p.errorf(devices, "vendor", "unknown vendor %q (want ascend, nvidia, fake or auto)", v)
			}
		}
		if ids, s, ok := p.ids(devices, t, "ids"); ok {
			c.IDs, idsText = ids, s
		}
		if _, ok := t["ids"]; !ok && c.Vendor == "fake" {
			p.errorf(devices, "vendor", "vendor \"fake\" needs ids")
		}
		if s, ok := p.str(devices, t, "dev_dir"); ok {
			if s == "" {
				p.errorf(devices, "dev_dir", "must not be empty")
			} else {
				c.DevDir = s
			}
		}
		if s, ok := p.str(devices, t, "npu_smi"); ok {
			c.NPUSmi = s
		}
		if s, ok := p.str(devices, t, "nvidia_smi"); ok {
			c.NVIDIASmi = s
		}
		p.health(devices, t, c)
	}

	// [pools], in file order.
	pools := []string{"pools"}
	if t, ok := p.table(nil, raw, "pools"); ok {
		owner := map[int]string{}
		for _, k := range keys {
			if len(k) != 2 || k[0] != "pools" {
				continue
			}
			name := k[1]
			if !poolName.MatchString(name) {
				p.errorf(pools, name, "bad pool name (want lowercase letters, digits, _ and -)")
				continue
			}
			ids, _, ok := p.ids(pools, t, name)
			if !ok {
				continue
			}
			var outside []int
			for _, id := range ids {
				if c.IDs != nil && !slices.Contains(c.IDs, id) {
					outside = append(outside, id)
				}
			}
			switch {
			case len(outside) == 1:
				p.errorf(pools, name, "device %d is not in [devices] ids %q", outside[0], idsText)
			case len(outside) > 1:
				p.errorf(pools, name, "devices %s are not in [devices] ids %q", formatIDs(outside), idsText)
			}
			both := map[string][]int{}
			var others []string
			for _, id := range ids {
				if o, taken := owner[id]; taken {
					if both[o] == nil {
						others = append(others, o)
					}
					both[o] = append(both[o], id)
				} else {
					owner[id] = name
				}
			}
			for _, o := range others {
				if d := both[o]; len(d) == 1 {
					p.errorf(pools, name, "device %d is in both pools %q and %q", d[0], o, name)
				} else {
					p.errorf(pools, name, "devices %s are in both pools %q and %q", formatIDs(d), o, name)
				}
			}
			c.Pools = append(c.Pools, Pool{Name: name, IDs: ids})
		}
		if len(t) == 0 {
			p.errorf(pools, "", "no pools defined")
		}
	}
	if _, present := raw["pools"]; !present {
		c.Pools = []Pool{{Name: "default"}}
	}
	poolExists := func(name string) bool {
		_, ok := c.Pool(name)
		return ok
	}

	// [broker]
	broker := []string{"broker"}
	if t, ok := p.table(nil, raw, "broker"); ok {
		p.unknown(broker, t, "max_connections", "max_waiting_per_user", "default_pool", "metrics_listen")
		p.metricsListen(broker, t, c)
		if n, ok := p.integer(broker, t, "max_connections", 1); ok {
			c.MaxConnections = n
		}
		if n, ok := p.integer(broker, t, "max_waiting_per_user", 1); ok {
			c.MaxWaitingPerUser = n
		}
		if s, ok := p.str(broker, t, "default_pool"); ok {
			if poolExists(s) {
				c.DefaultPool = s
			} else {
				p.errorf(broker, "default_pool", "no pool %q in [pools]", s)
			}
		}
	}
	if c.DefaultPool == "" && len(c.Pools) > 0 {
		c.DefaultPool = c.Pools[0].Name
	}

	// [tasks]
	tasks := []string{"tasks"}
	if t, ok := p.table(nil, raw, "tasks"); ok {
		p.unknown(tasks, t, "state_dir", "cpu_slots", "cpu_threads", "idle_priority", "max_tasks", "keep_ended", "keep_ended_per_user", "kill_grace", "time_limit", "max_time", "cgroup", "notify")
		if s, ok := p.absPath(tasks, t, "state_dir"); ok {
			c.Tasks.StateDir = s
		}
		if n, ok := p.integer(tasks, t, "cpu_slots", 0); ok {
			c.Tasks.CPUSlots = n
		}
		if n, ok := p.integer(tasks, t, "cpu_threads", 1); ok {
			c.Tasks.CPUThreads = n
		}
		if v, ok := t["idle_priority"]; ok {
			if b, isBool := v.(bool); isBool {
				c.Tasks.IdlePriority = b
			} else {
				p.errorf(tasks, "idle_priority", "must be a boolean, not %s", typeName(v))
			}
		}
		if n, ok := p.integer(tasks, t, "max_tasks", 1); ok {
			c.Tasks.MaxTasks = n
		}
		if n, ok := p.integer(tasks, t, "keep_ended", 0); ok {
			c.Tasks.KeepEnded = n
		}
		if n, ok := p.integer(tasks, t, "keep_ended_per_user", 0); ok {
			c.Tasks.KeepEndedPer = n
		}
		if d, ok := p.duration(tasks, t, "kill_grace"); ok {
			if d > MaxKillGrace {
				p.errorf(tasks, "kill_grace", "must be at most %s, not %s", quantity.Duration(MaxKillGrace), quantity.Duration(d))
			} else {
				c.Tasks.KillGrace = d
			}
		}
		if d, ok := p.duration(tasks, t, "time_limit"); ok {
			c.Tasks.TimeLimit = d
		}
		if d, ok := p.duration(tasks, t, "max_time"); ok {
			c.Tasks.MaxTime = d
		}
		if s, ok := p.str(tasks, t, "cgroup"); ok {
			if s != "auto" && s != "off" && !strings.HasPrefix(s, "/") {
				p.errorf(tasks, "cgroup", "must be \"auto\", \"off\" or an absolute path, not %q", s)
			} else {
				c.Tasks.Cgroup = s
			}
		}
		if s, ok := p.str(tasks, t, "notify"); ok {
			if strings.ContainsFunc(s, func(r rune) bool { return r < ' ' && r != '\t' }) {
				p.errorf(tasks, "notify", "must be one line of shell, not %q", s)
			} else {
				c.Tasks.Notify = s
			}
		}
		if c.Tasks.MaxTime > 0 && c.Tasks.TimeLimit > c.Tasks.MaxTime {
			p.errorf(tasks, "time_limit", "%s is longer than max_time %s", quantity.Duration(c.Tasks.TimeLimit), quantity.Duration(c.Tasks.MaxTime))
		}
	}
	if c.Tasks.CPUThreads == 0 {
		c.Tasks.CPUThreads = max(1, runtime.NumCPU()/max(1, c.Tasks.CPUSlots))
	}
	p.status(raw, c)
	p.usage(raw, c)
	p.board(raw, c)
	p.idle(raw, c)
	p.scheduling(raw, c)

	c.Restrict = p.restrict(raw, c, poolExists)
	c.Slurm = p.slurm(raw, c)
	c.Cluster = p.cluster(raw)
	p.containers(raw, c)
	p.share(raw, c, poolExists)

	// [limits], [user.NAME], [group.NAME]
	c.Default = Limit{MaxQueued: DefaultMaxQueued, Source: "the default [limits]"}
	if t, ok := p.table(nil, raw, "limits"); ok {
		c.Default = p.limit([]string{"limits"}, t, c.Default, poolExists)
	}
	for _, kind := range []string{"user", "group"} {
		t, ok := p.table(nil, raw, kind)
		if !ok {
			continue
		}
		out := c.Users
		if kind == "group" {
			out = c.Groups
		}
		for _, name := range slices.Sorted(maps.Keys(t)) {
			entry, ok := p.table([]string{kind}, t, name)
			if !ok {
				continue
			}
			base := c.Default
			base.Source = kind + " " + name
			out[name] = p.limit([]string{kind, name}, entry, base, poolExists)
		}
	}
	return c
}

// accountName is what [restrict] accepts as a user or group name: what
// useradd and groupadd accept, and nothing a line-based reader (the PAM
// module reads these names from the broker's session-policy file) could
// misread.
var accountName = regexp.MustCompile(`^[A-Za-z0-9_.][A-Za-z0-9_.-]*\$?$`)

// restrict reads the [restrict] table.
func (p *parser) restrict(raw map[string]any, c *Config, poolExists func(string) bool) Restrict {
	r := Restrict{LoginDevices: DefaultLoginDevices, OnBusy: DefaultOnBusy, OnBrokerDown: DefaultOnBrokerDown}
	table := []string{"restrict"}
	t, ok := p.table(nil, raw, "restrict")
	if !ok {
		return r
	}
	p.unknown(table, t, "users", "groups", "login_devices", "login_pool", "on_busy", "on_broker_down")
	r.Users = p.names(table, t, "users", "user")
	r.Groups = p.names(table, t, "groups", "group")
	for _, u := range r.Users {
		if u == "root" {
			p.errorf(table, "users", "root is never restricted: remove it from the list")
		}
	}
	if _, hasUsers := t["users"]; !hasUsers {
		if _, hasGroups := t["groups"]; !hasGroups {
			p.errorf(table, "", "names no account: give users = [...] or groups = [...]")
		}
	}
	if n, ok := p.integer(table, t, "login_devices", 0); ok {
		r.LoginDevices = n
	}
	if s, ok := p.str(table, t, "login_pool"); ok {
		if poolExists(s) {
			r.LoginPool = s
		} else {
			p.errorf(table, "login_pool", "no pool %q in [pools]", s)
		}
	}
	name := r.LoginPool
	if name == "" {
		name = c.DefaultPool
	}
	if pool, exists := c.Pool(name); exists && pool.IDs != nil && r.LoginDevices > len(pool.IDs) {
		p.errorf(table, "login_devices", "%d devices for a login, but pool %q has only %d", r.LoginDevices, name, len(pool.IDs))
	}
	if s, ok := p.str(table, t, "on_busy"); ok {
		switch rest, isWait := strings.CutPrefix(s, "wait "); {
		case s == "hide" || s == "deny":
			r.OnBusy = s
		case isWait:
			d, err := quantity.ParseDuration(strings.TrimSpace(rest))
			switch {
			case err != nil:
				p.errorf(table, "on_busy", "%v (want e.g. \"wait 30s\")", err)
			case d <= 0:
				p.errorf(table, "on_busy", "%q waits for no time (want e.g. \"wait 30s\")", s)
			case d%time.Second != 0:
				p.errorf(table, "on_busy", "%q is not a whole number of seconds", s)
			case d > MaxBusyWait:
				p.errorf(table, "on_busy", "%q waits longer than a login may: at most %s", s, quantity.Duration(MaxBusyWait))
			default:
				r.OnBusy, r.BusyWait = "wait", d
			}
		default:
			p.errorf(table, "on_busy", "unknown value %q (want \"wait 30s\", \"hide\" or \"deny\")", s)
		}
	}
	if s, ok := p.str(table, t, "on_broker_down"); ok {
		if s == "hide" || s == "deny" {
			r.OnBrokerDown = s
		} else {
			p.errorf(table, "on_broker_down", "unknown value %q (want \"hide\" or \"deny\")", s)
		}
	}
	return r
}

// names reads an array of account names.
func (p *parser) names(table []string, t map[string]any, key, kind string) []string {
	names, _ := p.list(table, t, key, kind+" names", func(s string) bool {
		if !accountName.MatchString(s) || len(s) > 256 {
			p.errorf(table, key, "bad %s name %q", kind, s)
			return false
		}
		return true
	})
	if len(names) == 0 {
		return nil // none named: as absent
	}
	return names
}

// limit reads a limits table over base.
func (p *parser) limit(table []string, t map[string]any, base Limit, poolExists func(string) bool) Limit {
	if table[0] == "limits" {
		p.unknown(table, t, "max_devices", "max_queued_tasks", "max_running_tasks", "pools")
	} else {
		p.unknown(table, t, "max_devices", "max_queued_tasks", "max_running_tasks", "pools", "idle_after", "idle_action")
	}
	l := base
	l.IdleAfter, l.IdleAction = nil, ""
	if table[0] != "limits" {
		if d, ok := p.duration(table, t, "idle_after"); ok {
			l.IdleAfter = &d
		}
		if s, ok := p.idleAction(table, t, "idle_action"); ok {
			l.IdleAction = s
		}
	}
	if n, ok := p.integer(table, t, "max_devices", 0); ok {
		l.MaxDevices = n
	}
	if n, ok := p.integer(table, t, "max_queued_tasks", 0); ok {
		l.MaxQueued = n
	}
	if n, ok := p.integer(table, t, "max_running_tasks", 0); ok {
		l.MaxRunning = n
	}
	pools, ok := p.list(table, t, "pools", "pool names", func(s string) bool {
		if !poolExists(s) {
			p.errorf(table, "pools", "no pool %q in [pools]", s)
			return false
		}
		return true
	})
	if ok {
		l.Pools = pools
	}
	return l
}

func typeName(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case int64:
		return "an integer"
	case float64:
		return "a float"
	case bool:
		return "a boolean"
	case []any, []map[string]any:
		return "an array"
	case map[string]any:
		return "a table"
	default:
		return "a date or time"
	}
}

func lowerFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToLower(s[:1]) + s[1:]
}

// parseIDs reads a device list such as "0-3,8" as npu.ParseIDs does (this
// package imports nothing of the project): sorted, each id once.
func parseIDs(s string) ([]int, error) {
	seen := map[int]bool{}
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	err := idRanges(s, "device id", func(a, b int) error {
		for id := a; id <= b; id++ {
			seen[id] = true
		}
		if len(seen) > maxIDs {
			return fmt.Errorf("too many device ids in %q (at most %d)", s, maxIDs)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return slices.Sorted(maps.Keys(seen)), nil
}

// idRanges calls fn with each part of the list s ("0-3,8": 0 to 3, then 8
// to 8), in the order written, a range of at most maxIDs ids; noun names
// an id in the errors ("device id").
func idRanges(s, noun string, fn func(a, b int) error) error {
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if strings.HasPrefix(part, "-") {
			return fmt.Errorf("negative %s %q", noun, part)
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, errA := atoi(lo)
		b, errB := a, error(nil)
		if isRange {
			b, errB = atoi(hi)
		}
		switch {
		case !isRange && errA != nil:
			return fmt.Errorf("bad %s %q", noun, part)
		case isRange && (errA != nil || errB != nil || b < a):
			return fmt.Errorf("bad range %q", part)
		case b-a >= maxIDs:
			return fmt.Errorf("too many %ss in %q (at most %d)", noun, s, maxIDs)
		}
		if err := fn(a, b); err != nil {
			return err
		}
	}
	return nil
}

func atoi(s string) (int, error) {
	s = strings.TrimSpace(s)
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("not a device id: %q", s)
	}
	return strconv.Atoi(s)
}

// formatIDs writes ascending ids with runs compacted: "0-3,8".
func formatIDs(ids []int) string {
	var parts []string
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, strconv.Itoa(ids[i])+"-"+strconv.Itoa(ids[j]))
		} else {
			parts = append(parts, strconv.Itoa(ids[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
