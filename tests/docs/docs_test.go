package docs

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// The examples of the README and of the man pages, run (issue 14.6): every
// "$ COMMAND" line of a README code block and of a man page's .EX block is
// run by a scene of this file against a real broker (fake devices, or, for
// the status table, ascend-like device nodes), and the output shown under
// it must have the shape of what the command printed: the same lines, in
// order (a document may leave lines out), each the same once numbers,
// durations, ordinals, user names and the test's paths are set aside. A
// command no scene runs must be named in docNotRun with the reason; a
// scene or a reason for a command the documents no longer show fails too.
// User programs (python, torchrun, make, ./bench.sh) are the workload
// under those names (tests/workload/standin.go).

// docExample is one example command of a document and the output shown
// under it.
type docExample struct {
	doc  string
	line int
	cmd  string
	out  []string
}

func (e docExample) String() string { return fmt.Sprintf("%s:%d: $ %s", e.doc, e.line, e.cmd) }

// readmeExamples are the "$ " lines of the README's code blocks that have
// no language (toml blocks are configuration), with the lines under each.
func readmeExamples(t *testing.T) []docExample {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(harness.Root(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var exs []docExample
	in, plain := false, false
	var cur *docExample
	for i, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "```") {
			in, plain, cur = !in, strings.TrimSpace(strings.TrimPrefix(line, "```")) == "", nil
			continue
		}
		if !in || !plain {
			continue
		}
		if cmd, ok := strings.CutPrefix(line, "$ "); ok {
			exs = append(exs, docExample{doc: "README.md", line: i + 1, cmd: strings.TrimSpace(harness.DocComment.ReplaceAllString(cmd, ""))})
			cur = &exs[len(exs)-1]
		} else if cur != nil {
			cur.out = append(cur.out, line)
		}
	}
	return exs
}

// manUnescape is the text of a roff line as a reader sees it.
var manUnescape = strings.NewReplacer(`\-`, "-", `\(aq`, "'", `\(dq`, `"`, `\e`, `\`, `\&`, "", `\(em`, "—", `\[u2026]`, "…")

// manExamples are the "$ " lines of a man page's .EX blocks.
func manExamples(t *testing.T, page string) []docExample {
	t.Helper()
	var exs []docExample
	in := false
	var cur *docExample
	for i, line := range strings.Split(manRead(t, page), "\n") {
		switch {
		case line == ".EX":
			in, cur = true, nil
			continue
		case line == ".EE":
			in = false
			continue
		case !in:
			continue
		}
		line = manUnescape.Replace(line)
		if cmd, ok := strings.CutPrefix(line, "$ "); ok {
			exs = append(exs, docExample{doc: page, line: i + 1, cmd: cmd})
			cur = &exs[len(exs)-1]
		} else if cur != nil {
			cur.out = append(cur.out, line)
		}
	}
	return exs
}

// docNotRun are the example commands no scene runs, and why.
var docNotRun = map[string]string{
	"npurun --timeout 10m ...":           "a placeholder (...); tests/e2e/cli/testdata/cli/exit_statuses.txtar runs --timeout",
	"ssh student@box":                    "a login over ssh with the PAM module: TestSSHD (tests/e2e/access/e2e_sshd_test.go) runs it",
	"ssh student@box python x.py":        "a command over ssh: TestSSHD runs it",
	"ssh student@box npurun python x.py": "npurun over ssh: TestSSHD runs it",
	// Containers: a dockerd and podman of the test's own run these with a
	// busybox image (tests/e2e/containers/e2e_container_test.go), not the documents' images.
	"npurun -n 2 docker run --rm -v $PWD:/w ascend-train:8.0 python /w/train.py":       "a container: TestContainerDockerForeground runs npurun docker run --rm -v DIR:/m",
	"npurun docker run -d --name serve ascend-infer:8.0 ./serve.sh":                    "a container: TestContainerDockerDetached runs npurun docker run -d --name",
	"npurun podman run --rm ascend-infer:8.0 python3 infer.py":                         "a container: TestContainerPodman runs npurun podman run",
	"task-submit -n 4 --time 6h -- docker run --rm ascend-train:8.0 torchrun train.py": "a container as a task: TestContainerTask runs task-submit --time -- docker run --rm",
	"docker run --device /dev/davinci1 ascend-infer:8.0 ./serve.sh":                    "a container without npurun: TestContainerWithoutLease checks this error",
	"npurun podman run --rm --rootfs /srv/rootfs python3 infer.py":                     "a container: TestContainerPodman runs npurun podman run --rootfs",
	"docker kill serve": "a container: TestContainerDockerDetached runs docker kill",
	// Shares: a broker whose [share] pool differs from the scenes' runs them.
	"npurun -p share --mem 12G python eval.py":             "a share: TestShareBestFit (tests/e2e/lease/e2e_share_test.go) runs npurun --mem and checks its grant message",
	"task-submit -p share --mem 20G -- python finetune.py": "a share as a task: TestShareTask (tests/e2e/lease/e2e_share_test.go) runs task-submit --mem",
}

// docScene runs some of the examples, in order, on a stage of its own.
type docScene struct {
	name string
	cmds []string // the example commands it runs, as the documents write them
	root bool     // it needs root (other users, device nodes)
	run  func(t *testing.T, exs map[string][]docExample) *docStage
}

// docStage is where a scene runs the examples: a broker, a PATH with the
// binaries and the stand-ins, a working directory.
type docStage struct {
	t     *testing.T
	b     *harness.Broker
	dir   string
	env   []string
	names map[string]string // users' names in the test → in the documents, or all USER (nil: the test's user); then the documents' become USER too
	repl  []string          // old, new: test paths → the documents'
	exs   map[string][]docExample
	ran   map[string]bool
	as    *harness.TestUser // who runs the commands; nil: the test's own user
}

func newDocStage(t *testing.T, exs map[string][]docExample, conf string) *docStage {
	t.Helper()
	b := harness.StartBroker(t, conf)
	s := &docStage{t: t, b: b, dir: harness.SharedDir(t), exs: exs, ran: map[string]bool{}}
	stand := filepath.Join(s.dir, "bin")
	if err := os.Mkdir(stand, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"python", "torchrun", "make"} {
		if err := os.Symlink(b.Bin.Workload, filepath.Join(stand, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(b.Bin.Workload, filepath.Join(s.dir, "bench.sh")); err != nil {
		t.Fatal(err)
	}
	s.env = append(os.Environ(), "PATH="+stand+":"+b.Bin.Dir+":"+os.Getenv("PATH"), "NPURUN_SOCKET="+b.Socket, "NPURUN_STANDIN=", "NPURUN_STANDIN_CHILDREN=")
	return s
}

// command prepares the shell command line cmd on the stage, with extra
// variables.
func (s *docStage) command(cmd string, env ...string) *exec.Cmd {
	c := exec.Command("sh", "-c", cmd)
	c.Env = append(slices.Clone(s.env), env...)
	c.Dir = s.dir
	if s.as != nil {
		s.as.As(c, s.dir)
	}
	return c
}

// example runs the example cmd (as written, or as the scene must write it
// to run it here: run, "" for cmd itself), requires exit status code, and
// compares its output with each document's.
func (s *docStage) example(cmd, run string, code int, env ...string) string {
	s.t.Helper()
	if run == "" {
		run = cmd
	}
	got, out := harness.ExitCode(s.t, s.command(run, env...))
	if got != code {
		s.t.Errorf("$ %s: exit %d, want %d; output:\n%s", run, got, code, out)
	}
	s.compare(cmd, out)
	return out
}

// compare checks out, what cmd printed, against each document's example of
// cmd.
func (s *docStage) compare(cmd, out string) {
	s.t.Helper()
	if len(s.exs[cmd]) == 0 {
		s.t.Fatalf("no document shows %q: take it out of the scene", cmd)
	}
	s.ran[cmd] = true
	s.t.Logf("$ %s\n%s", cmd, out)
	for _, ex := range s.exs[cmd] {
		if msg := s.sameShape(ex.out, out); msg != "" {
			s.t.Errorf("%s: the output shown is not what it printed: %s\nshown:\n%s\nprinted:\n%s", ex, msg, strings.Join(ex.out, "\n"), out)
		}
	}
}

var (
	shapeDuration = regexp.MustCompile(`\b(\d+(\.\d+)?(ms|µs|s|m|h|d))+\b`)
	shapeOrdinal  = regexp.MustCompile(`\b\d+(st|nd|rd|th)\b`)
	shapeNumber   = regexp.MustCompile(`\d+`)
	shapeBlank    = regexp.MustCompile(`\s+`)
	docUsers      = regexp.MustCompile(`\b(alice|bob|carol|dave|erin|student)\b`)
)

// shape is a line with its particulars set aside: users' names,
// durations, ordinals, numbers, runs of blanks. Where the stage's users
// are all one (the test's own), every name is USER; else the test's users
// become the documents' names they stand for.
func (s *docStage) shape(line string, printed bool) string {
	if printed {
		for i := 0; i+1 < len(s.repl); i += 2 {
			line = strings.ReplaceAll(line, s.repl[i], s.repl[i+1])
		}
		names := s.names
		if names == nil {
			names = map[string]string{harness.Me(s.t): "USER"}
		}
		for name, as := range names {
			line = regexp.MustCompile(`\b`+regexp.QuoteMeta(name)+`\b`).ReplaceAllString(line, as)
		}
	}
	if !slices.ContainsFunc(slices.Collect(maps.Values(s.names)), func(as string) bool { return as != "USER" }) {
		line = docUsers.ReplaceAllString(line, "USER")
	}
	line = shapeDuration.ReplaceAllString(line, "DUR")
	line = shapeOrdinal.ReplaceAllString(line, "ORD")
	line = shapeNumber.ReplaceAllString(line, "N")
	return strings.TrimSpace(shapeBlank.ReplaceAllString(line, " "))
}

// sameShape tells how shown, the lines a document shows, differ from out:
// each shown line must have the shape of a printed one, in order. "" when
// they agree.
func (s *docStage) sameShape(shown []string, out string) string {
	var printed []string
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) != "" {
			printed = append(printed, s.shape(l, true))
		}
	}
	i := 0
	for _, l := range shown {
		if strings.TrimSpace(l) == "" {
			continue
		}
		want := s.shape(l, false)
		for i < len(printed) && printed[i] != want {
			i++
		}
		if i == len(printed) {
			return fmt.Sprintf("no printed line, in order, has the shape of %q (%q)", l, want)
		}
		i++
	}
	return ""
}

// TestDocExamples runs the documents' examples.
func TestDocExamples(t *testing.T) {
	harness.Bins(t)
	all := readmeExamples(t)
	for _, page := range []string{"npurun.1", "task-submit.1", "npubroker.8"} {
		all = append(all, manExamples(t, page)...)
	}
	exs := map[string][]docExample{}
	for _, ex := range all {
		exs[ex.cmd] = append(exs[ex.cmd], ex)
	}
	scenes := docScenes()
	covered := map[string]bool{}
	for _, sc := range scenes {
		for _, c := range sc.cmds {
			covered[c] = true
		}
	}
	for _, ex := range all {
		if !covered[ex.cmd] && docNotRun[ex.cmd] == "" {
			t.Errorf("%s: no scene runs this example: add one to tests/docs/docs_test.go, or say in docNotRun why not", ex)
		}
	}
	for c := range covered {
		if len(exs[c]) == 0 {
			t.Errorf("a scene runs %q, which no document shows any more", c)
		}
	}
	for c := range docNotRun {
		if len(exs[c]) == 0 {
			t.Errorf("docNotRun names %q, which no document shows any more", c)
		}
	}
	for _, sc := range scenes {
		t.Run(sc.name, func(t *testing.T) {
			if sc.root {
				harness.NeedRoot(t)
			}
			s := sc.run(t, exs)
			for _, c := range sc.cmds {
				if !s.ran[c] && !t.Failed() {
					t.Errorf("the scene did not run %q", c)
				}
			}
		})
	}
}
