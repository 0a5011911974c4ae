package broker

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/wire"
)

// ErrReloadRefused is a reload's refusal: the file does not validate,
// changes what needs a restart, or cannot be read. Nothing changed.
var ErrReloadRefused = errors.New("configuration not taken")

// Reload reads the configuration file again and takes it up without a
// restart (SIGHUP, npubroker reload): a file that does not validate, or
// that changes what a running broker cannot (policy.NeedsRestart, named),
// is refused and nothing changes. Otherwise the rooms are handed the new
// policy one at a time, each its own way: the broker's (limits, waits,
// sessions, the health checks), the access gate's ([restrict]), the
// status room's ([status]);
// then, under Server.mu and the task room's lock (the lock order's), the
// lease table's line is checked again against the new pools and limits
// (lease.Table.Reconfigure) while no request can join it under the old
// policy: a waiter the new policy refuses is told so (code denied: npurun
// exits 77) and leaves the line, a task among them fails, not started.
// No lease, connection or other waiter is touched: a lease the new policy
// would not grant runs on to its end. That step, the only one that holds
// the grants back, is a walk of the line (the benchmark
// BenchmarkReloadPause measures it). Reloads are one at a time.
func (s *Server) Reload() (*wire.ReloadInfo, error) {
	s.reload.Lock()
	defer s.reload.Unlock()
	path := s.cfgPath
	if path == "" {
		return nil, fmt.Errorf("%w: this broker was started without a configuration file to read again", ErrReloadRefused)
	}
	n, pools, info, err := s.checkReload(path)
	if err != nil {
		return nil, err
	}

	// The limits of the users waiting come from the accounts they were
	// looked up as when they asked: a cache, never NSS, under the locks.
	limitOf := func(uid uint32, _ string) (policy.Limit, bool) {
		acct := s.acc.cachedAccount(uid)
		if acct == nil {
			return policy.Limit{}, false
		}
		return n.LimitFor(acct.name, acct.groups), true
	}
	s.acc.setPolicy(n)
	s.status.SetPolicy(n)
	var refused []lease.Refused
	var tableErr error
	var tasksRefused []lease.Refused
	s.mu.Lock()
	s.cfg.Store(n)
	s.tasks.SetPolicy(n, func() {
		refused, tableErr = s.table.Reconfigure(pools, n.DefaultPool, limitOf)
		s.table.SetBackfill(n.Scheduling.Backfill)
	})
	tasksRefused = s.refuseLocked(refused, "the broker's configuration, reloaded, refuses this request: ")
	s.mu.Unlock()
	if tableErr != nil { // CheckPools took these pools: not seen
		s.log.Printf("reload %s: the lease table kept its pools: %v", path, tableErr)
	}
	for _, r := range tasksRefused {
		s.tasks.Refuse(r.W, "the broker's configuration, reloaded, refuses it: "+r.Why.Msg)
	}
	info.Refused = len(refused)
	if err := s.writeSessionPolicy(s.runDir); err != nil {
		s.log.Printf("reload %s: %v", path, err)
	}
	select {
	case s.healthWake <- struct{}{}: // [devices] health_interval, from the next round
	default:
	}
	select {
	case s.utilWake <- struct{}{}: // [status] util_interval, [devices] fake_util
	default:
	}
	s.mu.Lock()
	s.scheduleLocked() // the new pools and limits may let waiters through
	s.progressLocked() // and the reasons they wait change
	s.mu.Unlock()
	return info, nil
}

// CheckReload tells whether a reload would take the configuration file
// at path, changing nothing (npubroker check-config, where this broker
// runs): what it would change, or why it would be refused, as Reload
// says it. Reloads and checks are one at a time.
func (s *Server) CheckReload(path string) (*wire.ReloadInfo, error) {
	s.reload.Lock()
	defer s.reload.Unlock()
	_, _, info, err := s.checkReload(path)
	return info, err
}

// checkReload validates the file at path as a reload of this broker takes
// it: LoadConfig (the file, its devices and pools on this machine, as
// serve and check-config take it), then against the running broker: what
// needs a restart (policy.NeedsRestart, named) and the lease table's
// pools. It returns the configuration, the table's pools of it, and what
// it changes; an error wraps ErrReloadRefused.
func (s *Server) checkReload(path string) (*policy.Config, []lease.Pool, *wire.ReloadInfo, error) {
	n, _, err := LoadConfig(path)
	if err != nil {
		var perrs *policy.Errors
		if errors.As(err, &perrs) {
			lines := make([]string, len(*perrs))
			for i, e := range *perrs {
				lines[i] = e.Error()
			}
			return nil, nil, nil, fmt.Errorf("%w: %s", ErrReloadRefused, strings.Join(lines, "; "))
		}
		return nil, nil, nil, fmt.Errorf("%w: %w", ErrReloadRefused, err)
	}
	old := s.policy()
	// What the command line set (--state-dir, --cgroup), the file's
	// [tasks] does not: a change of it there changes nothing, and is no
	// cause to refuse the rest.
	if s.flagged.stateDir {
		n.Tasks.StateDir = old.Tasks.StateDir
	}
	if s.flagged.cgroup {
		n.Tasks.Cgroup = old.Tasks.Cgroup
	}
	if names := old.NeedsRestart(n); len(names) > 0 {
		return nil, nil, nil, fmt.Errorf("%w: %s: %s cannot change without a restart of the broker", ErrReloadRefused, path, strings.Join(names, ", "))
	}
	pools := tablePools(n, s.inv.IDs)
	if err := s.table.CheckPools(pools, n.DefaultPool); err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %s: %w", ErrReloadRefused, path, err)
	}
	return n, pools, &wire.ReloadInfo{Config: path, Changed: old.Changed(n)}, nil
}

// tablePools are the lease table's pools of configuration cfg, on a
// machine of devices ids.
func tablePools(cfg *policy.Config, ids []int) []lease.Pool {
	pools := make([]lease.Pool, len(cfg.Pools))
	for i, p := range cfg.Pools {
		pools[i] = lease.Pool{Name: p.Name, IDs: p.IDs}
	}
	return slurmPools(cfg, ids, pools)
}

// reloadOp serves npubroker reload (root only): the answer says what was
// taken, or why nothing was. With Check (npubroker check-config, a file's
// path) it says what a reload of that file would change, or why it
// would be refused, and takes nothing.
func (s *Server) reloadOp(c *conn, req *wire.Request) bool {
	reply := func(r *wire.Reply) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return c.sendLocked(r) == nil
	}
	if c.uid != 0 {
		return reply(errReply(wire.CodeDenied, fmt.Sprintf("reload is root's: uid %d may not reload the broker's configuration", c.uid), "run it as root (sudo npubroker reload)"))
	}
	if req.Check != "" { // npubroker check-config: the same checks, nothing taken
		info, err := s.CheckReload(req.Check)
		if err != nil {
			return reply(errReply(wire.CodeConfigRefused, err.Error(), ""))
		}
		return reply(&wire.Reply{Type: wire.TypeReloaded, Reload: info})
	}
	info, err := s.ReloadLogged("npubroker reload")
	if err != nil {
		return reply(errReply(wire.CodeConfigRefused, err.Error(), "npubroker check-config "+s.cfgPath))
	}
	return reply(&wire.Reply{Type: wire.TypeReloaded, Reload: info})
}

// ReloadLogged is Reload, its outcome in the log: what asked for it (by).
func (s *Server) ReloadLogged(by string) (*wire.ReloadInfo, error) {
	start := time.Now()
	info, err := s.Reload()
	if err != nil {
		s.log.Printf("%s: %v", by, err)
		return nil, err
	}
	changed := "nothing changed"
	if len(info.Changed) > 0 {
		changed = strings.Join(info.Changed, ", ") + " changed"
	}
	s.log.Printf("%s: reloaded %s in %s: %s; %d waiting requests refused by it", by, info.Config, time.Since(start).Round(time.Microsecond), changed, info.Refused)
	return info, nil
}
