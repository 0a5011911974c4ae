package policy

import (
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
unleased_exempt = ["dcgm-exporter", "/opt/mon/agent", "dcgm-exporter"]
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
	wantStatus := Status{ScanInterval: 2 * time.Second, UnleasedGrace: 5 * time.Second, UnleasedUse: UnleasedTerm,
		UnleasedExempt: []string{"dcgm-exporter", "/opt/mon/agent"}, ShowCommands: ShowCommandsOwn}
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

	none, err := Parse("npurun.conf", nil)
	if err != nil {
		t.Fatal(err)
	}
	if none.Restricted("guest", []string{"students"}) {
		t.Error("with no [restrict] table an account is restricted")
	}
	if none.MetricsListen != "" || none.Status.UnleasedUse != UnleasedReport || none.Status.ShowCommands != ShowCommandsAll ||
		none.Status.UnleasedGrace != 30*time.Second || none.Usage.Log != "" {
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
unleased_exempt = ["ok", 3]
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
		`npurun.conf:7: [status] unleased_exempt: must be an array of strings, not one holding an integer`,
		`npurun.conf:8: [status] show_commands: want "all" or "own", not "mine"`,
		`npurun.conf:9: [status] colour: unknown key (known: scan_interval, unleased_grace, unleased_use, unleased_exempt, show_commands)`,
		`npurun.conf:11: [usage] log: must be an absolute path, not "usage.log"`,
		`npurun.conf:12: [usage] max_size_mb: must be at least 1, not 0`,
		`npurun.conf:13: [usage] keep: must be at most 100, not 101`,
	}
	if got := strings.Split(err.Error(), "\n"); !reflect.DeepEqual(got, want) {
		t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
