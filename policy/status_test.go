package policy

import (
	"net"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseStatusUsage(t *testing.T) {
	conf := `[broker]
metrics_listen = "127.0.0.1:9464"

[status]
scan_interval = "2s"
unleased_grace = "5s"
unleased_use = "term"
unleased_exempt_users = ["root", "dcgm", "dcgm"]
unleased_exempt_groups = ["monitors"]
show_commands = "own"

[usage]
log = "/var/log/npurun/usage.log"
max_size_mb = 2
keep = 0

[restrict]
users = ["guest"]
groups = ["students"]
`
	c, err := Parse("npurun.conf", []byte(conf))
	if err != nil {
		t.Fatal(err)
	}
	if c.MetricsListen != "127.0.0.1:9464" {
		t.Errorf("MetricsListen = %q", c.MetricsListen)
	}
	wantStatus := Status{ScanInterval: 2 * time.Second, UtilInterval: DefaultUtilInterval, UnleasedGrace: 5 * time.Second, UnleasedUse: UnleasedTerm,
		UnleasedExemptUsers: []string{"root", "dcgm"}, UnleasedExemptGroups: []string{"monitors"}, ShowCommands: ShowCommandsOwn}
	if !reflect.DeepEqual(c.Status, wantStatus) {
		t.Errorf("Status = %+v, want %+v", c.Status, wantStatus)
	}
	if want := (Usage{Log: "/var/log/npurun/usage.log", MaxSize: 2 << 20, Keep: 0}); c.Usage != want {
		t.Errorf("Usage = %+v, want %+v", c.Usage, want)
	}
	for _, tt := range []struct {
		user   string
		groups []string
		want   bool
	}{
		{"guest", nil, true},
		{"alice", []string{"staff", "students"}, true},
		{"alice", []string{"staff"}, false},
		{"root", []string{"students"}, false},
	} {
		if got := c.Restricted(tt.user, tt.groups); got != tt.want {
			t.Errorf("Restricted(%q, %q) = %v, want %v", tt.user, tt.groups, got, tt.want)
		}
	}

	for _, tt := range []struct {
		user   string
		groups []string
		want   bool
	}{
		{"dcgm", nil, true},
		{"alice", []string{"staff", "monitors"}, true},
		{"alice", []string{"staff"}, false},
		{"npu-smi", nil, false},
	} {
		if got := c.Status.Exempt(tt.user, tt.groups); got != tt.want {
			t.Errorf("Exempt(%q, %q) = %v, want %v", tt.user, tt.groups, got, tt.want)
		}
	}
	if ws := c.StatusWarnings(); len(ws) != 0 {
		t.Errorf("warnings: %v", ws)
	}

	none, err := Parse("npurun.conf", nil)
	if err != nil {
		t.Fatal(err)
	}
	if none.Restricted("guest", []string{"students"}) {
		t.Error("with no [restrict] table an account is restricted")
	}
	if none.MetricsListen != "" || none.Status.UnleasedUse != UnleasedReport || none.Status.ShowCommands != ShowCommandsAll ||
		none.Status.UnleasedGrace != 30*time.Second || none.Usage.Log != "" || !none.Status.Exempt("root", nil) || none.Status.Exempt("alice", nil) {
		t.Errorf("defaults: metrics %q, status %+v, usage %+v", none.MetricsListen, none.Status, none.Usage)
	}
}

func TestParseStatusUsageBad(t *testing.T) {
	conf := `[broker]
metrics_listen = "9464"
[status]
scan_interval = "0"
unleased_grace = "soon"
unleased_use = "shoot"
unleased_exempt_users = ["ok", 3]
show_commands = "mine"
colour = true
[usage]
log = "usage.log"
max_size_mb = 0
keep = 101
`
	_, err := Parse("npurun.conf", []byte(conf))
	if err == nil {
		t.Fatal("bad [status] and [usage] accepted")
	}
	want := []string{
		`npurun.conf:2: [broker] metrics_listen: want host:port such as "127.0.0.1:9464", not "9464"`,
		`npurun.conf:4: [status] scan_interval: must be at least "1s"`,
		`npurun.conf:5: [status] unleased_grace: bad duration "soon": a number must come before "soon" (want e.g. "10s", "90m", "6h", "1d")`,
		`npurun.conf:6: [status] unleased_use: want "report", "term" or "kill", not "shoot"`,
		`npurun.conf:7: [status] unleased_exempt_users: must be an array of user names, not one holding an integer`,
		`npurun.conf:8: [status] show_commands: want "all" or "own", not "mine"`,
		`npurun.conf:9: [status] colour: unknown key (known: scan_interval, util_interval, unleased_grace, unleased_use, unleased_exempt_users, unleased_exempt_groups, show_commands, unleased_exempt)`,
		`npurun.conf:11: [usage] log: must be an absolute path, not "usage.log"`,
		`npurun.conf:12: [usage] max_size_mb: must be at least 1, not 0`,
		`npurun.conf:13: [usage] keep: must be at most 100, not 101`,
	}
	if got := strings.Split(err.Error(), "\n"); !reflect.DeepEqual(got, want) {
		t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestUnleasedExemptRetired: a configuration written for a broker that
// exempted programs by name still parses, and a warning says the key is
// not read, where it is; so does one for an account both restricted and
// exempt.
func TestUnleasedExemptRetired(t *testing.T) {
	conf := `[status]
unleased_exempt = ["npu-smi"]
unleased_exempt_users = ["root", "guest"]

[restrict]
users = ["guest"]
`
	c, err := Parse("npurun.conf", []byte(conf))
	if err != nil {
		t.Fatal(err)
	}
	if c.Status.Exempt("npu-smi", nil) {
		t.Error("a program name of the retired key exempts an account of that name")
	}
	want := []string{
		"npurun.conf:2: [status] unleased_exempt: warning: no longer read: programs are not exempted by name",
		"npurun.conf:3: [status] unleased_exempt_users: warning: guest is restricted ([restrict] users) and exempt",
	}
	ws := c.Warnings(nil, nil)
	if len(ws) != len(want) {
		t.Fatalf("warnings: %v, want %d", ws, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(ws[i].Error(), w) {
			t.Errorf("warning %d: %q, want it to start %q", i, ws[i].Error(), w)
		}
	}
}

// TestSplitHostPort: the hand split of metrics_listen says what
// net.SplitHostPort says (package net stays out of policy's graph).
func TestSplitHostPort(t *testing.T) {
	for _, s := range []string{"127.0.0.1:9464", ":9464", "[::1]:9464", "[::1]", "::1:9464", "host:", "9464", "",
		"[::1]9464", "[[::1]]:9464", "a]:1", "a:[1]", "[a:b]:c", "[]:1", "x:y:z", "[::1]:"} {
		h, p, ok := splitHostPort(s)
		wh, wp, err := net.SplitHostPort(s)
		if ok != (err == nil) || h != wh || p != wp {
			t.Errorf("splitHostPort(%q) = %q, %q, %v; net says %q, %q, %v", s, h, p, ok, wh, wp, err)
		}
	}
}
