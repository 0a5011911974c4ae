package slurm

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/cmd/npubroker/cli"
	"github.com/npurun/npurun/tests/harness"
	"github.com/npurun/npurun/wire"
)

// loginRun runs a login-side program and returns its standard output,
// standard error and exit status.
func loginRun(cmd *exec.Cmd) (string, string, int) {
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), errb.String(), 0
	case errors.As(err, &ee):
		return out.String(), errb.String(), ee.ExitCode()
	}
	return out.String(), errb.String() + err.Error(), -1
}

var submittedRE = regexp.MustCompile(`^task (\d+) submitted \(Slurm job (\d+), partition npu\)\n$`)

// submit submits from the login side as u and returns the task's id.
func submit(t *testing.T, c *harness.SlurmCluster, u *harness.TestUser, args ...string) string {
	t.Helper()
	out, errs, code := loginRun(c.Login(u, harness.Bins(t).TaskSubmit, args...))
	m := submittedRE.FindStringSubmatch(out)
	if code != 0 || m == nil || m[1] != m[2] {
		t.Fatalf("task-submit %q: status %d, printed %q, said %q", args, code, out, errs)
	}
	return m[1]
}

// awaitRunning polls (Slurm tells no one) until task id runs.
func awaitRunning(t *testing.T, c *harness.SlurmCluster, u *harness.TestUser, id string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, _, _ := loginRun(c.Login(u, harness.Bins(t).TaskSubmit, "show", id))
		if strings.Contains(out, "state: running") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s not running within 60s:\n%s", id, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestLoginCluster: on a login node ([cluster] scheduler = "slurm") of a
// private cluster of two nodes, each with its npubroker on its own fake
// devices in split mode: 40 tasks of 1 to 4 devices submitted with
// task-submit all run once, on both nodes, no device of a node given to
// two at once (the workload's O_EXCL markers, one directory per node);
// list, show, logs, wait, cancel, hold and release, --after; npurun
// streams the command's output and passes its status (0, 3, killed by a
// signal) and shows its place in Slurm's line while it waits; status
// --cluster shows the nodes' devices and holders and a node down, n1's
// from its npuboard (its broker's holders, pids and commands) and n2's,
// whose board does not answer, from Slurm, saying so; with
// slurmctld stopped task-submit and npurun exit 75 and nothing is
// submitted.
func TestLoginCluster(t *testing.T) {
	board1, board2 := harness.FreePort(t), harness.FreePort(t) // n2's: nothing listens there
	c := harness.StartSlurmCluster(t, harness.SlurmClusterOptions{Login: fmt.Sprintf("[cluster.boards]\nn1 = \"http://%s\"\nn2 = \"http://%s\"\n", board1, board2)})
	bins := harness.Bins(t)
	u := harness.NewUser(t)
	boardConf := filepath.Join(t.TempDir(), "npurun.conf")
	if err := os.WriteFile(boardConf, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	harness.StartBoard(t, c.Nodes[0].B, boardConf, board1, "n1", u.Name)
	marks := harness.SharedDir(t)
	for _, n := range c.Nodes {
		if err := os.Mkdir(filepath.Join(marks, n.Name), 0o1777); err != nil {
			t.Fatal(err)
		}
		os.Chmod(filepath.Join(marks, n.Name), 0o1777)
	}
	os.Chmod(marks, 0o1777)
	runLog := filepath.Join(marks, "ran")
	ts := func(args ...string) (string, string, int) {
		return loginRun(c.Login(&u, bins.TaskSubmit, args...))
	}

	t.Run("tasks", func(t *testing.T) {
		const tasks = 40
		var ids []string
		for i := range tasks {
			job := fmt.Sprintf("NPURUN_DEVICES=$SLURM_JOB_GPUS exec %s -markers %s/$SLURMD_NODENAME -tag $SLURMD_NODENAME.t%d -hold 300ms -log %s", bins.Workload, marks, i, runLog)
			ids = append(ids, submit(t, c, &u, "-n", strconv.Itoa(1+i%4), "--run", job))
		}
		out, errs, code := ts("list")
		if code != 0 || !regexp.MustCompile(`(?m)^ID +USER +STATE +NODE +DEVICES +SINCE +NAME/COMMAND$`).MatchString(out) || !strings.Contains(out, u.Name) {
			t.Errorf("list: status %d, %q, said %q", code, out, errs)
		}
		for _, id := range ids {
			if _, errs, code := ts("wait", id); code != 0 {
				t.Errorf("wait %s: status %d, said %q\n%s", id, code, errs, c.NodeLogs())
			}
		}
		data, _ := os.ReadFile(runLog)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		seen := map[string]int{}
		nodes := map[string]bool{}
		for _, l := range lines {
			f := strings.Fields(l)
			if len(f) < 5 {
				t.Errorf("run log line %q", l)
				continue
			}
			node, task, _ := strings.Cut(f[0], ".")
			seen[task]++
			nodes[node] = true
			if f[3] != strconv.Itoa(int(u.UID)) {
				t.Errorf("task %s ran as uid %s, not %d", task, f[3], u.UID)
			}
		}
		for i := range tasks {
			if n := seen[fmt.Sprintf("t%d", i)]; n != 1 {
				t.Errorf("task t%d ran %d times:\n%s", i, n, data)
			}
		}
		if !nodes["n1"] || !nodes["n2"] {
			t.Errorf("the tasks ran on %v, not on both nodes:\n%s", nodes, data)
		}
		out, _, _ = ts("list", "--ended")
		if strings.Count(out, " done ") < tasks {
			t.Errorf("list --ended shows fewer than %d done:\n%s", tasks, out)
		}
	})

	t.Run("npurun", func(t *testing.T) {
		for _, tc := range []struct {
			script string
			code   int
		}{{"echo out-$SLURMD_NODENAME; echo err >&2", 0}, {"echo three; exit 3", 3}, {"kill -KILL $$", 137}} {
			out, errs, code := loginRun(c.Login(&u, bins.Npurun, "-n", "2", "sh", "-c", tc.script))
			if code != tc.code {
				t.Errorf("npurun sh -c %q: status %d, want %d; said %q", tc.script, code, tc.code, errs)
			}
			if tc.code == 0 && (!regexp.MustCompile(`^out-n[12]\n$`).MatchString(out) || !strings.Contains(errs, "err\n")) {
				t.Errorf("npurun's output %q, error output %q", out, errs)
			}
			if tc.code == 3 && out != "three\n" {
				t.Errorf("npurun's output %q", out)
			}
		}
		// Signals: SIGUSR1 reaches the command through srun; SIGINT
		// (Ctrl-C) ends the job, and npurun exits 130.
		for _, tc := range []struct {
			sig  unix.Signal
			code int
			out  string
		}{{unix.SIGUSR1, 0, "started\ngot USR1\n"}, {unix.SIGINT, 130, "started\n"}} {
			cmd := c.Login(&u, bins.Npurun, "-n", "1", "sh", "-c", `trap "echo got USR1; exit 0" USR1; echo started; sleep 60 & wait`)
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var errb bytes.Buffer
			cmd.Stderr = &errb
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			r := bufio.NewReader(stdout)
			first, _ := r.ReadString('\n')
			cmd.Process.Signal(tc.sig)
			rest, _ := io.ReadAll(r)
			err = cmd.Wait()
			code := 0
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				code = ee.ExitCode()
			}
			if code != tc.code || first+string(rest) != tc.out {
				t.Errorf("npurun sent %v: status %d, printed %q; want %d, %q; said %q", tc.sig, code, first+string(rest), tc.code, tc.out, errb.String())
			}
		}
		if out, _, _ := loginRun(c.Command("squeue", "-h", "-t", "PD,R", "-o", "%i")); strings.TrimSpace(out) != "" {
			t.Errorf("jobs left after npurun's interrupted: %s", out)
		}

		// Both nodes full: npurun -v waits, saying its place, then runs.
		a := submit(t, c, &u, "-n", "4", "--", "sleep", "3")
		b := submit(t, c, &u, "-n", "4", "--", "sleep", "3")
		out, errs, code := loginRun(c.Login(&u, bins.Npurun, "-v", "-n", "4", "echo", "hello"))
		if code != 0 || out != "hello\n" || !regexp.MustCompile(`npurun: waiting in Slurm's line: job \d+, 1st in line in partition npu`).MatchString(errs) {
			t.Errorf("npurun -v behind two jobs: status %d, printed %q, said %q", code, out, errs)
		}
		ts("wait", a)
		ts("wait", b)
	})

	t.Run("controls", func(t *testing.T) {
		// The notify command runs in the job, once its command has ended.
		notify := "env | grep ^NPURUN_TASK_ | sort > " + marks + "/told-$NPURUN_TASK_ID"
		told := func(id string) string {
			t.Helper()
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				if data, err := os.ReadFile(filepath.Join(marks, "told-"+id)); err == nil && len(data) > 0 {
					return string(data)
				}
				if time.Now().After(deadline) {
					t.Errorf("task %s's notify command did not run within 30s:\n%s", id, c.NodeLogs())
					return ""
				}
			}
		}
		long := submit(t, c, &u, "-n", "4", "--name", "long", "--notify", notify, "--", "sleep", "60")
		long2 := submit(t, c, &u, "-n", "4", "--", "sleep", "60")
		awaitRunning(t, c, &u, long)
		awaitRunning(t, c, &u, long2)
		waiter := submit(t, c, &u, "-n", "1", "--", "echo", "released")
		if out, errs, code := ts("hold", waiter); code != 0 || !strings.Contains(out, "task "+waiter+" held") {
			t.Errorf("hold: %d %q %q", code, out, errs)
		}
		out, _, _ := ts("list")
		if !regexp.MustCompile(`(?m)^`+waiter+` +`+u.Name+` +held `).MatchString(out) || !regexp.MustCompile(`(?m)^`+long+` +`+u.Name+` +running +n[12] +0-3 .* long$`).MatchString(out) {
			t.Errorf("list shows no held %s and running %s:\n%s", waiter, long, out)
		}
		out, _, _ = ts("show", long)
		if !strings.Contains(out, "state: running") || !regexp.MustCompile(`(?m)^node: n[12]$`).MatchString(out) {
			t.Errorf("show %s:\n%s", long, out)
		}
		ok := submit(t, c, &u, "--after", waiter, "--", "echo", "after-ok")
		bad := submit(t, c, &u, "--no-device", "--notify", notify, "--", "sh", "-c", "exit 3")
		never := submit(t, c, &u, "--after", bad, "--", "echo", "never")
		for _, id := range []string{long, long2} {
			if out, errs, code := ts("cancel", id); code != 0 || !strings.Contains(out, "task "+id) {
				t.Errorf("cancel %s: %d %q %q", id, code, out, errs)
			}
			if _, errs, code := ts("wait", id); code == 0 || !strings.Contains(errs, "cancelled") {
				t.Errorf("wait for cancelled %s: status %d, said %q", id, code, errs)
			}
		}
		if out, errs, code := ts("release", waiter); code != 0 || !strings.Contains(out, "released") {
			t.Errorf("release: %d %q %q", code, out, errs)
		}
		for id, want := range map[string]int{waiter: 0, ok: 0, bad: 3, never: 1} {
			if _, errs, code := ts("wait", id); code != want {
				t.Errorf("wait %s: status %d, want %d; said %q", id, code, want, errs)
			}
		}
		for id, want := range map[string]string{long: "STATE=cancelled\n", bad: "EXIT=3\nNPURUN_TASK_ID=" + bad + "\n"} {
			if got := told(id); !strings.Contains(got, want) {
				t.Errorf("task %s's notify command was told %q, nothing of %q", id, got, want)
			}
		}
		if got := told(bad); !strings.Contains(got, "STATE=failed\n") {
			t.Errorf("task %s's notify command was told %q", bad, got)
		}
		// A token names one submission: three at once with one token make
		// one job, and two of them say so.
		type answer struct {
			out, errs string
			code      int
		}
		home := filepath.Join(marks, "home")
		if err := os.Mkdir(home, 0o700); err != nil {
			t.Fatal(err)
		}
		os.Chown(home, int(u.UID), int(u.GID))
		answers := make(chan answer, 3)
		for range 3 {
			go func() {
				cmd := c.Login(&u, bins.TaskSubmit, "--token", "tok-1", "--no-device", "--", "echo", "tokened")
				cmd.Env = append(cmd.Env, "HOME="+home)
				out, errs, code := loginRun(cmd)
				answers <- answer{out, errs, code}
			}()
		}
		ids, already := map[string]bool{}, 0
		for range 3 {
			a := <-answers
			m := submittedRE.FindStringSubmatch(a.out)
			if a.code != 0 || m == nil {
				t.Errorf("task-submit --token tok-1: status %d, printed %q, said %q", a.code, a.out, a.errs)
				continue
			}
			ids[m[1]] = true
			if strings.Contains(a.errs, "token tok-1 names task "+m[1]+", submitted already: no other task was made") {
				already++
			}
		}
		if len(ids) != 1 || already != 2 {
			t.Errorf("three submissions with one token made tasks %v, %d of them said submitted already", ids, already)
		}
		for id := range ids {
			if out, _, _ := ts("show", id); !strings.Contains(out, "token: tok-1\n") || !strings.Contains(out, "command: echo tokened\n") {
				t.Errorf("show %s:\n%s", id, out)
			}
			if out, errs, code := ts("wait", id); code != 0 {
				t.Errorf("wait %s: %d %q %q", id, code, out, errs)
			}
		}
		if out, errs, code := ts("logs", ok); code != 0 || out != "after-ok\n" {
			t.Errorf("logs %s: %d %q %q", ok, code, out, errs)
		}
		if out, _, _ := ts("show", never); !strings.Contains(out, "started: never") {
			t.Errorf("show %s (after a failed task):\n%s", never, out)
		}
	})

	t.Run("status", func(t *testing.T) {
		// Two jobs of 3 devices, one on each node (4 devices each).
		held := submit(t, c, &u, "-n", "3", "--", "sleep", "60")
		other := submit(t, c, &u, "-n", "3", "--", "sleep", "60")
		awaitRunning(t, c, &u, held)
		awaitRunning(t, c, &u, other)
		defer func() { ts("cancel", other) }()
		jobs := held + "|" + other
		// n1's board shows its job's lease as n1's broker has it: the
		// job, its user, and its holder, the job's extern step holding
		// the lease through spank_npurun.so, once the broker's scan has
		// found it (the first reads may come before).
		fromBoard := regexp.MustCompile(`(?m)^n1: \S+, from its board \(http://` + regexp.QuoteMeta(board1) + `\)\nDEVICE +POOL +STATE +USER +PID +COMMAND`)
		holder := regexp.MustCompile(`(?m)^\w+ +\S+ +job (` + jobs + `) +` + u.Name + ` +([0-9]+) +slurmstepd`)
		var out, errs string
		var code int
		for deadline := time.Now().Add(30 * time.Second); ; {
			out, errs, code = loginRun(c.Login(&u, bins.Npurun, "status", "--cluster"))
			if m := holder.FindStringSubmatch(out); m != nil {
				pid, _ := strconv.Atoi(m[2])
				if cmd := harness.ProcCmdline(pid); !strings.Contains(cmd, "slurmstepd") || !strings.Contains(cmd, "["+m[1]+".extern]") {
					t.Errorf("the holder shown of job %s is pid %d, %q, not the job's extern step", m[1], pid, cmd)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("status --cluster shows no holder process of n1's job within 30s:\n%s", out)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if code != 0 || !fromBoard.MatchString(out) ||
			!regexp.MustCompile(`(?m)^n2 +[0-3] +held +(`+jobs+`) +`+u.Name+` `).MatchString(out) || regexp.MustCompile(`(?m)^n1 +[0-3] `).MatchString(out) ||
			!regexp.MustCompile(`(?m)^n2: board down, from Slurm \(http://`+regexp.QuoteMeta(board2)+`: unreachable: `).MatchString(out) ||
			!regexp.MustCompile(`(?m)^`+u.Name+` +6 +2 +0$`).MatchString(out) {
			t.Errorf("status --cluster: %d, said %q:\n%s", code, errs, out)
		}
		js, errs, code := loginRun(c.Login(&u, bins.Npurun, "status", "--cluster", "--json"))
		var cb cli.ClusterBoard
		if err := json.Unmarshal([]byte(js), &cb); code != 0 || err != nil || len(cb.Nodes) != 2 {
			t.Fatalf("status --cluster --json: %d, %v, said %q:\n%s", code, err, errs, js)
		}
		n1, n2 := cb.Nodes[0], cb.Nodes[1]
		if n1.From != "board" || n1.Status == nil || !slices.ContainsFunc(n1.Status.Devices, func(d wire.DeviceState) bool {
			return d.Lease != nil && d.Lease.User == u.Name && strings.Contains("|"+jobs+"|", fmt.Sprintf("|%d|", d.Lease.SlurmJob)) && len(d.Lease.Holders) > 0
		}) || n2.From != "slurm" || n2.Status != nil || n2.BoardDown == "" || n2.Board != "http://"+board2 {
			t.Errorf("status --cluster --json: n1 %+v, n2 %+v", n1, n2)
		}
		// n2, shown from Slurm's view, is the node stopped below; its job
		// is the one of the two that Slurm's job list puts there.
		node := "n2"
		out, _, _ = loginRun(c.Command("squeue", "-h", "-j", held, "-o", "%N"))
		if strings.TrimSpace(out) != node {
			held, other = other, held
		}
		// A node whose slurmd is gone mid-job is shown down once Slurm
		// finds it not responding (SlurmdTimeout=6), and its batch job is
		// handled as Slurm does: requeued (JobRequeue=1, Slurm's default),
		// to wait or run again, on the other node.
		c.StopDaemon("slurmd " + node)
		deadline := time.Now().Add(60 * time.Second)
		for {
			out, _, _ = loginRun(c.Login(&u, bins.Npurun, "status", "--cluster"))
			if regexp.MustCompile(`(?m)^` + node + ` +0 +down`).MatchString(out) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not shown down:\n%s", node, out)
			}
			time.Sleep(time.Second)
		}
		for {
			show, _, _ := ts("show", held)
			if strings.Contains(show, "state: pending") || strings.Contains(show, "state: running") && !strings.Contains(show, "node: "+node+"\n") {
				t.Logf("task %s on a node gone down, as Slurm left it:\n%s", held, show)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("task %s on %s, gone down, not requeued:\n%s", held, node, show)
			}
			time.Sleep(time.Second)
		}
		ts("cancel", held)
	})

	t.Run("controller down", func(t *testing.T) {
		submit(t, c, &u, "--", "true") // a job slurmctld saves, to count
		before, _, _ := loginRun(c.Command("squeue", "-h", "-t", "all", "-o", "%i"))
		c.StopDaemon("slurmctld")
		_, errs, code := ts("--run", "echo lost-submission")
		if code != 75 || !strings.Contains(errs, "task-submit: sbatch: ") || !strings.Contains(errs, "the task was not submitted") {
			t.Errorf("task-submit with slurmctld stopped: status %d, said %q", code, errs)
		}
		if _, errs, code := loginRun(c.Login(&u, bins.Npurun, "true")); code != 75 {
			t.Errorf("npurun with slurmctld stopped: status %d, said %q", code, errs)
		}
		if _, errs, code := ts("list"); code != 75 {
			t.Errorf("list with slurmctld stopped: status %d, said %q", code, errs)
		}
		c.Restart("slurmctld", "slurmctld", "-D")
		after, _, _ := loginRun(c.Command("squeue", "-h", "-t", "all", "-o", "%i"))
		if strings.Fields(before) == nil || len(strings.Fields(after)) != len(strings.Fields(before)) {
			t.Errorf("jobs before the controller stopped: %q; after its restart: %q", before, after)
		}
	})
}
