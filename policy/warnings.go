package policy

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
)

// Warnings returns what in a valid configuration is probably a mistake,
// though the broker runs with it: a [user.NAME] or [group.NAME] table for
// an account that does not exist (yet: it may come from LDAP later, and the
// table applies from then on), devices that [pools] leaves out of every
// pool (nobody may lease them), and StatusWarnings.
//
// devices are the devices the broker manages: the config's ids, or those
// found on the machine where the config names none; nil skips the pools
// check. exists tells whether the account of kind "user" or "group"
// exists; nil skips the accounts check. Each warning carries its file and
// line, like an error.
func (c *Config) Warnings(devices []int, exists func(kind, name string) bool) Errors {
	var ws Errors
	warn := func(line int, key, format string, args ...any) {
		ws = append(ws, Error{File: c.file, Line: line, Key: key, Msg: "warning: " + fmt.Sprintf(format, args...)})
	}
	if exists != nil {
		for _, kind := range []string{"user", "group"} {
			m := c.Users
			if kind == "group" {
				m = c.Groups
			}
			for _, name := range slices.Sorted(maps.Keys(m)) {
				if !exists(kind, name) {
					warn(c.idx.line(kind, name), "["+kind+"."+name+"]",
						"no %s %q on this machine: the table applies to nobody until there is one (from LDAP, say)", kind, name)
				}
			}
		}
	}
	if devices != nil && !(len(c.Pools) == 1 && c.Pools[0].IDs == nil) {
		inPool := make(map[int]bool)
		for _, p := range c.Pools {
			for _, id := range p.IDs {
				inPool[id] = true
			}
		}
		var left []int
		for _, id := range devices {
			if !inPool[id] {
				left = append(left, id)
			}
		}
		slices.Sort(left)
		switch {
		case len(left) == 1:
			warn(c.idx.line("pools"), "[pools]", "device %d is in no pool, so nobody may lease it", left[0])
		case len(left) > 1:
			warn(c.idx.line("pools"), "[pools]", "devices %s are in no pool, so nobody may lease them", formatIDs(left))
		}
	}
	ws = append(ws, c.StatusWarnings()...)
	sort.SliceStable(ws, func(i, j int) bool { return ws[i].Line < ws[j].Line })
	return ws
}

// RestrictWarnings returns what makes [restrict] enforce less than it
// says: a restricted account that is still a member of a group that may
// open the device nodes (the ACL entries the broker manages are then no
// limit for it), and device nodes that every account may open.
//
// nodeGroups names the groups that own a device node with read or write
// permission; worldOpen lists the nodes that others may open. member tells
// whether user belongs to group (primary or supplementary); members lists
// the users of a group. Nil functions skip their checks.
func (c *Config) RestrictWarnings(nodeGroups, worldOpen []string, member func(user, group string) bool, members func(group string) []string) Errors {
	var ws Errors
	if !c.Restrict.Active() {
		return nil
	}
	warn := func(key string, path []string, format string, args ...any) {
		ws = append(ws, Error{File: c.file, Line: c.idx.line(path...), Key: key, Msg: "warning: " + fmt.Sprintf(format, args...)})
	}
	for _, node := range worldOpen {
		warn("[restrict]", []string{"restrict"}, "%s may be opened by every account: restricted accounts reach it without a lease (make it mode 0660)", node)
	}
	ws = append(ws, c.memberWarnings(nodeGroups, "may open the device nodes without a lease", member, members)...)
	return ws
}

// EngineWarnings returns a warning for each restricted account that is a
// member of a container engine's group (engineGroups: docker, and the
// groups that own an engine's socket): such a member runs containers as
// root, which may open any device node, mount any file, and so is root in
// all but name; [restrict] holds nothing against it.
func (c *Config) EngineWarnings(engineGroups []string, member func(user, group string) bool, members func(group string) []string) Errors {
	if !c.Restrict.Active() {
		return nil
	}
	return c.memberWarnings(engineGroups, "may run containers as root (root in all but name): it opens any device without a lease", member, members)
}

// memberWarnings warns of the restricted accounts that are members of one
// of groups, which does what says; member and members as for
// RestrictWarnings.
func (c *Config) memberWarnings(groups []string, what string, member func(user, group string) bool, members func(group string) []string) Errors {
	var ws Errors
	warn := func(key string, path []string, format string, args ...any) {
		ws = append(ws, Error{File: c.file, Line: c.idx.line(path...), Key: key, Msg: "warning: " + fmt.Sprintf(format, args...)})
	}
	hint := "take them out of it (gpasswd -d USER GROUP), see pam_npurun(8)"
	for _, g := range groups {
		if member != nil {
			for _, u := range c.Restrict.Users {
				if member(u, g) {
					warn("[restrict] users", []string{"restrict", "users"}, "restricted user %q is in group %q, which %s: %s", u, g, what, hint)
				}
			}
		}
		if members != nil {
			for _, rg := range c.Restrict.Groups {
				if rg == g {
					warn("[restrict] groups", []string{"restrict", "groups"}, "restricted group %q itself %s", rg, what)
					continue
				}
				var both []string
				for _, u := range members(rg) {
					if u != "root" && member != nil && member(u, g) {
						both = append(both, u)
					}
				}
				if len(both) > 0 {
					warn("[restrict] groups", []string{"restrict", "groups"}, "members of restricted group %q are in group %q, which %s (%s): %s", rg, g, what, strings.Join(both, ", "), hint)
				}
			}
		}
	}
	return ws
}
