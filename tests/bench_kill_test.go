package tests

// BenchmarkKillUnderBurst reruns the fault injection of issue 15: bursts
// of concurrent task-submit --json from several users (-n 2, -d N and
// --no-device tasks, two CPU slots) and npurun clients alongside, while
// the broker is killed with -9 every few seconds and started again at
// once, as systemd would. It prints what became of the submissions as the
// workload itself counts it: each task's command marks its run with a file
// made O_EXCL and named by the token its submitter chose (--token), so
// "never ran" and "ran twice" are read off the marks, not the broker's
// bookkeeping. Targets: acknowledged tasks that never ran 0, run twice 0,
// over at least 50 kills. TestKillUnderBurst (e2e_task_faults_test.go) is
// a short run of the same load, asserting them.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// burst is a kill-under-burst load.
type burst struct {
	round     time.Duration    // a round of submissions starts this often
	perRound  int              // concurrent task-submit in a round, the users' in turn
	npurun    int              // npurun clients looping alongside
	killEvery [2]time.Duration // a kill comes after a wait drawn from this range
	kills     int              // kills, one after another
}

// burstResult is what became of a kill-under-burst load's submissions, as
// the exit statuses of task-submit and the marks of the tasks' commands
// tell it.
type burstResult struct {
	kills        int
	submitted    int // task-submit runs
	acked        int // exit 0: submitted, with an id
	refused      int // another status, but 3: not submitted
	unknown      int // exit 3: task-submit could not tell
	ranOnce      int // acknowledged, and marked once
	neverRan     int // acknowledged, and never marked
	ranTwice     int // second marks, acknowledged or not
	refusedRan   int // refused, and marked all the same
	doubleGrants int // a device's O_EXCL marker found taken (tasks and npurun)
	npurunRuns   int // npurun commands that ran
	lost         int // tasks the broker lists as lost at the end
	unstarted    int // tasks a supervisor said never got their go-ahead (the broker's log)
	answersLost  int // acknowledged after an answer was lost: the broker had recorded the first
	duration     time.Duration
}

func (r burstResult) String() string {
	return fmt.Sprintf("%d kills in %s; %d submissions: %d acknowledged (%d ran once, %d never ran; %d after a lost answer), %d ran twice, %d refused (%d ran all the same), %d unknown; %d lost, %d back in line unstarted; %d npurun runs; %d double grants",
		r.kills, r.duration.Round(time.Second), r.submitted, r.acked, r.ranOnce, r.neverRan, r.answersLost, r.ranTwice, r.refused, r.refusedRan, r.unknown, r.lost, r.unstarted, r.npurunRuns, r.doubleGrants)
}

// killUnderBurst runs load p against a broker of its own and counts.
func killUnderBurst(tb testing.TB, p burst) burstResult {
	tb.Helper()
	var users []*testUser // nil: the test process, whose uid alone an unprivileged broker runs tasks for
	if os.Geteuid() == 0 {
		for range 4 {
			u := newUser(tb)
			users = append(users, &u)
		}
	} else {
		users = []*testUser{nil}
	}
	b := StartBroker(tb, FakeConfig(4)+"[tasks]\ncpu_slots = 2\nkill_grace = \"1s\"\n")
	dir := SharedDir(tb)
	shared := func(name string) string {
		d := filepath.Join(dir, name)
		if err := os.Mkdir(d, 0o777); err != nil {
			tb.Fatal(err)
		}
		if err := os.Chmod(d, 0o1777); err != nil { // every user may mark, none remove another's
			tb.Fatal(err)
		}
		return d
	}
	marks, devMarks := shared("marks"), shared("devices")
	work := b.Bin.Workload

	var (
		mu       sync.Mutex
		res      burstResult
		acked    = map[string]uint64{} // token → id
		refused  = map[string]string{} // token → what task-submit said
		unknown  = map[string]bool{}
		subs     sync.WaitGroup
		loops    sync.WaitGroup
		stop     = make(chan struct{})
		failures []string
	)
	submit := func(tok string, u *testUser, kind []string) {
		defer subs.Done()
		args := append([]string{"--json", "--token", tok, "--log", os.DevNull}, kind...)
		args = append(args, "--", work, "-once", filepath.Join(marks, tok), "-markers", devMarks, "-hold", "20ms")
		// The longest a submission may take: a minute of asking again,
		// and its answers.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, b.Bin.TaskSubmit, args...)
		cmd.Env = b.Env()
		asUser(cmd, u, dir)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		mu.Lock()
		defer mu.Unlock()
		res.submitted++
		var ee *exec.ExitError
		switch {
		case err == nil:
			var s struct{ ID uint64 }
			if json.Unmarshal(out.Bytes(), &s) != nil || s.ID == 0 {
				failures = append(failures, fmt.Sprintf("task-submit --json printed %q", out.String()))
				return
			}
			acked[tok] = s.ID
			if strings.Contains(errb.String(), "the broker had recorded it before its answer was lost") {
				res.answersLost++
			}
		case errors.As(err, &ee) && ee.ExitCode() == exitUnknownStatus:
			unknown[tok] = true
		case errors.As(err, &ee):
			refused[tok] = fmt.Sprintf("exit %d: %s", ee.ExitCode(), strings.TrimSpace(errb.String()))
		default:
			failures = append(failures, fmt.Sprintf("task-submit: %v: %s", err, errb.String()))
		}
	}
	kinds := func(i int) []string {
		switch i % 4 {
		case 0:
			return []string{"-n", "2"}
		case 1:
			return []string{"-d", strconv.Itoa(i / 4 % 4)}
		case 2:
			return []string{"-n", "1"}
		}
		return []string{"--no-device"}
	}
	loops.Go(func() {
		tick := time.NewTicker(p.round)
		defer tick.Stop()
		for round := 0; ; round++ {
			for i := range p.perRound {
				subs.Add(1)
				go submit(fmt.Sprintf("r%d-%d", round, i), users[i%len(users)], kinds(round*p.perRound+i))
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	for range p.npurun {
		loops.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				cmd := b.Npurun("--timeout", "20s", "--", work, "-markers", devMarks, "-hold", "10ms")
				err := cmd.Run()
				var ee *exec.ExitError
				mu.Lock()
				switch {
				case err == nil:
					res.npurunRuns++
				case errors.As(err, &ee) && ee.ExitCode() == 3:
					res.doubleGrants++
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(50 * time.Millisecond) // the broker restarts: not a busy loop meanwhile
				}
			}
		})
	}
	start := time.Now()
	for range p.kills {
		time.Sleep(p.killEvery[0] + rand.N(p.killEvery[1]-p.killEvery[0]+1))
		b.Kill()
		b.Start()
		res.kills++
	}
	close(stop)
	loops.Wait()
	subs.Wait()
	res.duration = time.Since(start)
	for _, f := range failures {
		tb.Error(f)
	}

	// Every acknowledged task ends: its end is awaited, not polled.
	for tok, id := range acked {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, b.Bin.TaskSubmit, "wait", strconv.FormatUint(id, 10))
		cmd.Env = b.Env()
		out, _ := cmd.CombinedOutput() // its status is the task's
		late := ctx.Err() == context.DeadlineExceeded
		cancel()
		if late {
			tb.Errorf("task %d (token %s) did not end within 2 minutes after the load: %s", id, tok, out)
		}
	}
	for _, t := range listTasks(tb, b, nil, true) {
		if t.State == "lost" {
			res.lost++
		}
	}
	res.acked, res.refused, res.unknown = len(acked), len(refused), len(unknown)
	res.unstarted = strings.Count(b.Log(), "never got its go-ahead")
	marked := func(tok string) bool {
		_, err := os.Stat(filepath.Join(marks, tok))
		return err == nil
	}
	for tok, id := range acked {
		if marked(tok) {
			res.ranOnce++
		} else {
			res.neverRan++
			tb.Logf("acknowledged task %d (token %s) never ran: %s", id, tok, taskStory(tb, b, id))
		}
	}
	whys := map[string]int{}
	for _, why := range refused {
		whys[why]++
	}
	for why, n := range whys {
		tb.Logf("refused %d times: %s", n, why)
	}
	for tok, why := range refused {
		if marked(tok) {
			res.refusedRan++
			tb.Logf("token %s was refused (%s), and ran", tok, why)
		}
	}
	twice, _ := filepath.Glob(filepath.Join(marks, "*.twice.*"))
	res.ranTwice = len(twice)
	for _, f := range twice {
		tb.Logf("ran twice: %s", filepath.Base(f))
	}
	return res
}

// taskStory is what the broker says of task id, and the lines of its log
// that name it: why an acknowledged task never ran.
func taskStory(tb testing.TB, b *Broker, id uint64) string {
	var out strings.Builder
	r := runTaskCmd(tb, b.TaskSubmit("show", "--json", strconv.FormatUint(id, 10)))
	fmt.Fprintf(&out, "show: %s", strings.TrimSpace(r.stdout+r.stderr))
	name := fmt.Sprintf("task %d", id)
	for _, line := range strings.Split(b.Log(), "\n") {
		if i := strings.Index(line, name); i >= 0 && (len(line) == i+len(name) || line[i+len(name)] < '0' || line[i+len(name)] > '9') {
			out.WriteString("\n\t" + line)
		}
	}
	return out.String()
}

// exitUnknownStatus is task-submit's exit status for a submission it
// cannot tell the fate of.
const exitUnknownStatus = 3

// BenchmarkKillUnderBurst: every 1.5 s, 24 concurrent task-submit --json
// from 4 users (-n 2, -d N, --no-device; cpu_slots = 2), 8 npurun clients
// alongside, the broker killed every 2–4 s, 50 times.
func BenchmarkKillUnderBurst(b *testing.B) {
	for b.Loop() {
		r := killUnderBurst(b, burst{round: 1500 * time.Millisecond, perRound: 24, npurun: 8,
			killEvery: [2]time.Duration{2 * time.Second, 4 * time.Second}, kills: 50})
		b.ReportMetric(float64(r.kills), "kills")
		b.ReportMetric(float64(r.acked), "acknowledged")
		b.ReportMetric(float64(r.neverRan), "never-ran")
		b.ReportMetric(float64(r.ranTwice), "ran-twice")
		b.ReportMetric(float64(r.refusedRan), "refused-ran")
		b.ReportMetric(float64(r.unknown), "unknown")
		benchSummary(b, "kill -9 under bursts of submissions (targets: never ran 0, ran twice 0, over ≥ 50 kills)", [][]string{
			{"kills", "submitted", "acknowledged", "ran once", "never ran", "ran twice", "refused", "refused, ran", "unknown", "lost", "answer lost", "unstarted", "npurun runs", "double grants"},
			{strconv.Itoa(r.kills), strconv.Itoa(r.submitted), strconv.Itoa(r.acked), strconv.Itoa(r.ranOnce), strconv.Itoa(r.neverRan), strconv.Itoa(r.ranTwice),
				strconv.Itoa(r.refused), strconv.Itoa(r.refusedRan), strconv.Itoa(r.unknown), strconv.Itoa(r.lost), strconv.Itoa(r.answersLost), strconv.Itoa(r.unstarted),
				strconv.Itoa(r.npurunRuns), strconv.Itoa(r.doubleGrants)},
		})
	}
}
