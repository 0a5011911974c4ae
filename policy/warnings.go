package policy

import (
	"fmt"
	"maps"
	"slices"
	"sort"
)

// Warnings returns what in a valid configuration is probably a mistake,
// though the broker runs with it: a [user.NAME] or [group.NAME] table for
// an account that does not exist (yet: it may come from LDAP later, and the
// table applies from then on), and devices that [pools] leaves out of
// every pool (nobody may lease them).
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
	sort.SliceStable(ws, func(i, j int) bool { return ws[i].Line < ws[j].Line })
	return ws
}
