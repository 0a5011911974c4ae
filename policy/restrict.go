package policy

import "slices"

// Restrict names the restricted accounts ([restrict] users and groups):
// those that may reach a device only through a lease.
//
// This is the part of the [restrict] table that npubroker status needs
// (unleased_use acts on restricted accounts only). The device-discipline
// work (issue 7) owns the table and its other keys; when it lands, its
// parser replaces restrict below and Restricted stays the one predicate
// the broker asks.
type Restrict struct {
	Users  []string
	Groups []string
}

// Restricted tells whether user, a member of groups, is a restricted
// account. Root never is; with no [restrict] table nobody is.
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

// restrict reads the users and groups of the [restrict] table.
func (p *parser) restrict(raw map[string]any, c *Config) {
	table := []string{"restrict"}
	t, ok := p.table(nil, raw, "restrict")
	if !ok {
		return
	}
	p.unknown(table, t, "users", "groups")
	if list, ok := p.stringList(table, t, "users"); ok {
		c.Restrict.Users = list
	}
	if list, ok := p.stringList(table, t, "groups"); ok {
		c.Restrict.Groups = list
	}
}
