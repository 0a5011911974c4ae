package policy

import (
	"slices"
	"strings"
	"testing"
	"time"
)

const restrictBase = `[devices]
vendor = "fake"
ids = "0-7"

[pools]
interactive = "0-1"
queue = "2-7"
`

func TestRestrictParse(t *testing.T) {
	tests := []struct {
		name string
		conf string
		want Restrict
	}{
		{"absent", "", Restrict{LoginDevices: 1, OnBusy: "hide", OnBrokerDown: "hide"}},
		{"groups only", "[restrict]\ngroups = [\"students\"]\n",
			Restrict{Groups: []string{"students"}, LoginDevices: 1, OnBusy: "hide", OnBrokerDown: "hide"}},
		{"everything", `[restrict]
users = ["guest1", "guest2", "guest1"]
groups = ["students", "course-2025"]
login_devices = 2
login_pool = "interactive"
on_busy = "wait 30s"
on_broker_down = "deny"
`, Restrict{Users: []string{"guest1", "guest2"}, Groups: []string{"students", "course-2025"}, LoginDevices: 2,
			LoginPool: "interactive", OnBusy: "wait", BusyWait: 30 * time.Second, OnBrokerDown: "deny"}},
		{"no login lease", "[restrict]\nusers = [\"bob\"]\nlogin_devices = 0\non_busy = \"deny\"\n",
			Restrict{Users: []string{"bob"}, LoginDevices: 0, OnBusy: "deny", OnBrokerDown: "hide"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("npurun.conf", []byte(restrictBase+"\n"+tt.conf))
			if err != nil {
				t.Fatal(err)
			}
			got := c.Restrict
			if !slices.Equal(got.Users, tt.want.Users) || !slices.Equal(got.Groups, tt.want.Groups) ||
				got.LoginDevices != tt.want.LoginDevices || got.LoginPool != tt.want.LoginPool ||
				got.OnBusy != tt.want.OnBusy || got.BusyWait != tt.want.BusyWait || got.OnBrokerDown != tt.want.OnBrokerDown {
				t.Errorf("Restrict = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestRestrictParseBad(t *testing.T) {
	tests := []struct {
		name, conf, want string
	}{
		{"no accounts", "[restrict]\nlogin_devices = 1\n", "npurun.conf:9: [restrict]: names no account: give users = [...] or groups = [...]"},
		{"root", "[restrict]\nusers = [\"root\"]\n", "npurun.conf:10: [restrict] users: root is never restricted: remove it from the list"},
		{"bad name", "[restrict]\nusers = [\"a b\"]\n", `npurun.conf:10: [restrict] users: bad user name "a b"`},
		{"newline in name", "[restrict]\ngroups = [\"a\\nuser x\"]\n", `npurun.conf:10: [restrict] groups: bad group name "a\nuser x"`},
		{"not an array", "[restrict]\ngroups = \"students\"\n", "npurun.conf:10: [restrict] groups: must be an array of group names, not a string"},
		{"unknown key", "[restrict]\ngroups = [\"s\"]\nlogin_device = 1\n", "npurun.conf:11: [restrict] login_device: unknown key (known: users, groups, login_devices, login_pool, on_busy, on_broker_down)"},
		{"no such pool", "[restrict]\ngroups = [\"s\"]\nlogin_pool = \"gpu\"\n", `npurun.conf:11: [restrict] login_pool: no pool "gpu" in [pools]`},
		{"pool too small", "[restrict]\ngroups = [\"s\"]\nlogin_pool = \"interactive\"\nlogin_devices = 3\n", `npurun.conf:12: [restrict] login_devices: 3 devices for a login, but pool "interactive" has only 2`},
		{"default pool too small", "[restrict]\ngroups = [\"s\"]\nlogin_devices = 3\n", `npurun.conf:11: [restrict] login_devices: 3 devices for a login, but pool "interactive" has only 2`},
		{"negative devices", "[restrict]\ngroups = [\"s\"]\nlogin_devices = -1\n", "npurun.conf:11: [restrict] login_devices: must be at least 0, not -1"},
		{"on_busy word", "[restrict]\ngroups = [\"s\"]\non_busy = \"queue\"\n", `npurun.conf:11: [restrict] on_busy: unknown value "queue" (want "wait 30s", "hide" or "deny")`},
		{"on_busy duration", "[restrict]\ngroups = [\"s\"]\non_busy = \"wait soon\"\n", `npurun.conf:11: [restrict] on_busy: bad duration "soon": a number must come before "soon" (want e.g. "wait 30s")`},
		{"on_busy too long", "[restrict]\ngroups = [\"s\"]\non_busy = \"wait 1h\"\n", `npurun.conf:11: [restrict] on_busy: "wait 1h" waits longer than a login may: at most 10m`},
		{"on_busy fraction", "[restrict]\ngroups = [\"s\"]\non_busy = \"wait 1.5s\"\n", `npurun.conf:11: [restrict] on_busy: "wait 1.5s" is not a whole number of seconds`},
		{"on_broker_down", "[restrict]\ngroups = [\"s\"]\non_broker_down = \"wait\"\n", `npurun.conf:11: [restrict] on_broker_down: unknown value "wait" (want "hide" or "deny")`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("npurun.conf", []byte(restrictBase+"\n"+tt.conf))
			if err == nil {
				t.Fatalf("Parse accepted:\n%s", tt.conf)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse error:\n%v\nwant it to contain\n%s", err, tt.want)
			}
		})
	}
}

func TestRestricted(t *testing.T) {
	c, err := Parse("npurun.conf", []byte(restrictBase+"\n[restrict]\nusers = [\"guest\"]\ngroups = [\"students\", \"root\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		user   string
		groups []string
		want   bool
	}{
		{"guest", nil, true},
		{"alice", []string{"staff", "students"}, true},
		{"bob", []string{"staff"}, false},
		{"root", []string{"root", "students"}, false}, // root never is
		{"carol", []string{"root"}, true},             // a group called root is just a group
	}
	for _, tt := range tests {
		if got := c.Restricted(tt.user, tt.groups); got != tt.want {
			t.Errorf("Restricted(%q, %v) = %v, want %v", tt.user, tt.groups, got, tt.want)
		}
	}
	if none, _ := Parse("npurun.conf", []byte(restrictBase)); none.Restricted("guest", []string{"students"}) {
		t.Error("without [restrict] an account is restricted")
	}
}

func TestRestrictWarnings(t *testing.T) {
	conf := restrictBase + "\n[restrict]\nusers = [\"guest\", \"tidy\"]\ngroups = [\"students\", \"HwHiAiUser\"]\n"
	c, err := Parse("npurun.conf", []byte(conf))
	if err != nil {
		t.Fatal(err)
	}
	inGroup := map[string][]string{"HwHiAiUser": {"guest", "alice", "root"}, "video": {"bob"}}
	member := func(user, group string) bool { return slices.Contains(inGroup[group], user) }
	members := func(group string) []string {
		if group == "students" {
			return []string{"alice", "bob", "carol", "root"}
		}
		return nil
	}
	var got []string
	for _, w := range c.RestrictWarnings([]string{"HwHiAiUser", "video"}, []string{"/dev/davinci3"}, member, members) {
		got = append(got, w.Error())
	}
	want := []string{
		"npurun.conf:9: [restrict]: warning: /dev/davinci3 may be opened by every account: restricted accounts reach it without a lease (make it mode 0660)",
		`npurun.conf:10: [restrict] users: warning: restricted user "guest" is in group "HwHiAiUser", which may open the device nodes without a lease: take them out of it (gpasswd -d USER GROUP), see pam_npurun(8)`,
		`npurun.conf:11: [restrict] groups: warning: members of restricted group "students" are in group "HwHiAiUser", which may open the device nodes without a lease (alice): take them out of it (gpasswd -d USER GROUP), see pam_npurun(8)`,
		`npurun.conf:11: [restrict] groups: warning: restricted group "HwHiAiUser" itself may open the device nodes without a lease`,
		`npurun.conf:11: [restrict] groups: warning: members of restricted group "students" are in group "video", which may open the device nodes without a lease (bob): take them out of it (gpasswd -d USER GROUP), see pam_npurun(8)`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("RestrictWarnings =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	plain, _ := Parse("npurun.conf", []byte(restrictBase))
	if ws := plain.RestrictWarnings([]string{"HwHiAiUser"}, []string{"/dev/davinci0"}, member, members); len(ws) != 0 {
		t.Errorf("without [restrict]: %v, want no warning", ws)
	}
}

// TestEngineWarnings: a restricted account in a container engine's group
// (docker) runs containers as root: check-config says so.
func TestEngineWarnings(t *testing.T) {
	conf := restrictBase + "\n[restrict]\nusers = [\"guest\"]\ngroups = [\"students\"]\n"
	c, err := Parse("npurun.conf", []byte(conf))
	if err != nil {
		t.Fatal(err)
	}
	inGroup := map[string][]string{"docker": {"guest", "alice", "root"}}
	member := func(user, group string) bool { return slices.Contains(inGroup[group], user) }
	members := func(group string) []string {
		if group == "students" {
			return []string{"alice", "bob", "root"}
		}
		return nil
	}
	var got []string
	for _, w := range c.EngineWarnings([]string{"docker"}, member, members) {
		got = append(got, w.Error())
	}
	want := []string{
		`npurun.conf:10: [restrict] users: warning: restricted user "guest" is in group "docker", which may run containers as root (root in all but name): it opens any device without a lease: take them out of it (gpasswd -d USER GROUP), see pam_npurun(8)`,
		`npurun.conf:11: [restrict] groups: warning: members of restricted group "students" are in group "docker", which may run containers as root (root in all but name): it opens any device without a lease (alice): take them out of it (gpasswd -d USER GROUP), see pam_npurun(8)`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("EngineWarnings =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	plain, _ := Parse("npurun.conf", []byte(restrictBase))
	if ws := plain.EngineWarnings([]string{"docker"}, member, members); len(ws) != 0 {
		t.Errorf("without [restrict]: %v", ws)
	}
}
