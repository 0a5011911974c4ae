package ociruntime

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	args := strings.Fields("--npurun-config /c/npurun.conf --root /r --log /l/log.json --log-format json --npurun-socket=/s.sock --systemd-cgroup create --bundle /b --pid-file /p ID")
	inv, err := parse(args)
	if err != nil {
		t.Fatal(err)
	}
	if inv.o.Config != "/c/npurun.conf" || inv.o.Socket != "/s.sock" || inv.log != "/l/log.json" || !inv.logJSON {
		t.Errorf("own options: %+v", inv)
	}
	if want := strings.Fields("--root /r --log /l/log.json --log-format json --systemd-cgroup"); !reflect.DeepEqual(inv.globals, want) {
		t.Errorf("runc's globals = %q, want %q", inv.globals, want)
	}
	if inv.cmd != "create" || !reflect.DeepEqual(inv.args, strings.Fields("--bundle /b --pid-file /p ID")) {
		t.Errorf("command %q %q", inv.cmd, inv.args)
	}
	if got, want := passArgs(args), strings.Fields("--root /r --log /l/log.json --log-format json --systemd-cgroup create --bundle /b --pid-file /p ID"); !reflect.DeepEqual(got, want) {
		t.Errorf("passArgs = %q, want %q: runc never sees npurun-runtime's options", got, want)
	}
	inv, err = parse(strings.Fields("--version"))
	if err != nil || inv.cmd != "" || inv.o.Config != DefaultConfig {
		t.Errorf("--version: %+v, %v", inv, err)
	}
	if _, err := parse([]string{"--npurun-config"}); err == nil {
		t.Error("an option without its value is accepted")
	}
}

func TestParseCreate(t *testing.T) {
	c, err := parseCreate(strings.Fields("--bundle /b --pid-file /p --console-socket=/c.sock --preserve-fds 2 --no-pivot abc123"))
	if err != nil {
		t.Fatal(err)
	}
	if c.bundle != "/b" || c.id != "abc123" || c.preserveFDs != 2 {
		t.Errorf("%+v", c)
	}
	if want := strings.Fields("--bundle /b --pid-file /p --console-socket=/c.sock --no-pivot abc123"); !reflect.DeepEqual(c.rest, want) {
		t.Errorf("rest = %q, want %q: --preserve-fds goes, the runtime sets its own", c.rest, want)
	}
	c, err = parseCreate(strings.Fields("-b /b2 id2"))
	if err != nil || c.bundle != "/b2" || c.id != "id2" {
		t.Errorf("-b: %+v, %v", c, err)
	}
	for _, bad := range []string{"--bundle /b", "--bundle /b ../etc", "--preserve-fds x id"} {
		if _, err := parseCreate(strings.Fields(bad)); err == nil {
			t.Errorf("parseCreate(%q) accepted", bad)
		}
	}
}

func i64(n int64) *int64 { return &n }

// TestWanted: the devices a container may open follow its device cgroup's
// rules, in order, as runc applies them; a node in linux.devices without
// access counts for nothing.
func TestWanted(t *testing.T) {
	nodes := []node{{id: 0, major: 507, minor: 0}, {id: 1, major: 507, minor: 1}, {id: 2, major: 507, minor: 2}}
	denyAll := rule{Allow: false, Access: "rwm"}
	for _, tc := range []struct {
		name  string
		rules []rule
		want  []int
	}{
		{"no rules: every device", nil, []int{0, 1, 2}},
		{"docker's default: none", []rule{denyAll, {Allow: true, Type: "c", Major: i64(1), Minor: i64(3), Access: "rwm"}, {Allow: true, Type: "c", Major: nil, Minor: nil, Access: "m"}}, nil},
		{"--device davinci1", []rule{denyAll, {Allow: true, Type: "c", Major: i64(507), Minor: i64(1), Access: "rwm"}}, []int{1}},
		{"a major, every minor", []rule{denyAll, {Allow: true, Type: "c", Major: i64(507), Minor: i64(-1), Access: "rw"}}, []int{0, 1, 2}},
		{"--privileged", []rule{{Allow: true, Access: "rwm"}}, []int{0, 1, 2}},
		{"allowed, then denied", []rule{denyAll, {Allow: true, Type: "c", Major: i64(507), Minor: i64(2), Access: "rwm"}, {Allow: false, Type: "c", Major: i64(507), Minor: i64(2), Access: "rw"}}, nil},
		{"mknod only", []rule{denyAll, {Allow: true, Type: "c", Major: i64(507), Minor: i64(0), Access: "m"}}, nil},
		{"read only", []rule{denyAll, {Allow: true, Type: "c", Major: i64(507), Minor: i64(0), Access: "r"}}, []int{0}},
		{"block devices are others", []rule{denyAll, {Allow: true, Type: "b", Major: i64(507), Minor: i64(0), Access: "rwm"}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &spec{}
			data, _ := json.Marshal(map[string]any{"linux": map[string]any{"resources": map[string]any{"devices": tc.rules}}})
			if tc.rules == nil {
				data = []byte(`{"linux":{}}`)
			}
			if err := json.Unmarshal(data, s); err != nil {
				t.Fatal(err)
			}
			if got := s.wanted(nodes); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("wanted = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSpec(t *testing.T) {
	dir := t.TempDir()
	home := filepath.Join(dir, "containers", "abc")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(home, "config.v2.json"), []byte(`{"ID":"abc","Name":"/train"}`), 0o644)
	config := `{"process":{"env":["A=1","NPURUN_HANDOVER=@x","NPURUN_HANDOVER=@y"]},
		"mounts":[{"destination":"/etc/hostname","source":"` + home + `/hostname"}],
		"linux":{"cgroupsPath":"/docker/abc"}}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := readSpec(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s.env("NPURUN_HANDOVER") != "@y" || s.env("B") != "" {
		t.Errorf("env: %q %q", s.env("NPURUN_HANDOVER"), s.env("B"))
	}
	if s.home() != home || s.engine() != "docker" || s.name() != "train" {
		t.Errorf("home %q engine %q name %q", s.home(), s.engine(), s.name())
	}
}

// TestRecords: a record is found by its container's id; writing one
// removes those whose container's files are gone.
func TestRecords(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "containers")
	gone := filepath.Join(t.TempDir(), "gone")
	here := t.TempDir()
	for _, r := range []*record{
		{ID: "old", UID: 1000, User: "alice", Devices: []int{3}, Home: gone, Created: time.Now().UnixMilli()},
		{ID: "live", UID: 1001, User: "bob", Devices: []int{1, 2}, Home: here},
	} {
		if err := writeRecord(dir, r); err != nil {
			t.Fatal(err)
		}
	}
	r, err := readRecord(dir, "live")
	if err != nil || r == nil || r.User != "bob" || !reflect.DeepEqual(r.Devices, []int{1, 2}) {
		t.Fatalf("live: %+v, %v", r, err)
	}
	if r, err := readRecord(dir, "old"); err != nil || r != nil {
		t.Errorf("the record of a container whose files are gone: %+v, %v; want it pruned", r, err)
	}
	if r, err := readRecord(dir, "none"); err != nil || r != nil {
		t.Errorf("no record: %+v, %v", r, err)
	}
	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("the records' directory: %v, %v; want root's alone", st.Mode(), err)
	}
	os.WriteFile(filepath.Join(dir, "forged"), []byte(`{"id":"other","user":"root"}`), 0o600)
	if _, err := readRecord(dir, "forged"); err == nil {
		t.Error("a record under another id's name is read")
	}
}

func TestValidID(t *testing.T) {
	for id, ok := range map[string]bool{"abc123": true, "a-b_c.d": true, "": false, ".hidden": false, "../x": false, "a/b": false, strings.Repeat("a", 300): false} {
		if validID(id) != ok {
			t.Errorf("validID(%q) = %v", id, !ok)
		}
	}
}
