package wire

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestSessionPolicy(t *testing.T) {
	p := &SessionPolicy{OnBrokerDown: "deny",
		Users:  []Account{{"guest", 1005}, {"ldapuser", -1}},
		Groups: []Account{{"students", 1001}, {"course", -1}}}
	got, err := ParseSessionPolicy(p.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, p) {
		t.Errorf("round trip = %+v, want %+v", got, p)
	}
	tests := []struct {
		uid  uint32
		name string
		gids []uint32
		want bool
	}{
		{1005, "guest", nil, true},
		{1005, "someone", nil, true},  // by uid
		{2003, "guest", nil, true},    // by name: the configuration's
		{2004, "", nil, false},        // no name: by uid alone
		{2000, "ldapuser", nil, true}, // unknown at start: by name
		{2001, "alice", []uint32{100, 1001}, true},
		{2002, "bob", []uint32{100}, false},
		{0, "root", []uint32{1001}, false},
	}
	for _, tt := range tests {
		if r := got.Restricts(Identity{tt.uid, tt.name, tt.gids}); r != tt.want {
			t.Errorf("Restricts(%d, %q, %v) = %v, want %v", tt.uid, tt.name, tt.gids, r, tt.want)
		}
	}
	for _, bad := range []string{"", "user x 1\n", "on_broker_down maybe\n", "on_broker_down hide\nuser x y\n", "on_broker_down hide\nfoo\n", "on_broker_down hide\nuser x +1\n", "on_broker_down hide\nuser x 4294967296\n", "on_broker_down hide\nuser x 1 y\n", "on_broker_down hide\nuser\x00 x 1\n"} {
		if _, err := ParseSessionPolicy([]byte(bad)); err == nil {
			t.Errorf("ParseSessionPolicy(%q) accepted", bad)
		}
	}
}

func TestReadSessionPolicyTrust(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("this test needs root, and CI=true: run CI as root")
		}
		t.Skip("needs root: the file must be root's")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "broker.sock")
	path := filepath.Join(dir, SessionPolicyFile)
	if err := os.WriteFile(path, []byte("on_broker_down deny\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if p, err := ReadSessionPolicy(sock); err != nil || p.OnBrokerDown != "deny" {
		t.Fatalf("ReadSessionPolicy = %+v, %v", p, err)
	}
	os.Chmod(path, 0o666)
	if _, err := ReadSessionPolicy(sock); err == nil || !strings.Contains(err.Error(), "not root's alone") {
		t.Errorf("a file others may write: %v", err)
	}
	os.Remove(path)
	os.Symlink("/etc/hostname", path)
	if _, err := ReadSessionPolicy(sock); err == nil {
		t.Error("a symbolic link was followed")
	}
}
