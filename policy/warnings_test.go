package policy

import (
	"slices"
	"testing"
)

func TestWarnings(t *testing.T) {
	const conf = `[devices]
vendor = "fake"
ids = "0-15"

[pools]
interactive = "0-3"
queue = "8-11,13"

[user.alice]
max_devices = 2

[user.ghost]
max_devices = 1

[group.staff]
max_devices = 4

[group.nobody-here]
max_devices = 1
`
	c, err := Parse("npurun.conf", []byte(conf))
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{"user alice": true, "group staff": true}
	exists := func(kind, name string) bool { return known[kind+" "+name] }
	tests := []struct {
		name    string
		devices []int
		exists  func(kind, name string) bool
		want    []string
	}{
		{"everything", c.IDs, exists, []string{
			"npurun.conf:5: [pools]: warning: devices 4-7,12,14-15 are in no pool, so nobody may lease them",
			`npurun.conf:12: [user.ghost]: warning: no user "ghost" on this machine: the table applies to nobody until there is one (from LDAP, say)`,
			`npurun.conf:18: [group.nobody-here]: warning: no group "nobody-here" on this machine: the table applies to nobody until there is one (from LDAP, say)`,
		}},
		{"devices not known", nil, exists, []string{
			`npurun.conf:12: [user.ghost]: warning: no user "ghost" on this machine: the table applies to nobody until there is one (from LDAP, say)`,
			`npurun.conf:18: [group.nobody-here]: warning: no group "nobody-here" on this machine: the table applies to nobody until there is one (from LDAP, say)`,
		}},
		{"one device left out, accounts not checked", []int{0, 1, 2, 3, 8, 9, 10, 11, 13, 20}, nil, []string{
			"npurun.conf:5: [pools]: warning: device 20 is in no pool, so nobody may lease it",
		}},
		{"all in pools", []int{0, 1, 2, 3, 13}, func(string, string) bool { return true }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, w := range c.Warnings(tt.devices, tt.exists) {
				got = append(got, w.Error())
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Warnings =\n%q\nwant\n%q", got, tt.want)
			}
		})
	}

	// Without [pools], the one default pool holds every device.
	c, err = Parse("npurun.conf", []byte("[devices]\nvendor = \"fake\"\nids = \"0-3\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if ws := c.Warnings([]int{0, 1, 2, 3, 7}, nil); len(ws) != 0 {
		t.Errorf("Warnings without [pools] = %v, want none", ws)
	}
}
