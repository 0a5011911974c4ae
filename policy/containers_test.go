package policy

import (
	"strings"
	"testing"
	"time"
)

func TestContainers(t *testing.T) {
	c, err := Parse("npurun.conf", []byte("[containers]\nunleased = \"lease\"\nrestart_wait = \"10m\"\nstate_dir = \"/srv/npurun/containers\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Containers{Unleased: ContainersLease, RestartWait: 10 * time.Minute, StateDir: "/srv/npurun/containers"}
	if c.Containers != want {
		t.Errorf("Containers = %+v, want %+v", c.Containers, want)
	}
	c, err = Parse("npurun.conf", nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Containers{Unleased: ContainersRefuse, StateDir: "/var/lib/npurun/containers"}); c.Containers != want {
		t.Errorf("defaults: %+v, want %+v", c.Containers, want)
	}
}

func TestContainersBad(t *testing.T) {
	for conf, want := range map[string]string{
		"[containers]\nunleased = \"allow\"\n":    `npurun.conf:2: [containers] unleased: unknown value "allow" (want "refuse", "lease" or "report")`,
		"[containers]\nrestart_wait = \"2d\"\n":   `npurun.conf:2: [containers] restart_wait: longer than 1d`,
		"[containers]\nstate_dir = \"var/lib\"\n": `npurun.conf:2: [containers] state_dir: must be an absolute path, not "var/lib"`,
		"[containers]\nwait = 3\n":                `npurun.conf:2: [containers] wait: unknown key`,
		"[containers]\nrestart_wait = \"1.5s\"\n": `restart_wait`,
	} {
		_, err := Parse("npurun.conf", []byte(conf))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", conf, err, want)
		}
	}
}
