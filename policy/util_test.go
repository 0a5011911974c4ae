package policy

import (
	"strings"
	"testing"
	"time"
)

// TestParseUtil: [status] util_interval, [idle] below and [devices]
// fake_util, their defaults, and what is wrong with them, named by line.
func TestParseUtil(t *testing.T) {
	c, err := Parse("npurun.conf", []byte("[devices]\nvendor = \"fake\"\nids = \"0-3\"\n"))
	if err != nil || c.Status.UtilInterval != DefaultUtilInterval || c.Idle.Below != DefaultIdleBelow || c.FakeUtil != "" {
		t.Fatalf("defaults: got %v, %v, %q, %v", c.Status.UtilInterval, c.Idle.Below, c.FakeUtil, err)
	}
	for conf, want := range map[string]struct {
		every time.Duration
		below float64
	}{
		"[status]\nutil_interval = \"1s\"\n[idle]\nbelow = 10\n":      {time.Second, 10},
		"[status]\nutil_interval = \"2m\"\n[idle]\nbelow = 2.5\n":     {2 * time.Minute, 2.5},
		"[status]\nutil_interval = \"0\"\n[idle]\nbelow = \"100%\"\n": {0, 100},
	} {
		c, err := Parse("npurun.conf", []byte("[devices]\nvendor = \"fake\"\nids = \"0\"\nfake_util = \"/run/util\"\n"+conf))
		if err != nil || c.Status.UtilInterval != want.every || c.Idle.Below != want.below || c.FakeUtil != "/run/util" {
			t.Errorf("%q: got %v, %v, %q, %v; want %v, %v", conf, c.Status.UtilInterval, c.Idle.Below, c.FakeUtil, err, want.every, want.below)
		}
	}
	fake := "[devices]\nvendor = \"fake\"\nids = \"0\"\n"
	for conf, want := range map[string]string{
		fake + "[status]\nutil_interval = \"soon\"\n":              "npurun.conf:5: [status] util_interval:",
		fake + "[status]\nutil_interval = 30\n":                    "npurun.conf:5: [status] util_interval: must be a string",
		fake + "[status]\nutil_interval = \"1500ms\"\n":            "npurun.conf:5: [status] util_interval:",
		fake + "[idle]\nbelow = 0\n":                               "npurun.conf:5: [idle] below: must be a percentage above 0 and at most 100, not 0",
		fake + "[idle]\nbelow = 101\n":                             "npurun.conf:5: [idle] below: must be a percentage above 0 and at most 100, not 101",
		fake + "[idle]\nbelow = \"five\"\n":                        "npurun.conf:5: [idle] below: want a percentage such as 5",
		fake + "[idle]\nbelow = true\n":                            "npurun.conf:5: [idle] below: must be a number",
		fake + "[idle]\nbellow = 5\n":                              "npurun.conf:5: [idle] bellow: unknown key (known: below, after, action, warn_before, kinds)",
		"[devices]\nvendor = \"ascend\"\nfake_util = \"/run/u\"\n": "npurun.conf:3: [devices] fake_util: is the fake vendor's utilization directory",
		fake + "fake_util = \"util\"\n":                            "npurun.conf:4: [devices] fake_util: must be a clean absolute path",
	} {
		_, err := Parse("npurun.conf", []byte(conf))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", conf, err, want)
		}
	}
	// Both reload: [idle] and [status] are named as what changed.
	a, _ := Parse("npurun.conf", []byte(fake))
	b, _ := Parse("npurun.conf", []byte(fake+"[status]\nutil_interval = \"5s\"\n[idle]\nbelow = 1\n"))
	if got := a.NeedsRestart(b); len(got) != 0 {
		t.Errorf("NeedsRestart = %q, want nothing", got)
	}
	if got := strings.Join(a.Changed(b), " "); got != "[status] [idle]" {
		t.Errorf("Changed = %q, want [status] [idle]", got)
	}
}
