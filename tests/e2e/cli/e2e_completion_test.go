package cli

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/tests/harness"
)

// Shell completion (issue 20.6): each program writes its scripts
// (PROG --completion bash|zsh|fish) from the tables that parse its
// options; the shells themselves load them and complete lines against a
// real broker, whose pools, devices and task ids the scripts offer through
// task-submit __complete.

// completionProgs are the programs that have completion scripts.
var completionProgs = []string{"npurun", "task-submit", "npubroker"}

// completionEnv is a broker of pools interactive (npu 0-1) and queue
// (npu 2-3), one task that has ended and one that has not, and the
// binaries' scripts.
type completionEnv struct {
	b          *harness.Broker
	home       string // HOME for the shells
	dir        string // the scripts: DIR/SHELL/PROG
	done, live string // task ids
}

func newCompletionEnv(t *testing.T) *completionEnv {
	t.Helper()
	conf := harness.FakeConfig(4) + "[pools]\ninteractive = \"0-1\"\nqueue = \"2-3\"\n\n[tasks]\ncpu_slots = 4\nkill_grace = \"1s\"\n"
	e := &completionEnv{b: harness.StartBroker(t, conf), home: harness.ShellHome(t), dir: t.TempDir()}
	work := harness.SharedDir(t)
	done := harness.SubmitTask(t, e.b, nil, work, "--log", filepath.Join(work, "done.log"), "--", "true")
	if r := harness.WaitTask(t, e.b, done); r.Code != 0 {
		t.Fatalf("task %d: %s", done, r)
	}
	fifo := filepath.Join(work, "gate")
	harness.MakeFIFO(t, fifo)
	live := harness.SubmitTask(t, e.b, nil, work, "--log", filepath.Join(work, "live.log"), "--", "sh", "-c", `read x < "$1"`, "sh", fifo)
	t.Cleanup(func() {
		harness.RunTaskCmd(t, e.b.TaskSubmit("cancel", strconv.FormatUint(live, 10)))
		harness.WaitTask(t, e.b, live)
	})
	e.done, e.live = strconv.FormatUint(done, 10), strconv.FormatUint(live, 10)
	for _, shell := range []string{"bash", "zsh", "fish"} {
		if err := os.Mkdir(filepath.Join(e.dir, shell), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, prog := range completionProgs {
			out, err := exec.Command(filepath.Join(e.b.Bin.Dir, prog), "--completion", shell).Output()
			if err != nil || len(out) == 0 {
				t.Fatalf("%s --completion %s: %v", prog, shell, err)
			}
			if err := os.WriteFile(e.script(shell, prog), out, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return e
}

func (e *completionEnv) script(shell, prog string) string { return filepath.Join(e.dir, shell, prog) }

// env is the shells' environment: the binaries first in PATH, the
// broker's socket, a home of their own.
func (e *completionEnv) env(socket string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PATH=") && !strings.HasPrefix(kv, "NPURUN_SOCKET=") && !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "XDG_") {
			env = append(env, kv)
		}
	}
	env = append(env, "PATH="+e.b.Bin.Dir+":"+os.Getenv("PATH"), "HOME="+e.home)
	if socket != "" {
		env = append(env, "NPURUN_SOCKET="+socket)
	}
	return env
}

// run runs a shell command line with a deadline and returns its standard
// output and error.
func (e *completionEnv) run(t *testing.T, socket string, name string, args ...string) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), harness.EventTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = e.env(socket)
	cmd.Dir = e.home
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %q: %v\nstdout:\n%s\nstderr:\n%s", name, args, err, &stdout, &stderr)
	}
	return stdout.String(), stderr.String()
}

// bashDriver loads bash-completion where $1 is 1, then the script $2; finds
// the function that the script registered for the program $3 (complete -p),
// and calls it as readline does for the words after them, the cursor at
// the end of the last; it prints COMPREPLY, one a line.
const bashDriver = `
[[ $1 == 1 ]] && { source /usr/share/bash-completion/bash_completion || exit 3; }
source "$2" || exit 4
spec=$(complete -p "$3") || exit 5
fn=${spec##*-F } fn=${fn%% *}
shift 3
COMP_WORDS=("$@")
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
COMP_LINE="$*" COMP_POINT=${#COMP_LINE}
COMPREPLY=()
"$fn" "$1" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
`

// bashComplete is what the bash script of words[0] offers for the last of
// words, with bash-completion loaded or not; more are scripts loaded
// before it.
func (e *completionEnv) bashComplete(t *testing.T, socket string, bashCompletion bool, words []string, more ...string) []string {
	t.Helper()
	load := "0"
	if bashCompletion {
		load = "1"
	}
	prog := filepath.Base(words[0])
	pre := ""
	for _, m := range more {
		pre += "source " + m + "\n"
	}
	args := append([]string{"-c", pre + bashDriver, "bash", load, e.script("bash", prog), prog}, words...)
	out, stderr := e.run(t, socket, "bash", args...)
	// Outside a completion, compopt complains (bash-completion calls it
	// unguarded); anything else is the script's.
	for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if l != "" && !strings.Contains(l, "compopt: not currently executing completion function") {
			t.Errorf("bash completing %q wrote on standard error: %s", words, stderr)
			break
		}
	}
	return lines(out)
}

func lines(s string) []string {
	var l []string
	for _, x := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		if x = strings.TrimRight(x, "\r"); x != "" {
			l = append(l, x)
		}
	}
	return l
}

// completionCase is a line and what completing its last word must give:
// exactly want, or, with some, at least want; never any of not.
type completionCase struct {
	words []string
	want  []string
	some  bool
	not   []string
}

func (c completionCase) check(t *testing.T, shell string, got []string) {
	t.Helper()
	got = slices.Compact(slices.Sorted(slices.Values(got)))
	want := slices.Compact(slices.Sorted(slices.Values(c.want)))
	switch {
	case !c.some && !slices.Equal(got, want):
		t.Errorf("%s completes %q to %q, want %q", shell, strings.Join(c.words, " "), got, want)
	case c.some:
		for _, w := range want {
			if !slices.Contains(got, w) {
				t.Errorf("%s completes %q to %q, which lacks %q", shell, strings.Join(c.words, " "), got, w)
			}
		}
	}
	for _, n := range c.not {
		if slices.Contains(got, n) {
			t.Errorf("%s completes %q to %q, which has %q", shell, strings.Join(c.words, " "), got, n)
		}
	}
}

// TestCompletionBash: bash loads each program's script, which registers a
// function for the program (complete -p); called as readline calls it,
// the function offers options, subcommands, the values of options, and
// the pools, devices and task ids of the broker, following the command
// line as its parser does; without bash-completion and with it.
func TestCompletionBash(t *testing.T) {
	e := newCompletionEnv(t)
	d, l := e.done, e.live
	cases := []completionCase{
		{words: []string{"npurun", "--dev"}, want: []string{"--devices", "--device"}},
		{words: []string{"npurun", "-"}, some: true, want: []string{"-n", "--devices", "-p", "--no-wait", "--timeout", "--socket", "--help"}, not: []string{"--completion"}},
		{words: []string{"npurun", "-p", ""}, want: []string{"interactive", "queue"}},
		{words: []string{"npurun", "--pool", "=", "q"}, want: []string{"queue"}}, // --pool=q, as bash splits it
		{words: []string{"npurun", "-vp", ""}, want: []string{"interactive", "queue"}},
		{words: []string{"npurun", "-pq"}, want: []string{"-pqueue"}},
		{words: []string{"npurun", "-d", ""}, want: []string{"0", "1", "2", "3"}},
		{words: []string{"npurun", "-d", "1,"}, want: []string{"1,0", "1,1", "1,2", "1,3"}},
		{words: []string{"npurun", "--timeout", ""}, want: nil},
		{words: []string{"npurun", "--completion", ""}, want: []string{"bash", "zsh", "fish"}},
		{words: []string{"npurun", "-n", "2", "tru"}, some: true, want: []string{"true"}, not: []string{"--devices"}},
		{words: []string{"npurun", "-n", "2", "true", "-"}, not: []string{"--devices", "-n"}},
		{words: []string{"npurun", "--", "-"}, not: []string{"--devices", "-n"}},

		{words: []string{"task-submit", ""}, want: []string{"list", "show", "logs", "wait", "cancel", "hold", "release", "requeue"}},
		{words: []string{"task-submit", "show", ""}, want: []string{d, l}},
		{words: []string{"task-submit", "logs", "-f", ""}, want: []string{d, l}},
		{words: []string{"task-submit", "cancel", ""}, want: []string{l}},
		{words: []string{"task-submit", "hold", ""}, want: []string{l}},
		{words: []string{"task-submit", "requeue", ""}, want: []string{d, l}},
		{words: []string{"task-submit", "show", d, ""}, want: nil},
		{words: []string{"task-submit", "logs", "-"}, want: []string{"-f", "--follow", "--socket", "-h", "--help"}},
		{words: []string{"task-submit", "list", "--"}, want: []string{"--all", "--ended", "--since", "--json", "--socket", "--help"}},
		{words: []string{"task-submit", "--after", ""}, want: []string{d, l}},
		{words: []string{"task-submit", "--after", d + ","}, want: []string{d + "," + d, d + "," + l}},
		{words: []string{"task-submit", "-n", "2", "-p", ""}, want: []string{"interactive", "queue"}},
		{words: []string{"task-submit", "-n", "2", "--", "tru"}, some: true, want: []string{"true"}},
		{words: []string{"task-submit", "--run", "sh", ""}, want: []string{"list", "show", "logs", "wait", "cancel", "hold", "release", "requeue"}},

		{words: []string{"npubroker", ""}, want: []string{"serve", "check-config", "status", "usage", "drain", "undrain", "reload"}},
		{words: []string{"npubroker", "status", "--"}, want: []string{"--json", "--socket", "--watch", "--cluster", "--help"}},
		{words: []string{"npubroker", "usage", "--"}, want: []string{"--by", "--json", "--since", "--socket", "--user", "--help"}},
		{words: []string{"npubroker", "usage", "--by", ""}, want: []string{"user", "device"}},
		{words: []string{"npubroker", "serve", "--log", ""}, want: []string{"auto", "stderr", "syslog"}},
		{words: []string{"npubroker", "serve", "--cgroup", "o"}, some: true, want: []string{"off"}},
		{words: []string{"npubroker", "check-config", e.dir + "/ba"}, want: []string{e.dir + "/bash"}},
	}
	for _, bc := range []bool{false, true} {
		if bc {
			harness.NeedTool(t, "bash-completion", "/usr/share/bash-completion/bash_completion")
		}
		for _, c := range cases {
			c.check(t, "bash (bash-completion: "+strconv.FormatBool(bc)+")", e.bashComplete(t, e.b.Socket, bc, c.words))
		}
	}

	// The command that npurun runs is completed by its own completion
	// (bash-completion's _command_offset): here task-submit's.
	got := e.bashComplete(t, e.b.Socket, true, []string{"npurun", "-q", "task-submit", "ca"}, e.script("bash", "task-submit"))
	completionCase{words: []string{"npurun", "-q", "task-submit", "ca"}, want: []string{"cancel"}}.check(t, "bash", got)

	// The socket named on the line is the one asked; a program typed with
	// its path asks the task-submit beside it.
	bin := filepath.Join(e.b.Bin.Dir, "npurun")
	got = e.bashComplete(t, "", false, []string{bin, "--socket", e.b.Socket, "-p", ""})
	completionCase{words: []string{bin, "--socket", e.b.Socket, "-p", ""}, want: []string{"interactive", "queue"}}.check(t, "bash", got)
}

// TestCompletionNoBroker: where no broker answers, a completion offers no
// value from it, and does not keep the shell waiting: a socket that
// nobody listens on, and one whose listener never accepts.
func TestCompletionNoBroker(t *testing.T) {
	e := &completionEnv{b: &harness.Broker{Bin: harness.Bins(t)}, home: harness.ShellHome(t), dir: t.TempDir()}
	if err := os.Mkdir(filepath.Join(e.dir, "bash"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(e.b.Bin.Dir, "npurun"), "--completion", "bash").Output()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.script("bash", "npurun"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	stalled := filepath.Join(t.TempDir(), "stalled.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: stalled, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close() // never accepts: the connection waits in its backlog
	for _, socket := range []string{filepath.Join(t.TempDir(), "none.sock"), stalled} {
		start := time.Now()
		got := e.bashComplete(t, socket, false, []string{"npurun", "-p", ""})
		took := time.Since(start)
		if len(got) > 0 {
			t.Errorf("with %s, npurun -p completes to %q, want nothing", socket, got)
		}
		if took > 3*time.Second {
			t.Errorf("with %s, completing npurun -p took %s: the shell waits for it", socket, took)
		}
		start = time.Now()
		cmd := exec.Command(filepath.Join(e.b.Bin.Dir, "task-submit"), "__complete", "pools", "--socket", socket)
		out, err := cmd.CombinedOutput()
		if took := time.Since(start); err != nil || len(out) > 0 || took > 2*time.Second {
			t.Errorf("task-submit __complete pools --socket %s: %v after %s, printed %q; want status 0 and nothing, at once", socket, err, took, out)
		}
	}
}

// TestCompletionQuery: task-submit __complete, which the scripts run,
// prints each value and what it is, separated by a tab; an unknown kind
// prints nothing, with status 0.
func TestCompletionQuery(t *testing.T) {
	e := &completionEnv{b: harness.StartBroker(t, harness.FakeConfig(2)+"[pools]\nsmall = \"0\"\nbig = \"1\"\n")}
	for _, c := range []struct {
		kind string
		want []string
	}{
		{"pools", []string{"small\t1 device, 1 free", "big\t1 device, 1 free"}},
		{"devices", []string{"0\tnpu0 in pool small: free", "1\tnpu1 in pool big: free"}},
		{"tasks", nil},
		{"no-such-kind", nil},
	} {
		r := harness.RunTaskCmd(t, e.b.TaskSubmit("__complete", c.kind))
		if r.Code != 0 || !slices.Equal(lines(r.Stdout), c.want) || r.Stderr != "" {
			t.Errorf("task-submit __complete %s: %s; want status 0 and %q", c.kind, r, c.want)
		}
	}
}

// TestCompletionZsh: zsh loads each script after compinit without a word
// on standard error, and registers it for its program; in an interactive
// zsh on a pseudo-terminal, a tab offers what bash's script does.
func TestCompletionZsh(t *testing.T) {
	harness.NeedTool(t, "zsh", "zsh")
	e := newCompletionEnv(t)
	for _, prog := range completionProgs {
		fn := "_" + prog
		out, stderr := e.run(t, e.b.Socket, "zsh", "-fc", `autoload -U compinit; compinit -u -D; source "$1"; print -r -- ${_comps[$2]}`, "zsh", e.script("zsh", prog), prog)
		if strings.TrimSpace(out) != fn || stderr != "" {
			t.Errorf("zsh sourcing %s's script: registered %q for it (want %s); standard error: %q", prog, strings.TrimSpace(out), fn, stderr)
		}
		// As installed: a file _PROG in fpath, autoloaded by compinit.
		fdir := t.TempDir()
		harness.CopyFile(t, e.script("zsh", prog), filepath.Join(fdir, fn), 0o644)
		out, stderr = e.run(t, e.b.Socket, "zsh", "-fc", `fpath=("$1" $fpath); autoload -U compinit; compinit -u -D; print -r -- ${_comps[$2]}`, "zsh", fdir, prog)
		if strings.TrimSpace(out) != fn || stderr != "" {
			t.Errorf("zsh with %s in fpath: %q registered for %s (want %s); standard error: %q", fn, strings.TrimSpace(out), prog, fn, stderr)
		}
	}

	capture, err := filepath.Abs(filepath.Join("testdata", "completion", "zsh-complete.zsh"))
	if err != nil {
		t.Fatal(err)
	}
	d, l := e.done, e.live
	for _, c := range []completionCase{
		{words: []string{"npurun", "--dev"}, want: []string{"--devices", "--device"}},
		{words: []string{"npurun", "-p", ""}, want: []string{"interactive", "queue"}},
		{words: []string{"npurun", "-d", "1,"}, want: []string{"1,0", "1,1", "1,2", "1,3"}},
		{words: []string{"npurun", "-n", "2", "tru"}, some: true, want: []string{"true"}, not: []string{"--devices"}},
		{words: []string{"task-submit", ""}, want: []string{"list", "show", "logs", "wait", "cancel", "hold", "release", "requeue"}},
		{words: []string{"task-submit", "show", ""}, want: []string{d, l}},
		{words: []string{"task-submit", "cancel", ""}, want: []string{l}},
		{words: []string{"task-submit", "logs", "--"}, want: []string{"--follow", "--socket", "--help"}},
		{words: []string{"npubroker", "status", "--"}, want: []string{"--json", "--socket", "--watch", "--cluster", "--help"}},
		{words: []string{"npubroker", "serve", "--log", ""}, want: []string{"auto", "stderr", "syslog"}},
	} {
		var scripts []string
		for _, prog := range completionProgs {
			scripts = append(scripts, e.script("zsh", prog))
		}
		out, _ := e.run(t, e.b.Socket, "zsh", append([]string{"-f", capture, strings.Join(c.words, " ")}, scripts...)...)
		// _arguments offers "-" itself beside the options, where
		// single-letter ones may be grouped.
		got := slices.DeleteFunc(lines(out), func(s string) bool { return s == "-" })
		c.check(t, "zsh", got)
	}
}

// TestCompletionFish: fish parses each script (fish -n) and, having
// sourced it, completes lines (complete -C) with what bash's script
// offers, each with what it is.
func TestCompletionFish(t *testing.T) {
	harness.NeedTool(t, "fish", "fish")
	e := newCompletionEnv(t)
	for _, prog := range completionProgs {
		if _, stderr := e.run(t, e.b.Socket, "fish", "-n", e.script("fish", prog)); stderr != "" {
			t.Errorf("fish -n %s's script: %s", prog, stderr)
		}
	}
	d, l := e.done, e.live
	var src []string
	for _, prog := range completionProgs {
		src = append(src, "source "+e.script("fish", prog))
	}
	complete := func(words ...string) []string {
		t.Helper()
		out, stderr := e.run(t, e.b.Socket, "fish", "-c", strings.Join(src, "; ")+"; complete -C $argv[1]", strings.Join(words, " "))
		if stderr != "" {
			t.Errorf("fish completing %q: %s", strings.Join(words, " "), stderr)
		}
		return lines(out)
	}
	// Values, what each is cut off.
	for _, c := range []completionCase{
		{words: []string{"npurun", "--dev"}, want: []string{"--devices", "--device"}},
		{words: []string{"npurun", "-p", ""}, want: []string{"interactive", "queue"}},
		{words: []string{"npurun", "--pool="}, want: []string{"--pool=interactive", "--pool=queue"}},
		{words: []string{"npurun", "-d", "1,"}, want: []string{"1,0", "1,1", "1,2", "1,3"}},
		{words: []string{"npurun", "-n", "2", "tru"}, some: true, want: []string{"true"}, not: []string{"--devices"}},
		{words: []string{"npurun", "-n", "2", "true", "-"}, not: []string{"--devices", "-n"}},
		{words: []string{"task-submit", ""}, want: []string{"list", "show", "logs", "wait", "cancel", "hold", "release", "requeue"}},
		{words: []string{"task-submit", "show", ""}, want: []string{d, l}},
		{words: []string{"task-submit", "cancel", ""}, want: []string{l}},
		{words: []string{"task-submit", "--after", d + ","}, want: []string{d + "," + d, d + "," + l}},
		{words: []string{"task-submit", "-n", "2", "--", "tru"}, some: true, want: []string{"true"}},
		{words: []string{"npubroker", "status", "--"}, want: []string{"--json", "--socket", "--watch", "--cluster", "--help"}},
		{words: []string{"npubroker", "serve", "--log", ""}, want: []string{"auto", "stderr", "syslog"}},
	} {
		var got []string
		for _, line := range complete(c.words...) {
			v, _, _ := strings.Cut(line, "\t")
			got = append(got, v)
		}
		c.check(t, "fish", got)
	}
	// And what each is, as fish shows it beside the value.
	for _, c := range []completionCase{
		{words: []string{"npurun", "--devi"}, some: true, want: []string{"--devices\tnumber of devices (default 1)"}},
		{words: []string{"npurun", "-p", "q"}, want: []string{"queue\t2 devices, 2 free"}},
		{words: []string{"npurun", "-d", "3"}, want: []string{"3\tnpu3 in pool queue: free"}},
		{words: []string{"task-submit", "show", d}, some: true, want: []string{d + "\tdone: true"}},
		{words: []string{"task-submit", "ca"}, want: []string{"cancel\tcancel a task"}},
	} {
		c.check(t, "fish", complete(c.words...))
	}
}

// TestCompletionNpurunAlone: npurun --completion has the task-submit
// beside it write its script; with none there nor in PATH, it says so.
func TestCompletionNpurunAlone(t *testing.T) {
	b := harness.Bins(t)
	dir := t.TempDir()
	harness.CopyFile(t, b.Npurun, filepath.Join(dir, "npurun"), 0o755)
	run := func() (int, string) {
		cmd := exec.Command(filepath.Join(dir, "npurun"), "--completion", "bash")
		cmd.Env = []string{"PATH=" + filepath.Join(dir, "nothing")}
		return harness.ExitCode(t, cmd)
	}
	code, out := run()
	if code != 127 || !strings.Contains(out, "npurun: task-submit: command not found") || !strings.Contains(out, "npurun: hint: task-submit writes npurun's completion script") {
		t.Errorf("npurun --completion bash without task-submit: exit %d:\n%s", code, out)
	}
	harness.CopyFile(t, b.TaskSubmit, filepath.Join(dir, "task-submit"), 0o755)
	if code, out := run(); code != 0 || !strings.Contains(out, "complete -F _npurun npurun") {
		t.Errorf("npurun --completion bash with task-submit beside it: exit %d:\n%s", code, out)
	}
}
