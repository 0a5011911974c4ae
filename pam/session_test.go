package pam

import (
	"testing"
	"time"

	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
)

func config(t *testing.T, restrict string) *policy.Config {
	t.Helper()
	c, err := policy.Parse("npurun.conf", []byte("[devices]\nvendor = \"fake\"\nids = \"0-7\"\n[pools]\ninteractive = \"0-1\"\nqueue = \"2-7\"\n"+restrict))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestDecide(t *testing.T) {
	const students = "[restrict]\ngroups = [\"students\"]\nusers = [\"guest\"]\n"
	alice := Account{Name: "alice", Groups: []string{"staff", "students"}}
	bob := Account{Name: "bob", Groups: []string{"staff"}}
	guest := Account{Name: "guest"}
	root := Account{Name: "root", Groups: []string{"root", "students"}}
	tests := []struct {
		name  string
		conf  string
		acct  Account
		login bool
		want  Decision
	}{
		{"no [restrict]", "", alice, true, Decision{Verdict: Ignore}},
		{"unrestricted", students, bob, true, Decision{Verdict: Ignore}},
		{"root never", students, root, true, Decision{Verdict: Ignore}},
		{"not a login", students, alice, false, Decision{Verdict: Hide}},
		{"login, defaults", students, alice, true, Decision{Verdict: Lease, N: 1, Busy: Hide}},
		{"by name", students, guest, true, Decision{Verdict: Lease, N: 1, Busy: Hide}},
		{"no login lease", students + "login_devices = 0\n", alice, true, Decision{Verdict: Hide}},
		{"wait", students + "login_devices = 2\nlogin_pool = \"queue\"\non_busy = \"wait 30s\"\n", alice, true,
			Decision{Verdict: Lease, N: 2, Pool: "queue", Wait: 30 * time.Second, Busy: Hide}},
		{"deny", students + "on_busy = \"deny\"\n", guest, true, Decision{Verdict: Lease, N: 1, Busy: Deny}},
		{"deny, not a login", students + "on_busy = \"deny\"\n", guest, false, Decision{Verdict: Hide}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Decide(config(t, tt.conf), tt.acct, tt.login); got != tt.want {
				t.Errorf("Decide = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestMessages(t *testing.T) {
	tests := []struct{ got, want string }{
		{GrantMessage(npu.Ascend, []int{4}, "interactive"), `npu 4 is yours until you log out (pool "interactive")`},
		{GrantMessage(npu.NVIDIA, []int{2, 3}, "default"), `gpu 2-3 are yours until you log out (pool "default")`},
		{BusyMessage(Hide, 1, "interactive", 0), `no device free in pool "interactive"; logged in without one (npurun CMD waits for a device)`},
		{BusyMessage(Hide, 2, "interactive", 30*time.Second), `fewer than 2 devices free in pool "interactive" after 30s; logged in without one (npurun CMD waits for a device)`},
		{BusyMessage(Deny, 1, "interactive", 0), `no device free in pool "interactive": login refused (on_busy = "deny")`},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("got  %s\nwant %s", tt.got, tt.want)
		}
	}
}
