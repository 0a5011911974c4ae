package harness

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

// Burst is a kill-under-burst load.
type Burst struct {
	Round     time.Duration    // a round of submissions starts this often
	PerRound  int              // concurrent task-submit in a round, the users' in turn
	Npurun    int              // npurun clients looping alongside
	KillEvery [2]time.Duration // a kill comes after a wait drawn from this range
	Kills     int              // kills, one after another
}

// burstResult is what became of a kill-under-burst load's submissions, as
// the exit statuses of task-submit and the marks of the tasks' commands
// tell it.
type burstResult struct {
	Kills        int
	Submitted    int // task-submit runs
	Acked        int // exit 0: submitted, with an id
	Refused      int // another status, but 3: not submitted
	Unknown      int // exit 3: task-submit could not tell
	RanOnce      int // acknowledged, and marked once
	NeverRan     int // acknowledged, and never marked
	RanTwice     int // second marks, acknowledged or not
	RefusedRan   int // refused, and marked all the same
	DoubleGrants int // a device's O_EXCL marker found taken (tasks and npurun)
	NpurunRuns   int // npurun commands that ran
	Lost         int // tasks the broker lists as lost at the end
	Unstarted    int // tasks a supervisor said never got their go-ahead (the broker's log)
	AnswersLost  int // acknowledged after an answer was lost: the broker had recorded the first
	duration     time.Duration
}

func (r burstResult) String() string {
	return fmt.Sprintf("%d kills in %s; %d submissions: %d acknowledged (%d ran once, %d never ran; %d after a lost answer), %d ran twice, %d refused (%d ran all the same), %d unknown; %d lost, %d back in line unstarted; %d npurun runs; %d double grants",
		r.Kills, r.duration.Round(time.Second), r.Submitted, r.Acked, r.RanOnce, r.NeverRan, r.AnswersLost, r.RanTwice, r.Refused, r.RefusedRan, r.Unknown, r.Lost, r.Unstarted, r.NpurunRuns, r.DoubleGrants)
}

// KillUnderBurst runs load p against a broker of its own and counts.
func KillUnderBurst(tb testing.TB, p Burst) burstResult {
	tb.Helper()
	var users []*TestUser // nil: the test process, whose uid alone an unprivileged broker runs tasks for
	if os.Geteuid() == 0 {
		for range 4 {
			u := NewUser(tb)
			users = append(users, &u)
		}
	} else {
		users = []*TestUser{nil}
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
	submit := func(tok string, u *TestUser, kind []string) {
		defer subs.Done()
		args := append([]string{"--json", "--token", tok, "--log", os.DevNull}, kind...)
		args = append(args, "--", work, "-once", filepath.Join(marks, tok), "-markers", devMarks, "-hold", "20ms")
		// The longest a submission may take: a minute of asking again,
		// and its answers.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, b.Bin.TaskSubmit, args...)
		cmd.Env = b.Env()
		AsUser(cmd, u, dir)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		mu.Lock()
		defer mu.Unlock()
		res.Submitted++
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
				res.AnswersLost++
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
		tick := time.NewTicker(p.Round)
		defer tick.Stop()
		for round := 0; ; round++ {
			for i := range p.PerRound {
				subs.Add(1)
				go submit(fmt.Sprintf("r%d-%d", round, i), users[i%len(users)], kinds(round*p.PerRound+i))
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	for range p.Npurun {
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
					res.NpurunRuns++
				case errors.As(err, &ee) && ee.ExitCode() == 3:
					res.DoubleGrants++
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(50 * time.Millisecond) // the broker restarts: not a busy loop meanwhile
				}
			}
		})
	}
	start := time.Now()
	for range p.Kills {
		time.Sleep(p.KillEvery[0] + rand.N(p.KillEvery[1]-p.KillEvery[0]+1))
		b.Kill()
		b.Start()
		res.Kills++
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
	for _, t := range ListTasks(tb, b, nil, true) {
		if t.State == "lost" {
			res.Lost++
		}
	}
	res.Acked, res.Refused, res.Unknown = len(acked), len(refused), len(unknown)
	res.Unstarted = strings.Count(b.Log(), "never got its go-ahead")
	marked := func(tok string) bool {
		_, err := os.Stat(filepath.Join(marks, tok))
		return err == nil
	}
	for tok, id := range acked {
		if marked(tok) {
			res.RanOnce++
		} else {
			res.NeverRan++
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
			res.RefusedRan++
			tb.Logf("token %s was refused (%s), and ran", tok, why)
		}
	}
	twice, _ := filepath.Glob(filepath.Join(marks, "*.twice.*"))
	res.RanTwice = len(twice)
	for _, f := range twice {
		tb.Logf("ran twice: %s", filepath.Base(f))
	}
	return res
}

// taskStory is what the broker says of task id, and the lines of its log
// that name it: why an acknowledged task never ran.
func taskStory(tb testing.TB, b *Broker, id uint64) string {
	var out strings.Builder
	r := RunTaskCmd(tb, b.TaskSubmit("show", "--json", strconv.FormatUint(id, 10)))
	fmt.Fprintf(&out, "show: %s", strings.TrimSpace(r.Stdout+r.Stderr))
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
