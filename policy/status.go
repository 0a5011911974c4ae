package policy

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Defaults of the [status] and [usage] tables.
const (
	DefaultScanInterval  = 10 * time.Second
	DefaultUtilInterval  = 30 * time.Second
	MinUtilInterval      = time.Second
	DefaultUnleasedGrace = 30 * time.Second
	DefaultUsageMaxMB    = 16
	DefaultUsageKeep     = 4
)

// DefaultUnleasedExemptUsers are the accounts whose processes are never
// reported as unleased use unless [status] says otherwise: root, whose
// processes are the administrator's and the vendors' daemons (the NVIDIA
// persistence daemon and host engine, npu-smi run by root, exporters).
//
// Exemption is by account, never by program: a name or a path is one any
// user can take (a copy of a program, or the program run with a library
// of the user's preloaded), an account is not.
var DefaultUnleasedExemptUsers = []string{"root"}

// What the broker does about unleased use by a restricted account.
const (
	UnleasedReport = "report" // list it in npubroker status and the log
	UnleasedTerm   = "term"   // and send the process SIGTERM
	UnleasedKill   = "kill"   // and send the process SIGKILL
)

// Whose command lines npubroker status shows to an ordinary user.
const (
	ShowCommandsAll = "all" // everyone's, as ps(1) does
	ShowCommandsOwn = "own" // the asker's own; others' are left out
)

// Status configures npubroker status and the background scan behind it
// ([status]).
type Status struct {
	ScanInterval         time.Duration // the background /proc scan runs at most this often
	UtilInterval         time.Duration // how often each device's utilization is read; 0: never
	UnleasedGrace        time.Duration // how long an account uses a device node without a lease before it is reported
	UnleasedUse          string        // UnleasedReport, UnleasedTerm or UnleasedKill (restricted accounts only)
	UnleasedExemptUsers  []string      // accounts whose processes are never reported
	UnleasedExemptGroups []string      // and the members of these groups
	ShowCommands         string        // ShowCommandsAll or ShowCommandsOwn

	exemptPrograms bool // the retired unleased_exempt was given: a warning says it is not read
}

// ShowsCommand tells whether asker may see the command lines of owner's
// processes and tasks: root and the owner always, anyone where
// show_commands is "all". npubroker status and task-submit list --all
// both go by it.
func (s Status) ShowsCommand(asker, owner uint32) bool {
	return asker == 0 || asker == owner || s.ShowCommands == ShowCommandsAll
}

// Exempt tells whether the processes of user, a member of groups, are
// never reported as unleased use.
func (s Status) Exempt(user string, groups []string) bool {
	if slices.Contains(s.UnleasedExemptUsers, user) {
		return true
	}
	for _, g := range groups {
		if slices.Contains(s.UnleasedExemptGroups, g) {
			return true
		}
	}
	return false
}

// StatusWarnings returns what in [status] does not do what it may seem
// to: unleased_exempt, which exempted programs by name and is no longer
// read (a configuration written for an older broker still starts, and
// reports those programs' use like any other), and an account both
// restricted and exempt (exempt wins: its use is never reported nor acted
// on).
func (c *Config) StatusWarnings() Errors {
	var ws Errors
	if c.Status.exemptPrograms {
		ws = append(ws, Error{File: c.file, Line: c.idx.line("status", "unleased_exempt"), Key: "[status] unleased_exempt",
			Msg: "warning: no longer read: programs are not exempted by name, which any user can take; " +
				"their use without a lease is reported like any other (exempt the accounts that run them with unleased_exempt_users or unleased_exempt_groups)"})
	}
	for _, u := range c.Status.UnleasedExemptUsers {
		if slices.Contains(c.Restrict.Users, u) {
			ws = append(ws, Error{File: c.file, Line: c.idx.line("status", "unleased_exempt_users"), Key: "[status] unleased_exempt_users",
				Msg: fmt.Sprintf("warning: %s is restricted ([restrict] users) and exempt: its use without a lease is never reported nor acted on", u)})
		}
	}
	return ws
}

// Usage configures the accounting log of lease starts and ends ([usage]).
type Usage struct {
	Log     string // the log file; "" for usage.log in the state directory
	MaxSize int64  // bytes the log may reach before it is rotated
	Keep    int    // rotated files kept (usage.log.1 … usage.log.KEEP)
}

func defaultStatus() Status {
	return Status{
		ScanInterval:        DefaultScanInterval,
		UtilInterval:        DefaultUtilInterval,
		UnleasedGrace:       DefaultUnleasedGrace,
		UnleasedUse:         UnleasedReport,
		UnleasedExemptUsers: slices.Clone(DefaultUnleasedExemptUsers),
		ShowCommands:        ShowCommandsAll,
	}
}

func defaultUsage() Usage {
	return Usage{MaxSize: DefaultUsageMaxMB << 20, Keep: DefaultUsageKeep}
}

// metricsListen reads [broker] metrics_listen: a host:port to serve
// Prometheus metrics on, "" for none.
func (p *parser) metricsListen(table []string, t map[string]any, c *Config) {
	if s, ok := p.listen(table, t, "metrics_listen", "127.0.0.1:9464", ""); ok {
		c.MetricsListen = s
	}
}

// listen reads key, an address to listen on: host:port ("" or no host
// listens on every address, as net.Listen does), example shown where it
// is not one; false where it is not given, or bad (said). With also, the
// error names a second example, for every address.
func (p *parser) listen(table []string, t map[string]any, key, example, also string) (string, bool) {
	s, ok := p.str(table, t, key)
	if !ok || s == "" {
		return "", false
	}
	_, port, ok := splitHostPort(s)
	if n, err := strconv.Atoi(port); !ok || err != nil || n < 0 || n > 65535 {
		if also != "" {
			p.errorf(table, key, "want host:port such as %q (or %q for every address), not %q", example, also, s)
		} else {
			p.errorf(table, key, "want host:port such as %q, not %q", example, s)
		}
		return "", false
	}
	return s, true
}

// splitHostPort is net.SplitHostPort's split of "host:port",
// "[v6]:port" or ":port", false where it would fail: package net stays
// out of the programs that read npurun.conf in front of every task
// (task-submit on a login node; its start pays every package it links).
func splitHostPort(s string) (host, port string, ok bool) {
	if rest, found := strings.CutPrefix(s, "["); found {
		host, port, found = strings.Cut(rest, "]")
		if !found || !strings.HasPrefix(port, ":") || strings.ContainsAny(host, "[]") {
			return "", "", false
		}
		port = port[1:]
	} else {
		i := strings.LastIndexByte(s, ':')
		if i < 0 {
			return "", "", false
		}
		host, port = s[:i], s[i+1:]
		if strings.ContainsAny(host, ":[]") {
			return "", "", false
		}
	}
	if strings.ContainsAny(port, "[]") {
		return "", "", false
	}
	return host, port, true
}

// status reads the [status] table.
func (p *parser) status(raw map[string]any, c *Config) {
	c.Status = defaultStatus()
	table := []string{"status"}
	t, ok := p.table(nil, raw, "status")
	if !ok {
		return
	}
	p.unknown(table, t, "scan_interval", "util_interval", "unleased_grace", "unleased_use", "unleased_exempt_users", "unleased_exempt_groups", "show_commands", "unleased_exempt")
	if d, ok := p.duration(table, t, "scan_interval"); ok {
		if d < time.Second {
			p.errorf(table, "scan_interval", "must be at least \"1s\"")
		} else {
			c.Status.ScanInterval = d
		}
	}
	if _, given := t["util_interval"]; given {
		if d, ok := p.duration(table, t, "util_interval"); ok {
			if d != 0 && d < MinUtilInterval {
				p.errorf(table, "util_interval", "must be at least %q (or \"0\": never), not %q", "1s", t["util_interval"])
			} else {
				c.Status.UtilInterval = d
			}
		}
	}
	if d, ok := p.duration(table, t, "unleased_grace"); ok {
		c.Status.UnleasedGrace = d
	}
	if s, ok := p.str(table, t, "unleased_use"); ok {
		switch s {
		case UnleasedReport, UnleasedTerm, UnleasedKill:
			c.Status.UnleasedUse = s
		default:
			p.errorf(table, "unleased_use", "want \"report\", \"term\" or \"kill\", not %q", s)
		}
	}
	if _, ok := t["unleased_exempt_users"]; ok {
		c.Status.UnleasedExemptUsers = p.names(table, t, "unleased_exempt_users", "user")
	}
	if _, ok := t["unleased_exempt_groups"]; ok {
		c.Status.UnleasedExemptGroups = p.names(table, t, "unleased_exempt_groups", "group")
	}
	if _, ok := p.stringList(table, t, "unleased_exempt"); ok {
		c.Status.exemptPrograms = true // retired: StatusWarnings says so
	}
	if s, ok := p.str(table, t, "show_commands"); ok {
		switch s {
		case ShowCommandsAll, ShowCommandsOwn:
			c.Status.ShowCommands = s
		default:
			p.errorf(table, "show_commands", "want \"all\" or \"own\", not %q", s)
		}
	}
}

// usage reads the [usage] table.
func (p *parser) usage(raw map[string]any, c *Config) {
	c.Usage = defaultUsage()
	table := []string{"usage"}
	t, ok := p.table(nil, raw, "usage")
	if !ok {
		return
	}
	p.unknown(table, t, "log", "max_size_mb", "keep")
	if s, ok := p.str(table, t, "log"); ok {
		switch {
		case !filepath.IsAbs(s):
			p.errorf(table, "log", "must be an absolute path, not %q", s)
		case s != filepath.Clean(s) || filepath.Base(s) == "/":
			p.errorf(table, "log", "must be a clean path to a file, not %q", s)
		default:
			c.Usage.Log = s
		}
	}
	if n, ok := p.integer(table, t, "max_size_mb", 1); ok {
		c.Usage.MaxSize = int64(n) << 20
	}
	if n, ok := p.integer(table, t, "keep", 0); ok {
		if n > 100 {
			p.errorf(table, "keep", "must be at most 100, not %d", n)
		} else {
			c.Usage.Keep = n
		}
	}
}

// stringList reads an array of strings, dropping repeats.
func (p *parser) stringList(table []string, t map[string]any, key string) ([]string, bool) {
	return p.list(table, t, key, "strings", nil)
}

// list reads the array of strings at key: the one reader of the file's
// arrays of words (stringList, account names, a limit's pools). ok is
// false where the key is absent, or is not an array of strings, which is
// said with noun ("must be an array of pool names, not a string"). An item
// that keep (where not nil) refuses, saying why, is left out, and so is a
// repeat.
func (p *parser) list(table []string, t map[string]any, key, noun string, keep func(string) bool) ([]string, bool) {
	v, ok := t[key]
	if !ok {
		return nil, false
	}
	items, ok := v.([]any)
	if !ok {
		p.errorf(table, key, "must be an array of %s, not %s", noun, typeName(v))
		return nil, false
	}
	out := make([]string, 0, len(items))
	for _, item := range items {
		s, ok := item.(string)
		if !ok {
			p.errorf(table, key, "must be an array of %s, not one holding %s", noun, typeName(item))
			return nil, false
		}
		if keep != nil && !keep(s) {
			continue
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out, true
}

// Defaults of the [idle] table.
const (
	// DefaultIdleBelow is [idle] below: a device under this
	// utilization, in percent, is idle.
	DefaultIdleBelow = 5.0
	// DefaultIdleWarnBefore is [idle] warn_before: how long before
	// after the holder is warned.
	DefaultIdleWarnBefore = time.Hour
)

// What the broker does about a lease idle for [idle] after.
const (
	IdleReport  = "report"  // log it and mark it in status
	IdleWarn    = "warn"    // and tell its holders, once, warn_before ahead
	IdleReclaim = "reclaim" // and end the lease at after, as a time limit does
)

// idleActions are the actions, mildest first.
var idleActions = []string{IdleReport, IdleWarn, IdleReclaim}

// DefaultIdleKinds are the lease kinds [idle] acts on unless kinds says
// otherwise: tasks and Slurm jobs have time limits, containers say.
var DefaultIdleKinds = []string{"inline", "login"}

// idleKinds are the kinds [idle] kinds may name (lease.Kind's values).
var idleKinds = []string{"inline", "login", "task", "slurm", "container"}

// Idle is the [idle] table: when a lease counts as idle, and what is done
// about a lease idle for long.
type Idle struct {
	// Below is the utilization, in percent, under which a device is
	// idle: a lease is idle while every sample of all its devices is
	// under it.
	Below float64
	// After is how long a lease may be idle before Action; 0: never
	// act. [user.NAME] and [group.NAME] override it and Action
	// (idle_after, idle_action): Config.IdleFor.
	After      time.Duration
	Action     string        // IdleReport, IdleWarn or IdleReclaim
	WarnBefore time.Duration // for IdleWarn and IdleReclaim: the warning comes this long before After
	Kinds      []string      // the lease kinds it acts on
}

// Applies tells whether [idle] acts on leases of kind.
func (i Idle) Applies(kind string) bool { return slices.Contains(i.Kinds, kind) }

// IdleFor returns how long a lease of user, a member of groups, may be
// idle (0: for ever) and what is done then: [user.NAME]'s idle_after
// and idle_action where given, else its groups' (the most lenient:
// the longest after, 0 longest of all, the mildest action), else
// [idle]'s.
func (c *Config) IdleFor(user string, groups []string) (time.Duration, string) {
	after, action := c.Idle.After, c.Idle.Action
	if l, ok := c.Users[user]; ok {
		if l.IdleAfter != nil {
			after = *l.IdleAfter
		}
		if l.IdleAction != "" {
			action = l.IdleAction
		}
		return after, action
	}
	var found []string
	for _, g := range groups {
		l, ok := c.Groups[g]
		if !ok || slices.Contains(found, g) {
			continue
		}
		a, act := c.Idle.After, c.Idle.Action
		if l.IdleAfter != nil {
			a = *l.IdleAfter
		}
		if l.IdleAction != "" {
			act = l.IdleAction
		}
		if len(found) == 0 {
			after, action = a, act
		} else {
			if after != 0 && (a == 0 || a > after) {
				after = a
			}
			if slices.Index(idleActions, act) < slices.Index(idleActions, action) {
				action = act
			}
		}
		found = append(found, g)
	}
	return after, action
}

// idleAction reads an action of [idle] (action) or of [user.NAME] and
// [group.NAME] (idle_action).
func (p *parser) idleAction(table []string, t map[string]any, key string) (string, bool) {
	s, ok := p.str(table, t, key)
	if !ok {
		return "", false
	}
	if !slices.Contains(idleActions, s) {
		p.errorf(table, key, "want \"report\", \"warn\" or \"reclaim\", not %q", s)
		return "", false
	}
	return s, true
}

// idle reads the [idle] table.
func (p *parser) idle(raw map[string]any, c *Config) {
	c.Idle = Idle{Below: DefaultIdleBelow, Action: IdleReport, WarnBefore: DefaultIdleWarnBefore, Kinds: slices.Clone(DefaultIdleKinds)}
	table := []string{"idle"}
	t, ok := p.table(nil, raw, "idle")
	if !ok {
		return
	}
	p.unknown(table, t, "below", "after", "action", "warn_before", "kinds")
	if d, ok := p.duration(table, t, "after"); ok {
		c.Idle.After = d
	}
	if s, ok := p.idleAction(table, t, "action"); ok {
		c.Idle.Action = s
	}
	if d, ok := p.duration(table, t, "warn_before"); ok {
		c.Idle.WarnBefore = d
	}
	if kinds, ok := p.stringList(table, t, "kinds"); ok {
		for _, k := range kinds {
			if !slices.Contains(idleKinds, k) {
				p.errorf(table, "kinds", "unknown lease kind %q (known: %s)", k, strings.Join(idleKinds, ", "))
			}
		}
		c.Idle.Kinds = kinds
	}
	v, ok := t["below"]
	if !ok {
		return
	}
	var pct float64
	switch x := v.(type) {
	case int64:
		pct = float64(x)
	case float64:
		pct = x
	case string:
		n, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(x), "%"), 64)
		if err != nil || !strings.HasSuffix(strings.TrimSpace(x), "%") {
			p.errorf(table, "below", "want a percentage such as 5 or \"5%%\", not %q", x)
			return
		}
		pct = n
	default:
		p.errorf(table, "below", "must be a number (a percentage such as 5), not %s", typeName(v))
		return
	}
	if !(pct > 0 && pct <= 100) {
		p.errorf(table, "below", "must be a percentage above 0 and at most 100, not %v", pct)
		return
	}
	c.Idle.Below = pct
}
