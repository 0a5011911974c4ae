package policy

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
)

const fullConfig = `# npurun.conf
[devices]
vendor = "ascend"
ids = "0-15"
dev_dir = "/dev"
npu_smi = "/usr/local/bin/npu-smi"

[broker]
max_connections = 100
max_waiting_per_user = 10
default_pool = "queue"

[pools]
interactive = "0-11"
queue = "12-15"

[limits]
max_devices = 4
pools = ["interactive"]

[user.alice]
max_devices = 8
pools = ["interactive", "queue"]

[user.bob]
max_devices = 0

[user."carol"]
pools = ["queue"]

[group.students]
max_devices = 1

[group.staff]
max_devices = 6
pools = ["queue"]

[group.admins]
max_devices = 0
`

func TestParseGood(t *testing.T) {
	defaultLimit := Limit{MaxQueued: DefaultMaxQueued, Source: "the default [limits]"}
	tests := []struct {
		name string
		conf string
		want *Config
	}{
		{
			name: "smallest",
			conf: "[devices]\nvendor = \"fake\"   # ascend | nvidia | fake | auto\nids = \"0-3\"       # the devices this broker manages\n",
			want: &Config{
				Vendor: "fake", IDs: []int{0, 1, 2, 3}, DevDir: "/dev",
				MaxConnections: 16384, MaxWaitingPerUser: 1024,
				DefaultPool: "default", Pools: []Pool{{Name: "default"}},
				Default: defaultLimit, Users: map[string]Limit{}, Groups: map[string]Limit{},
			},
		},
		{
			name: "empty file is all defaults",
			conf: "",
			want: &Config{
				Vendor: "auto", DevDir: "/dev",
				MaxConnections: 16384, MaxWaitingPerUser: 1024,
				DefaultPool: "default", Pools: []Pool{{Name: "default"}},
				Default: defaultLimit, Users: map[string]Limit{}, Groups: map[string]Limit{},
			},
		},
		{
			name: "pools keep file order and the first is the default",
			conf: "[devices]\nvendor = \"nvidia\"\n[pools]\nzeta = \"2-3\"\nalpha = \"0,1\"\n",
			want: &Config{
				Vendor: "nvidia", DevDir: "/dev",
				MaxConnections: 16384, MaxWaitingPerUser: 1024,
				DefaultPool: "zeta", Pools: []Pool{{"zeta", []int{2, 3}}, {"alpha", []int{0, 1}}},
				Default: defaultLimit, Users: map[string]Limit{}, Groups: map[string]Limit{},
			},
		},
		{
			name: "full",
			conf: fullConfig,
			want: &Config{
				Vendor: "ascend", IDs: seq(0, 15), DevDir: "/dev", NPUSmi: "/usr/local/bin/npu-smi",
				MaxConnections: 100, MaxWaitingPerUser: 10, DefaultPool: "queue",
				Pools:   []Pool{{"interactive", seq(0, 11)}, {"queue", seq(12, 15)}},
				Default: Limit{MaxQueued: DefaultMaxQueued, MaxDevices: 4, Pools: []string{"interactive"}, Source: "the default [limits]"},
				Users: map[string]Limit{
					"alice": {MaxQueued: DefaultMaxQueued, MaxDevices: 8, Pools: []string{"interactive", "queue"}, Source: "user alice"},
					"bob":   {MaxQueued: DefaultMaxQueued, MaxDevices: 0, Pools: []string{"interactive"}, Source: "user bob"},
					"carol": {MaxQueued: DefaultMaxQueued, MaxDevices: 4, Pools: []string{"queue"}, Source: "user carol"},
				},
				Groups: map[string]Limit{
					"students": {MaxQueued: DefaultMaxQueued, MaxDevices: 1, Pools: []string{"interactive"}, Source: "group students"},
					"staff":    {MaxQueued: DefaultMaxQueued, MaxDevices: 6, Pools: []string{"queue"}, Source: "group staff"},
					"admins":   {MaxQueued: DefaultMaxQueued, MaxDevices: 0, Pools: []string{"interactive"}, Source: "group admins"},
				},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse("npurun.conf", []byte(tt.conf))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if tt.want.Tasks == (Tasks{}) {
				tt.want.Tasks = defaultTasks()
			}
			if tt.want.Restrict.OnBusy == "" {
				tt.want.Restrict = Restrict{LoginDevices: DefaultLoginDevices, OnBusy: DefaultOnBusy, OnBrokerDown: DefaultOnBrokerDown}
			}
			if tt.want.Status.ScanInterval == 0 {
				tt.want.Status, tt.want.Usage, tt.want.Board = defaultStatus(), defaultUsage(), defaultBoard()
			}
			if tt.want.Slurm.Mode == "" {
				tt.want.Slurm = Slurm{Mode: ModeSplit, GRES: DefaultSlurmGRES, PollInterval: DefaultSlurmPollInterval}
			}
			if tt.want.Containers.Unleased == "" {
				tt.want.Containers = Containers{Unleased: DefaultContainersUnleased, StateDir: DefaultContainersStateDir}
			}
			if tt.want.Idle.Below == 0 {
				tt.want.Idle = Idle{Below: DefaultIdleBelow, Action: IdleReport, WarnBefore: DefaultIdleWarnBefore, Kinds: DefaultIdleKinds}
			}
			if tt.want.Share.OverDeclared == "" {
				tt.want.Share = Share{Margin: DefaultShareMargin, OverDeclared: OverReport}
			}
			tt.want.Scheduling = Scheduling{Backfill: true} // none of these has [scheduling]: TestScheduling
			got.file, got.idx = "", nil                     // for Warnings; see TestWarnings
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Parse =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

func TestParseBad(t *testing.T) {
	tests := []struct {
		name string
		conf string
		want []string
	}{
		{
			name: "syntax error",
			conf: "[devices]\nvendor = \"fake\"\nids = 0-3\n",
			want: []string{"npurun.conf:3: expected a top-level item to end with a newline, comment, or EOF, but got '-' instead"},
		},
		{
			name: "duplicate key",
			conf: "[devices]\nvendor = \"fake\"\nvendor = \"auto\"\n",
			want: []string{"npurun.conf:3: key 'devices.vendor' has already been defined"},
		},
		{
			name: "unknown key",
			conf: "[devices]\nvendor = \"fake\"\nids = \"0-3\"\n\n[limits]\nmax_device = 2\n",
			want: []string{"npurun.conf:6: [limits] max_device: unknown key (known: max_devices, max_queued_tasks, max_running_tasks, pools)"},
		},
		{
			name: "unknown table",
			conf: "[devices]\nvendor = \"auto\"\n[device]\nids = \"1\"\n",
			want: []string{"npurun.conf:3: [device]: unknown table (known: devices, broker, pools, limits, tasks, status, usage, restrict, slurm, containers, share, idle, scheduling, cluster, board, user.NAME, group.NAME)"},
		},
		{
			name: "key outside a table",
			conf: "vendor = \"fake\"\n[devices]\nvendor = \"auto\"\n",
			want: []string{"npurun.conf:1: vendor: unknown key (keys belong in a table such as [devices])"},
		},
		{
			name: "bad range",
			conf: "[devices]\nvendor = \"fake\"\nids = \"0-15\"\n\n[pools]\ninteractive = \"0-11\"\nqueue = \"15-12\"\n",
			want: []string{`npurun.conf:7: [pools] queue: bad range "15-12"`},
		},
		{
			name: "bad device id",
			conf: "[devices]\nvendor = \"fake\"\nids = \"0,x\"\n",
			want: []string{`npurun.conf:3: [devices] ids: bad device id "x"`},
		},
		{
			name: "overlapping pools",
			conf: "[devices]\nvendor = \"fake\"\nids = \"0-7\"\n[pools]\na = \"0-3\"\nb = \"3-5\"\nc = \"4-7\"\n",
			want: []string{
				`npurun.conf:6: [pools] b: device 3 is in both pools "a" and "b"`,
				`npurun.conf:7: [pools] c: devices 4-5 are in both pools "b" and "c"`,
			},
		},
		{
			name: "pool id not in devices",
			conf: "[devices]\nvendor = \"fake\"\nids = \"0-3\"\n[pools]\na = \"0-1\"\nb = \"2-4\"\nc = \"6,8\"\n",
			want: []string{
				`npurun.conf:6: [pools] b: device 4 is not in [devices] ids "0-3"`,
				`npurun.conf:7: [pools] c: devices 6,8 are not in [devices] ids "0-3"`,
			},
		},
		{
			name: "bad pool name",
			conf: "[devices]\nvendor = \"fake\"\nids = \"0-3\"\n[pools]\nBig = \"0-1\"\n",
			want: []string{`npurun.conf:5: [pools] Big: bad pool name (want lowercase letters, digits, _ and -)`},
		},
		{
			name: "unknown pool in limits",
			conf: "[devices]\nvendor = \"fake\"\nids = \"0-3\"\n[pools]\na = \"0-3\"\n[limits]\npools = [\"a\", \"b\"]\n[user.alice]\npools = [\"c\"]\n",
			want: []string{
				`npurun.conf:7: [limits] pools: no pool "b" in [pools]`,
				`npurun.conf:9: [user.alice] pools: no pool "c" in [pools]`,
			},
		},
		{
			name: "unknown default pool",
			conf: "[devices]\nvendor = \"fake\"\nids = \"0-3\"\n[broker]\ndefault_pool = \"gpu\"\n",
			want: []string{`npurun.conf:5: [broker] default_pool: no pool "gpu" in [pools]`},
		},
		{
			name: "bad vendor",
			conf: "[devices]\nvendor = \"amd\"\n",
			want: []string{`npurun.conf:2: [devices] vendor: unknown vendor "amd" (want ascend, nvidia, fake or auto)`},
		},
		{
			name: "fake without ids",
			conf: "[devices]\nvendor = \"fake\"\n",
			want: []string{`npurun.conf:2: [devices] vendor: vendor "fake" needs ids`},
		},
		{
			name: "wrong types",
			conf: "[devices]\nvendor = 3\nids = [0, 1]\n[broker]\nmax_connections = \"many\"\nmax_waiting_per_user = 0\n[limits]\nmax_devices = 1.5\npools = \"a\"\n[user]\nbob = 2\n",
			want: []string{
				`npurun.conf:2: [devices] vendor: must be a string, not an integer`,
				`npurun.conf:3: [devices] ids: must be a string, not an array`,
				`npurun.conf:5: [broker] max_connections: must be an integer, not a string`,
				`npurun.conf:6: [broker] max_waiting_per_user: must be at least 1, not 0`,
				`npurun.conf:8: [limits] max_devices: must be an integer, not a float`,
				`npurun.conf:9: [limits] pools: must be an array of pool names, not a string`,
				`npurun.conf:11: [user] bob: must be a table, not an integer`,
			},
		},
		{
			name: "several errors at once",
			conf: `[devices]
vendor = "ascend"
ids = "0-15"

[pools]
interactive = "0-12"
queue = "15-12"
extra = "12-16"

[limits]
max_device = 4
pools = ["interactive", "batch"]

[group.students]
max_devices = -1
`,
			want: []string{
				`npurun.conf:7: [pools] queue: bad range "15-12"`,
				`npurun.conf:8: [pools] extra: device 16 is not in [devices] ids "0-15"`,
				`npurun.conf:8: [pools] extra: device 12 is in both pools "interactive" and "extra"`,
				`npurun.conf:11: [limits] max_device: unknown key (known: max_devices, max_queued_tasks, max_running_tasks, pools)`,
				`npurun.conf:12: [limits] pools: no pool "batch" in [pools]`,
				`npurun.conf:15: [group.students] max_devices: must be at least 0, not -1`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("npurun.conf", []byte(tt.conf))
			if err == nil {
				t.Fatalf("Parse = %+v, want errors", c)
			}
			var errs *Errors
			if !errors.As(err, &errs) {
				t.Fatalf("Parse error is %T, want *Errors", err)
			}
			if got := strings.Split(err.Error(), "\n"); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Parse errors:\n%s\nwant:\n%s", err, strings.Join(tt.want, "\n"))
			}
			if len(*errs) != len(tt.want) {
				t.Errorf("%d errors, want %d", len(*errs), len(tt.want))
			}
		})
	}
}

func TestErrorFields(t *testing.T) {
	_, err := Parse("x.conf", []byte("[devices]\nvendor = \"fake\"\nids = \"0-3\"\n[pools]\nq = \"5-2\"\n"))
	var errs *Errors
	if !errors.As(err, &errs) || len(*errs) != 1 {
		t.Fatalf("Parse error = %v, want one", err)
	}
	want := Error{File: "x.conf", Line: 5, Key: "[pools] q", Msg: `bad range "5-2"`}
	if (*errs)[0] != want {
		t.Errorf("error = %+v, want %+v", (*errs)[0], want)
	}
	var one Error
	if !errors.As(err, &one) || one != want {
		t.Errorf("errors.As(Error) = %+v, want %+v", one, want)
	}
}

func TestLoad(t *testing.T) {
	p := filepath.Join(t.TempDir(), "npurun.conf")
	if err := os.WriteFile(p, []byte("[devices]\nvendor = \"fake\"\nids = \"0-1\"\n[limits]\nmax_devices = x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(p)
	if err == nil || !strings.HasPrefix(err.Error(), p+":5: ") {
		t.Errorf("Load error = %v, want one at %s:5", err, p)
	}
	_, err = Load(filepath.Join(t.TempDir(), "missing.conf"))
	if !errors.Is(err, os.ErrNotExist) || !strings.HasPrefix(err.Error(), "read config: ") {
		t.Errorf("Load of a missing file: %v", err)
	}
}

func TestLimitFor(t *testing.T) {
	c, err := Parse("npurun.conf", []byte(fullConfig))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		user   string
		groups []string
		want   Limit
	}{
		{
			name: "user entry wins over groups", user: "alice", groups: []string{"admins"},
			want: Limit{MaxQueued: DefaultMaxQueued, MaxDevices: 8, Pools: []string{"interactive", "queue"}, Source: "user alice"},
		},
		{
			name: "user entry falls back to the default for absent fields", user: "carol",
			want: Limit{MaxQueued: DefaultMaxQueued, MaxDevices: 4, Pools: []string{"queue"}, Source: "user carol"},
		},
		{
			name: "one group", user: "dave", groups: []string{"users", "students"},
			want: Limit{MaxQueued: DefaultMaxQueued, MaxDevices: 1, Pools: []string{"interactive"}, Source: "group students"},
		},
		{
			name: "most permissive of groups", user: "erin", groups: []string{"students", "staff"},
			want: Limit{MaxQueued: DefaultMaxQueued, MaxDevices: 6, Pools: []string{"interactive", "queue"}, Source: "groups students, staff"},
		},
		{
			name: "zero is unlimited and largest", user: "frank", groups: []string{"staff", "admins", "staff"},
			want: Limit{MaxQueued: DefaultMaxQueued, MaxDevices: 0, Pools: []string{"queue", "interactive"}, Source: "groups staff, admins"},
		},
		{
			name: "no entry", user: "gina", groups: []string{"users"},
			want: Limit{MaxQueued: DefaultMaxQueued, MaxDevices: 4, Pools: []string{"interactive"}, Source: "the default [limits]"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := c.LimitFor(tt.user, tt.groups); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("LimitFor(%q, %q) = %+v, want %+v", tt.user, tt.groups, got, tt.want)
			}
		})
	}
}

func TestLimitForNilPools(t *testing.T) {
	c, err := Parse("npurun.conf", []byte("[devices]\nvendor = \"fake\"\nids = \"0-3\"\n[pools]\na = \"0-1\"\nb = \"2-3\"\n[group.x]\npools = [\"a\"]\n[group.y]\nmax_devices = 2\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := c.LimitFor("u", []string{"x", "y"})
	want := Limit{MaxQueued: DefaultMaxQueued, MaxDevices: 0, Pools: nil, Source: "groups x, y"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("LimitFor = %+v, want %+v", got, want)
	}
	if !got.AllowsPool("b") {
		t.Error("AllowsPool(b) = false for all pools")
	}
}

func TestPoolAndAllowsPool(t *testing.T) {
	c, err := Parse("npurun.conf", []byte(fullConfig))
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := c.Pool("queue"); !ok || !reflect.DeepEqual(p, Pool{"queue", seq(12, 15)}) {
		t.Errorf("Pool(queue) = %+v, %v", p, ok)
	}
	if _, ok := c.Pool("nope"); ok {
		t.Error("Pool(nope) found")
	}
	tests := []struct {
		limit Limit
		pool  string
		want  bool
	}{
		{Limit{}, "anything", true},
		{Limit{Pools: []string{"a"}}, "a", true},
		{Limit{Pools: []string{"a"}}, "b", false},
		{Limit{Pools: []string{}}, "a", false},
	}
	for _, tt := range tests {
		if got := tt.limit.AllowsPool(tt.pool); got != tt.want {
			t.Errorf("%+v.AllowsPool(%q) = %v, want %v", tt.limit, tt.pool, got, tt.want)
		}
	}
}

func seq(a, b int) []int {
	var s []int
	for i := a; i <= b; i++ {
		s = append(s, i)
	}
	return s
}

// defaultTasks is the [tasks] table of a file that has none.
func defaultTasks() Tasks {
	return Tasks{
		StateDir:     DefaultStateDir,
		CPUSlots:     max(1, runtime.NumCPU()/2),
		CPUThreads:   max(1, runtime.NumCPU()/max(1, runtime.NumCPU()/2)),
		IdlePriority: true,
		MaxTasks:     DefaultMaxTasks,
		KeepEnded:    DefaultKeepEnded,
		KeepEndedPer: DefaultKeepEndedPerUser,
		KillGrace:    DefaultKillGrace,
		Cgroup:       "auto",
	}
}

func TestParseTasks(t *testing.T) {
	conf := `[devices]
vendor = "fake"
ids = "0-3"

[tasks]
state_dir = "/srv/spool"
cpu_slots = 3
cpu_threads = 4
idle_priority = false
kill_grace = "5s"
time_limit = "6h"
max_time = "3d"
keep_ended_per_user = 20
cgroup = "/sys/fs/cgroup/npurun"
notify = "notify-send \"task $NPURUN_TASK_ID $NPURUN_TASK_STATE\""

[limits]
max_queued_tasks = 50
max_running_tasks = 2

[group.a]
max_running_tasks = 4
[group.b]
max_queued_tasks = 0
`
	c, err := Parse("npurun.conf", []byte(conf))
	if err != nil {
		t.Fatal(err)
	}
	want := Tasks{StateDir: "/srv/spool", CPUSlots: 3, CPUThreads: 4, MaxTasks: DefaultMaxTasks, KeepEnded: DefaultKeepEnded,
		KeepEndedPer: 20, KillGrace: 5 * time.Second, TimeLimit: 6 * time.Hour, MaxTime: 72 * time.Hour,
		Cgroup: "/sys/fs/cgroup/npurun", Notify: `notify-send "task $NPURUN_TASK_ID $NPURUN_TASK_STATE"`}
	if c.Tasks != want {
		t.Errorf("Tasks = %+v, want %+v", c.Tasks, want)
	}
	if l := c.LimitFor("x", nil); l.MaxQueued != 50 || l.MaxRunning != 2 {
		t.Errorf("default limit = %+v, want 50 queued, 2 running", l)
	}
	if l := c.LimitFor("x", []string{"a", "b"}); l.MaxQueued != 0 || l.MaxRunning != 4 {
		t.Errorf("groups a, b = %+v, want no queued cap (b), 4 running (a)", l)
	}
	bad := "[tasks]\nkill_grace = \"soon\"\nstate_dir = \"spool\"\ntime_limit = \"8h\"\nmax_time = \"1h\"\ncgroup = \"npurun\"\n"
	_, err = Parse("npurun.conf", []byte(bad))
	wantErr := "npurun.conf:2: [tasks] kill_grace: bad duration \"soon\": a number must come before \"soon\" (want e.g. \"10s\", \"90m\", \"6h\", \"1d\")\n" +
		"npurun.conf:3: [tasks] state_dir: must be an absolute path, not \"spool\"\n" +
		"npurun.conf:4: [tasks] time_limit: 8h is longer than max_time 1h\n" +
		"npurun.conf:6: [tasks] cgroup: must be \"auto\", \"off\" or an absolute path, not \"npurun\""
	if err == nil || err.Error() != wantErr {
		t.Errorf("bad [tasks]: got\n%v\nwant\n%s", err, wantErr)
	}
	_, err = Parse("npurun.conf", []byte("[tasks]\nkill_grace = \"2d\"\n"))
	if err == nil || err.Error() != "npurun.conf:2: [tasks] kill_grace: must be at most 1d, not 2d" {
		t.Errorf("kill_grace of two days: %v", err)
	}
}

func TestParseIDs(t *testing.T) {
	tests := []struct {
		in      string
		want    []int
		wantErr string
	}{
		{in: "0-3,8,10-11", want: []int{0, 1, 2, 3, 8, 10, 11}},
		{in: "5", want: []int{5}},
		{in: " 3 , 1-2 ,1", want: []int{1, 2, 3}},
		{in: "2-2", want: []int{2}},
		{in: "", want: nil},
		{in: "x", wantErr: `bad device id "x"`},
		{in: "1,,2", wantErr: `bad device id ""`},
		{in: "1.5", wantErr: `bad device id "1.5"`},
		{in: "+1", wantErr: `bad device id "+1"`},
		{in: "5-2", wantErr: `bad range "5-2"`},
		{in: "1-", wantErr: `bad range "1-"`},
		{in: "a-3", wantErr: `bad range "a-3"`},
		{in: "1-2-3", wantErr: `bad range "1-2-3"`},
		{in: "-1", wantErr: `negative device id "-1"`},
		{in: "0,-2-3", wantErr: `negative device id "-2-3"`},
		{in: "99999999999999999999", wantErr: `bad device id "99999999999999999999"`},
		{in: "0-4095", want: seq(0, 4095)},
		{in: "0-4096", wantErr: `too many device ids in "0-4096" (at most 4096)`},
		{in: "0-4000,5000-5100", wantErr: `too many device ids in "0-4000,5000-5100" (at most 4096)`},
		{in: "0-9999999999", wantErr: `too many device ids in "0-9999999999" (at most 4096)`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseIDs(tt.in)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("parseIDs(%q) error = %v, want %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseIDs(%q): %v", tt.in, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("parseIDs(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

// TestParseHealth: [devices] health_interval and fake_health, and what
// is wrong with them, named by line.
func TestParseHealth(t *testing.T) {
	c, err := Parse("npurun.conf", []byte("[devices]\nvendor = \"fake\"\nids = \"0-3\"\nhealth_interval = \"30s\"\nfake_health = \"/run/health\"\n"))
	if err != nil || c.HealthInterval != 30*time.Second || c.FakeHealth != "/run/health" {
		t.Fatalf("got %v, %q, %v", c.HealthInterval, c.FakeHealth, err)
	}
	c, err = Parse("npurun.conf", []byte("[devices]\nvendor = \"nvidia\"\nnvidia_smi = \"/opt/bin/nvidia-smi\"\n"))
	if err != nil || c.HealthInterval != 0 || c.NVIDIASmi != "/opt/bin/nvidia-smi" {
		t.Fatalf("no health_interval: got %v, %q, %v", c.HealthInterval, c.NVIDIASmi, err)
	}
	for conf, want := range map[string]string{
		"[devices]\nvendor = \"fake\"\nids = \"0\"\nhealth_interval = \"soon\"\n": "npurun.conf:4: [devices] health_interval:",
		"[devices]\nvendor = \"ascend\"\nfake_health = \"/run/health\"\n":         "npurun.conf:3: [devices] fake_health: is the fake vendor's health file",
		"[devices]\nvendor = \"fake\"\nids = \"0\"\nfake_health = \"health\"\n":   "npurun.conf:4: [devices] fake_health: must be an absolute path",
		"[devices]\nvendor = \"fake\"\nids = \"0\"\nhealth_interval = 5\n":        "npurun.conf:4: [devices] health_interval: must be a string",
	} {
		_, err := Parse("npurun.conf", []byte(conf))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", conf, err, want)
		}
	}
}
