package docs

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// docScenes are the scenes that run the documents' examples.
func docScenes() []docScene {
	return []docScene{
		{name: "README npurun", cmds: []string{
			"npurun python train.py", "npurun -n 2 python train.py",
			"npurun --no-wait python x.py", "npurun --no-device make build",
		}, run: sceneReadmeNpurun},
		{name: "README npurun -d", root: true, cmds: []string{"npurun -d 9 python debug.py"}, run: sceneReadmeWaits},
		{name: "README task-submit", root: true, cmds: []string{
			`task-submit -n 2 --time 6h --run "python train.py"`, "task-submit --after 118 -- python eval.py",
			"task-submit list", "task-submit logs -f 118", "task-submit wait 118", "task-submit cancel 119",
		}, run: sceneReadmeTasks},
		{name: "status", root: true, cmds: []string{
			"npubroker status", "npubroker status --json", "npubroker usage --since 7d", "npubroker usage --since 7d --user alice --json",
		}, run: sceneStatus},
		{name: "npurun(1)", cmds: []string{
			"npurun python train.py --epochs 10", "npurun -n 4 -p queue --timeout 10m torchrun --nproc_per_node 4 train.py",
			"npurun -d 2,3 ./bench.sh", "npurun -d 0-3,8 torchrun --nproc_per_node 5 train.py",
			"npurun -n 2 sh -c 'echo $NPURUN_DEVICES $ASCEND_RT_VISIBLE_DEVICES'", "npurun --no-device python prepare.py",
		}, run: sceneManNpurun},
		{name: "task-submit(1)", root: true, cmds: []string{
			`task-submit --run "python train.py --lr 3e-4"`, "task-submit -n 2 --time 6h --name big -- torchrun --nproc_per_node=2 train.py",
			`task-submit --device 9 --run "python probe.py"`, `task-submit --no-device --run "make build"`,
			`task-submit --after 118 --run "python eval.py"`, `id=$(task-submit --json --run "python train.py" | jq .id)`,
			`task-submit logs -f "$id"`, "task-submit list --all", "task-submit cancel 118",
		}, run: sceneManTasks},
		{name: "npubroker(8) fake broker", cmds: []string{
			`printf '[devices]\nvendor = "fake"\nids = "0-3"\n' > /tmp/npu.conf`,
			"npubroker serve --config /tmp/npu.conf --run-dir /tmp/npu &",
			"NPURUN_SOCKET=/tmp/npu/broker.sock npurun -n 2 env | grep VISIBLE",
		}, run: sceneManFakeBroker},
	}
}

// holdOn starts the shell command cmd on the stage, its program a stand-in
// that holds what it is given until released, and waits until it holds.
func (s *docStage) holdOn(name, cmd string, env ...string) *harness.Proc {
	s.t.Helper()
	p := harness.StartProc(s.t, name, s.command("exec "+cmd, append([]string{"NPURUN_STANDIN=hold"}, env...)...))
	p.WaitLine("held")
	return p
}

// release ends a holdOn's command and waits for it.
func release(p *harness.Proc) {
	p.Stdin.Close()
	p.MustSucceed()
}

// taskID reads the id of a "task N queued …" or "task N submitted…" line.
func taskID(t testing.TB, out string) string {
	t.Helper()
	m := regexp.MustCompile(`task (\d+) (queued|submitted)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no task id in %q", out)
	}
	return m[1]
}

// awaitTask waits until task id is in state (as task-submit show --json says).
func (s *docStage) awaitTask(id, state string) {
	s.t.Helper()
	deadline := time.Now().Add(harness.EventTimeout)
	for {
		out, err := s.command("task-submit show --json " + id).Output()
		var ti wire.TaskInfo
		if err == nil && json.Unmarshal(out, &ti) == nil && ti.State == state {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("task %s not %s within %s: %s %v", id, state, harness.EventTimeout, out, err)
		}
		time.Sleep(20 * time.Millisecond) // task-submit wait waits for an end only
	}
}

// endTask waits for task id to end, cancelling it first if cancel.
func (s *docStage) endTask(id string, cancel bool) {
	s.t.Helper()
	if cancel {
		if out, err := s.command("task-submit cancel " + id).CombinedOutput(); err != nil {
			s.t.Fatalf("task-submit cancel %s: %v\n%s", id, err, out)
		}
	}
	// task-submit wait returns at the task's end, with its status.
	c := s.command("task-submit wait " + id)
	if out, err := c.CombinedOutput(); err != nil && c.ProcessState.ExitCode() == shimUsage {
		s.t.Fatalf("task-submit wait %s: %v\n%s", id, err, out)
	}
}

// shimUsage is the status of a command line task-submit refuses.
const shimUsage = 2

func sceneReadmeNpurun(t *testing.T, exs map[string][]docExample) *docStage {
	s := newDocStage(t, exs, harness.FakeConfig(10))
	// A free device: it starts at once, and npurun says nothing.
	for _, c := range []string{"npurun python train.py", "npurun -n 2 python train.py", "npurun --no-device make build"} {
		if out := s.example(c, "", 0); out != "" {
			t.Errorf("$ %s printed %q, want nothing", c, out)
		}
	}
	// Nothing free: --no-wait fails at once, with 75.
	all := s.holdOn("all", "npurun -n 10 python train.py")
	s.example("npurun --no-wait python x.py", "", 75)
	release(all)
	return s
}

// sceneReadmeWaits: npu 9 held, alice's and bob's requests for it ahead;
// the lines shown are what a terminal shows in place, and -v line by
// line, as the line moves.
func sceneReadmeWaits(t *testing.T, exs map[string][]docExample) *docStage {
	alice, bob := harness.NewUser(t), harness.NewUser(t)
	s := newDocStage(t, exs, harness.FakeConfig(10))
	s.names = map[string]string{alice.Name: "alice", bob.Name: "bob"}
	holder := s.holdOn("holder", "npurun -d 9 python train.py")
	var ahead []*harness.Proc
	for i, u := range []harness.TestUser{alice, bob} {
		p := harness.StartProc(t, u.Name, u.As(s.command("exec npurun -v -d 9 python train.py", "NPURUN_STANDIN=hold"), s.dir))
		p.WaitLine(wire.Ordinal(i+1) + " in line")
		ahead = append(ahead, p)
	}
	cmd := "npurun -d 9 python debug.py"
	mine := harness.StartProc(t, "mine", s.command("exec "+strings.Replace(cmd, "npurun ", "npurun -v ", 1)))
	mine.WaitLine("3rd in line")
	release(holder)
	for i, p := range ahead {
		p.WaitLine("held")
		mine.WaitLine(wire.Ordinal(2-i) + " in line")
		release(p)
	}
	mine.MustSucceed()
	<-mine.OutDone
	s.compare(cmd, mine.Output())
	return s
}

// withOwnHome makes the stage's commands run as the test user u, whose
// home it makes in the stage's directory: a task's default log goes to the
// submitter's home (~/.local/state/npurun/tasks), which must not be the
// machine's. u is made before the stage's broker, so that it is removed
// after the broker (and the idle supervisor it keeps for u) is gone.
func (s *docStage) withOwnHome(u harness.TestUser) {
	s.t.Helper()
	home := filepath.Join(s.dir, "home-"+u.Name)
	if err := os.Mkdir(home, 0o700); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Chown(home, int(u.UID), int(u.GID)); err != nil {
		s.t.Fatal(err)
	}
	if out, err := exec.Command("usermod", "--home", home, u.Name).CombinedOutput(); err != nil {
		s.t.Fatalf("usermod --home: %v: %s", err, out)
	}
	s.as = &u
	s.env = append(s.env, "HOME="+home, "USER="+u.Name, "LOGNAME="+u.Name)
	s.names = map[string]string{u.Name: "USER"}
}

func sceneReadmeTasks(t *testing.T, exs map[string][]docExample) *docStage {
	u := harness.NewUser(t)
	s := newDocStage(t, exs, harness.FakeConfig(2))
	s.withOwnHome(u)
	// Both devices held and three tasks ahead: the fourth in line.
	holder := s.holdOn("holder", "npurun -n 2 python train.py")
	for range 3 {
		if out, err := s.command(`task-submit -n 2 --run "python train.py"`).CombinedOutput(); err != nil {
			t.Fatalf("task-submit: %v\n%s", err, out)
		}
	}
	first := taskID(t, s.example(`task-submit -n 2 --time 6h --run "python train.py"`, "", 0))
	// The evaluation holds its device until cancelled.
	second := taskID(t, s.example("task-submit --after 118 -- python eval.py", "task-submit --after "+first+" -- python eval.py", 0, "NPURUN_STANDIN=forever"))
	s.example("task-submit list", "", 0)
	release(holder)
	s.example("task-submit logs -f 118", "task-submit logs -f "+first, 0)
	s.example("task-submit wait 118", "task-submit wait "+first, 0)
	s.awaitTask(second, wire.StateRunning)
	s.example("task-submit cancel 119", "task-submit cancel "+second, 0)
	s.endTask(second, false)
	return s
}

func sceneManNpurun(t *testing.T, exs map[string][]docExample) *docStage {
	s := newDocStage(t, exs, "[devices]\nvendor = \"fake\"\nids = \"0-11\"\n[pools]\ndefault = \"0-3,8-11\"\nqueue = \"4-7\"\n")
	for _, c := range []string{
		"npurun python train.py --epochs 10", "npurun -n 4 -p queue --timeout 10m torchrun --nproc_per_node 4 train.py",
		"npurun -d 2,3 ./bench.sh", "npurun -d 0-3,8 torchrun --nproc_per_node 5 train.py",
		"npurun -n 2 sh -c 'echo $NPURUN_DEVICES $ASCEND_RT_VISIBLE_DEVICES'", "npurun --no-device python prepare.py",
	} {
		s.example(c, "", 0)
	}
	return s
}

func sceneManTasks(t *testing.T, exs map[string][]docExample) *docStage {
	harness.NeedTool(t, "jq", "jq")
	u := harness.NewUser(t)
	s := newDocStage(t, exs, "[devices]\nvendor = \"fake\"\nids = \"0-9\"\n[pools]\nqueue = \"0-1,9\"\ninteractive = \"2-8\"\n")
	s.withOwnHome(u)
	holder := s.holdOn("holder", "npurun -d 0-1,9 python train.py")
	for range 3 {
		if out, err := s.command(`task-submit --run "python train.py"`).CombinedOutput(); err != nil {
			t.Fatalf("task-submit: %v\n%s", err, out)
		}
	}
	first := taskID(t, s.example(`task-submit --run "python train.py --lr 3e-4"`, "", 0, "NPURUN_STANDIN=forever"))
	s.example("task-submit -n 2 --time 6h --name big -- torchrun --nproc_per_node=2 train.py", "", 0)
	s.example(`task-submit --device 9 --run "python probe.py"`, "", 0)
	s.example(`task-submit --no-device --run "make build"`, "", 0)
	s.example(`task-submit --after 118 --run "python eval.py"`, `task-submit --after `+first+` --run "python eval.py"`, 0)
	// The two lines are one shell session: $id is the first's.
	jqLine, logsLine := `id=$(task-submit --json --run "python train.py" | jq .id)`, `task-submit logs -f "$id"`
	release(holder)
	out := s.example(jqLine, jqLine+` && echo "id $id" && `+logsLine, 0)
	s.compare(logsLine, strings.Join(keepLines(strings.Split(out, "\n"), func(l string) bool { return !strings.HasPrefix(l, "id ") }), "\n"))
	s.example("task-submit list --all", "", 0)
	s.awaitTask(first, wire.StateRunning)
	s.example("task-submit cancel 118", "task-submit cancel "+first, 0)
	s.endTask(first, false)
	return s
}

// keepLines keeps the lines of xs that keep says to.
func keepLines(xs []string, keep func(string) bool) []string {
	var out []string
	for _, x := range xs {
		if keep(x) {
			out = append(out, x)
		}
	}
	return out
}

// sceneManFakeBroker: the unprivileged broker of npubroker(8)'s examples,
// with the test's directory for /tmp. As root, a test user runs it, as
// the example says (root's broker would use the machine's spool).
func sceneManFakeBroker(t *testing.T, exs map[string][]docExample) *docStage {
	s := &docStage{t: t, dir: harness.SharedDir(t), exs: exs, ran: map[string]bool{}}
	b := harness.Bins(t)
	s.env = append(os.Environ(), "PATH="+b.Dir+":"+os.Getenv("PATH"))
	if os.Geteuid() == 0 {
		u := harness.NewUser(t)
		if err := os.Chown(s.dir, int(u.UID), int(u.GID)); err != nil {
			t.Fatal(err)
		}
		s.as = &u
	}
	conf, run := filepath.Join(s.dir, "npu.conf"), filepath.Join(s.dir, "npu")
	s.repl = []string{conf, "/tmp/npu.conf", run, "/tmp/npu"}
	local := strings.NewReplacer("/tmp/npu.conf", conf, "/tmp/npu", run)
	printf := `printf '[devices]\nvendor = "fake"\nids = "0-3"\n' > /tmp/npu.conf`
	s.example(printf, local.Replace(printf), 0)
	serve := "npubroker serve --config /tmp/npu.conf --run-dir /tmp/npu &"
	// In the foreground here, as the shell's & leaves it, until it serves.
	p := harness.StartProc(t, "broker", s.command("exec "+strings.TrimSuffix(local.Replace(serve), " &")))
	p.WaitLine("serving")
	s.compare(serve, "")
	s.example("NPURUN_SOCKET=/tmp/npu/broker.sock npurun -n 2 env | grep VISIBLE", local.Replace("NPURUN_SOCKET=/tmp/npu/broker.sock npurun -n 2 env | grep VISIBLE"), 0)
	p.Cmd.Process.Signal(syscall.SIGTERM)
	p.MustSucceed()
	return s
}

// sceneStatus is the README's and npubroker(8)'s status table, with the
// users it names: alice's job on npu0, npu1 free, bob's task on npu12 with
// its seven more processes, npu13 kept for carol's two-device task,
// dave's npurun waiting on his limit, and erin's python with a device
// node open and no lease.
func sceneStatus(t *testing.T, exs map[string][]docExample) *docStage {
	users := map[string]harness.TestUser{}
	s0 := map[string]string{}
	for _, n := range []string{"alice", "bob", "carol", "dave", "erin"} {
		u := harness.NewUser(t)
		users[n] = u
		s0[u.Name] = n
	}
	// Nodes of the devices: memory devices anyone may open, npu7's its own
	// (the scan knows a node by its device number).
	dev := filepath.Join(harness.SharedDir(t), "dev")
	if err := os.Mkdir(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, id := range []int{0, 1, 2, 3, 7, 12, 13} {
		minor := uint32(8) // random
		if id == 7 {
			minor = 7 // full
		}
		p := filepath.Join(dev, fmt.Sprintf("davinci%d", id))
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, minor))); err != nil {
			t.Fatalf("mknod %s: %v", p, err)
		}
		if err := os.Chmod(p, 0o666); err != nil {
			t.Fatal(err)
		}
	}
	conf := fmt.Sprintf("[devices]\nvendor = \"ascend\"\nids = \"0-3,7,12-13\"\ndev_dir = %q\nnpu_smi = \"/nonexistent/npu-smi\"\n"+
		"[pools]\ninteractive = \"0-3,7\"\nqueue = \"12-13\"\n[limits]\nmax_devices = 2\n"+
		"[status]\nscan_interval = \"1s\"\nunleased_grace = \"1s\"\n", dev)
	s := newDocStage(t, exs, conf)
	s.names = s0
	s.repl = []string{dev + "/", "/dev/"}
	logs := harness.SharedDir(t)
	as := func(name, cmd string, env ...string) *exec.Cmd {
		c := users[name].As(s.command(cmd, env...), s.dir)
		return c
	}
	hold := func(name, cmd string, env ...string) *harness.Proc {
		t.Helper()
		p := harness.StartProc(t, name, as(name, "exec "+cmd, append([]string{"NPURUN_STANDIN=hold"}, env...)...))
		p.WaitLine("held")
		return p
	}
	submit := func(name, args string, env ...string) string {
		t.Helper()
		out, err := as(name, "task-submit --log "+filepath.Join(logs, name+".log")+" "+args, env...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: task-submit %s: %v\n%s", name, args, err, out)
		}
		return taskID(t, string(out))
	}
	if err := os.Chmod(logs, 0o1777); err != nil {
		t.Fatal(err)
	}
	alice := hold("alice", "npurun -d 0 python train.py")
	dave := hold("dave", "npurun -d 2-3 python train.py")
	bob := submit("bob", "-d 12 -- torchrun train.py", "NPURUN_STANDIN=forever", "NPURUN_STANDIN_CHILDREN=7")
	t.Cleanup(func() { s.command("task-submit cancel " + bob).Run() }) // before the broker stops, should the test fail
	s.awaitTask(bob, wire.StateRunning)
	carol := submit("carol", "-n 2 -p queue -- python train.py")
	t.Cleanup(func() { s.command("task-submit cancel " + carol).Run() })
	daveWaits := harness.StartProc(t, "dave waits", as("dave", "exec npurun -v -p queue python x.py"))
	daveWaits.WaitLine("holds 2 of 2 devices allowed")
	node, err := os.Open(filepath.Join(dev, "davinci7"))
	if err != nil {
		t.Fatal(err)
	}
	erin := users["erin"].As(exec.Command(s.b.Bin.Workload, "hack.py"), s.dir)
	erin.Args[0] = "python"
	erin.Stdin, erin.Env = node, append(os.Environ(), "NPURUN_STANDIN=forever")
	if err := erin.Start(); err != nil {
		t.Fatal(err)
	}
	node.Close()
	t.Cleanup(func() { erin.Process.Kill(); erin.Wait() })

	// The table once it shows all of it: the unleased use past its grace,
	// bob's seven more processes.
	deadline := time.Now().Add(harness.ScanTimeout)
	var table string
	for {
		out, err := s.command("npubroker status").Output()
		table = string(out)
		if err == nil && strings.Contains(table, "UNLEASED USE") && strings.Contains(table, "(+7)") && strings.Contains(table, "task "+carol) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the status table did not show it all within %s:\n%s", harness.ScanTimeout, table)
		}
		time.Sleep(100 * time.Millisecond) // the background scan, at its interval
	}
	s.compare("npubroker status", table)
	js := s.example("npubroker status --json", "", 0)
	var bd wire.Board
	if err := json.Unmarshal([]byte(js), &bd); err != nil {
		t.Errorf("status --json: %v", err)
	}
	s.example("npubroker usage --since 7d", "", 0)
	us := s.example("npubroker usage --since 7d --user alice --json", "npubroker usage --since 7d --user "+users["alice"].Name+" --json", 0)
	var rep wire.UsageReport
	if err := json.Unmarshal([]byte(us), &rep); err != nil {
		t.Errorf("usage --json: %v", err)
	}
	// Everything ends before the users go: bob's task cancelled, then
	// carol's runs, then dave's npurun.
	release(alice)
	release(dave)
	s.endTask(bob, true)
	s.endTask(carol, false)
	daveWaits.MustSucceed()
	return s
}

// TestManStatusJSON: every field of npubroker status --json and usage
// --json is named in npubroker(8), in the paragraph on --json.
func TestManStatusJSON(t *testing.T) {
	text := manPlain(manRead(t, "npubroker.8"))
	for _, tc := range []struct {
		v          any
		start, end string
	}{
		{wire.Board{}, "Print the broker's answer as one JSON object", "times are Unix milliseconds"},
		{wire.UsageReport{}, "Print one JSON object:", "oldest"},
	} {
		i := strings.Index(text, tc.start)
		j := strings.Index(text[max(i, 0):], tc.end)
		if i < 0 || j < 0 {
			t.Fatalf("npubroker.8: no paragraph from %q to %q", tc.start, tc.end)
		}
		para := text[i : i+j+len(tc.end)]
		for _, f := range jsonFields(reflect.TypeOf(tc.v)) {
			if !regexp.MustCompile(`\b` + f + `\b`).MatchString(para) {
				t.Errorf("npubroker.8 does not name the field %q of %T in its --json paragraph", f, tc.v)
			}
		}
	}
}

// jsonFields are the JSON names of typ's fields, and of the structs in
// them, recursively.
func jsonFields(typ reflect.Type) []string {
	seen := map[reflect.Type]bool{}
	var names []string
	var walk func(reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || seen[t] {
			return
		}
		seen[t] = true
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				continue
			}
			names = append(names, name)
			walk(f.Type)
		}
	}
	walk(typ)
	return names
}
