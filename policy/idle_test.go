package policy

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestParseIdle: [idle] after, action, warn_before and kinds, their
// defaults (never act; report; 1h; inline and login), the overrides of
// [user.NAME] and [group.NAME] (idle_after, idle_action: a user's own
// first, else the most lenient of its groups'), and what is wrong with
// them, named by line.
func TestParseIdle(t *testing.T) {
	fake := "[devices]\nvendor = \"fake\"\nids = \"0\"\n"
	c, err := Parse("npurun.conf", []byte(fake))
	if err != nil {
		t.Fatal(err)
	}
	if i := c.Idle; i.After != 0 || i.Action != IdleReport || i.WarnBefore != time.Hour || !slices.Equal(i.Kinds, []string{"inline", "login"}) {
		t.Errorf("defaults: %+v", i)
	}
	if !c.Idle.Applies("inline") || !c.Idle.Applies("login") || c.Idle.Applies("task") || c.Idle.Applies("slurm") {
		t.Errorf("default kinds: %v", c.Idle.Kinds)
	}
	c, err = Parse("npurun.conf", []byte(fake+`[idle]
after = "24h"
action = "reclaim"
warn_before = "2h"
kinds = ["inline", "task"]
[user.alice]
idle_after = "48h"
[user.bob]
idle_action = "warn"
[user.root]
idle_after = "0"
[group.lab]
idle_after = "12h"
[group.students]
idle_after = "36h"
idle_action = "report"
[group.night]
idle_after = "0"
`))
	if err != nil {
		t.Fatal(err)
	}
	if i := c.Idle; i.After != 24*time.Hour || i.Action != IdleReclaim || i.WarnBefore != 2*time.Hour || !slices.Equal(i.Kinds, []string{"inline", "task"}) {
		t.Errorf("[idle] = %+v", i)
	}
	for _, tc := range []struct {
		user   string
		groups []string
		after  time.Duration
		action string
	}{
		{"carol", nil, 24 * time.Hour, IdleReclaim},
		{"alice", []string{"lab"}, 48 * time.Hour, IdleReclaim}, // a user's own entry wins
		{"bob", nil, 24 * time.Hour, IdleWarn},
		{"root", nil, 0, IdleReclaim},
		{"dave", []string{"lab"}, 12 * time.Hour, IdleReclaim},
		{"erin", []string{"lab", "students"}, 36 * time.Hour, IdleReport},
		{"fred", []string{"lab", "night"}, 0, IdleReclaim}, // never is the longest
	} {
		after, action := c.IdleFor(tc.user, tc.groups)
		if after != tc.after || action != tc.action {
			t.Errorf("IdleFor(%s, %v) = %v, %s; want %v, %s", tc.user, tc.groups, after, action, tc.after, tc.action)
		}
	}
	for conf, want := range map[string]string{
		fake + "[idle]\nafter = \"soon\"\n":               "npurun.conf:5: [idle] after:",
		fake + "[idle]\naction = \"kill\"\n":              `npurun.conf:5: [idle] action: want "report", "warn" or "reclaim", not "kill"`,
		fake + "[idle]\nkinds = [\"inline\", \"vm\"]\n":   `npurun.conf:5: [idle] kinds: unknown lease kind "vm"`,
		fake + "[idle]\nwarn_before = 5\n":                "npurun.conf:5: [idle] warn_before: must be a string",
		fake + "[user.alice]\nidle_action = \"nuke\"\n":   `npurun.conf:5: [user.alice] idle_action: want "report", "warn" or "reclaim"`,
		fake + "[group.lab]\nidle_after = \"1 parsec\"\n": "npurun.conf:5: [group.lab] idle_after:",
		fake + "[limits]\nidle_after = \"1h\"\n":          "npurun.conf:5: [limits] idle_after: unknown key",
	} {
		_, err := Parse("npurun.conf", []byte(conf))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", conf, err, want)
		}
	}
	// A reload takes [idle] and the overrides up.
	a, _ := Parse("npurun.conf", []byte(fake))
	b, _ := Parse("npurun.conf", []byte(fake+"[idle]\nafter = \"1h\"\n[user.alice]\nidle_after = \"2h\"\n"))
	if got := a.NeedsRestart(b); len(got) != 0 {
		t.Errorf("NeedsRestart = %q, want nothing", got)
	}
	if got := strings.Join(a.Changed(b), " "); got != "[user.NAME] [idle]" {
		t.Errorf("Changed = %q", got)
	}
}
