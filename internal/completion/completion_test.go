package completion

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestHelp: --help's list of options, from the table: names and value,
// help at one column, further lines of help under it, hidden options left
// out.
func TestHelp(t *testing.T) {
	got := Help([]Option{
		{Short: 'n', Long: "devices", Value: "N", Help: "number of devices"},
		{Long: "timeout", Value: "DURATION", Help: "give up after this long,\nwith status 75"},
		{Long: "secret", Value: "X", Hidden: true, Help: "not shown"},
		{Short: 'h', Long: "help", Help: "print this help"},
	}, 3)
	want := "" +
		"  -n, --devices N          number of devices\n" +
		"      --timeout DURATION   give up after this long,\n" +
		"                           with status 75\n" +
		"  -h, --help               print this help\n"
	if got != want {
		t.Errorf("Help:\n%s\nwant:\n%s", got, want)
	}
}

// TestQueryNames: the kinds asked of the broker are named, and read back,
// one way; the others have no name.
func TestQueryNames(t *testing.T) {
	for _, k := range []Kind{Pools, Devices, Tasks, LiveTasks} {
		if got, ok := ParseQuery(k.Query()); !ok || got != k || k.Query() == "" {
			t.Errorf("ParseQuery(%q) = %v, %v; want %v", k.Query(), got, ok, k)
		}
	}
	for _, k := range []Kind{None, Files, Dirs, Users, CommandLine} {
		if k.Query() != "" {
			t.Errorf("kind %d is asked of the broker as %q", k, k.Query())
		}
	}
	if _, ok := ParseQuery(""); ok {
		t.Errorf("ParseQuery(\"\") is a kind")
	}
}

// TestScriptShells: a script for each of Shells, none for another.
func TestScriptShells(t *testing.T) {
	c := &Command{Name: "x-y", Options: []Option{{Long: "all", Help: "all"}}}
	for _, sh := range Shells {
		if s, ok := Script(sh, c); !ok || !strings.Contains(s, "x-y") {
			t.Errorf("Script(%s): %v\n%s", sh, ok, s)
		}
	}
	if _, ok := Script("ksh", c); ok {
		t.Errorf("Script(ksh) is a script")
	}
}

// testCommand has what the engines must follow: grouped short options,
// values attached or apart, a repeatable option, a hidden one, words,
// subcommands with options after their arguments, and a command after
// "--".
var testCommand = &Command{
	Name: "prog",
	Options: []Option{
		{Short: 'v', Long: "verbose", Help: "more"},
		{Short: 'c', Long: "color", Value: "WHEN", Words: []string{"always", "never"}, Help: "colour"},
		{Short: 'i', Long: "include", Value: "DIR", Many: true, Complete: Dirs, Help: "look there"},
		{Long: "level", Value: "N", Help: "how much"},
		{Long: "secret", Value: "S", Hidden: true, Words: []string{"s1"}, Help: "hidden"},
	},
	Subcommands: []Subcommand{
		{Name: "get", Help: "get one", Options: []Option{{Short: 'o', Long: "out", Value: "MODE", Words: []string{"json", "text"}, Help: "how"}}, Args: Files, MaxArgs: 1},
		{Name: "put", Help: "put some", Options: []Option{{Short: 'f', Long: "force", Help: "force"}}},
	},
	Args: CommandLine,
}

// TestBashEngine: bash itself runs the script's function, as readline
// does, on lines that test the walk of the words; nothing in them asks a
// broker.
func TestBashEngine(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	script, _ := Script("bash", testCommand)
	dir := t.TempDir()
	for _, c := range []struct {
		words []string
		want  []string
	}{
		{[]string{"prog", ""}, []string{"get", "put"}},
		{[]string{"prog", "-"}, []string{"-v", "--verbose", "-c", "--color", "-i", "--include", "--level"}},
		{[]string{"prog", "--c"}, []string{"--color"}},
		{[]string{"prog", "-c", ""}, []string{"always", "never"}},
		{[]string{"prog", "-vc", "a"}, []string{"always"}},
		{[]string{"prog", "-vca"}, []string{"-vcalways"}},
		{[]string{"prog", "--color", "=", "n"}, []string{"never"}},
		{[]string{"prog", "--color", "="}, []string{"always", "never"}},
		{[]string{"prog", "--secret", ""}, []string{"s1"}},
		{[]string{"prog", "--level", "3", "p"}, []string{"put"}},
		{[]string{"prog", "-c", "always", "--level=3", "-v", "g"}, []string{"get"}},
		{[]string{"prog", "--color=always", "g"}, []string{"get"}},
		{[]string{"prog", "-i", dir + "/", ""}, []string{"get", "put"}},
		{[]string{"prog", "get", "-"}, []string{"-o", "--out"}},
		{[]string{"prog", "get", "-o", ""}, []string{"json", "text"}},
		{[]string{"prog", "get", "-ot"}, []string{"-otext"}},
		{[]string{"prog", "get", "x", "-o", "j"}, []string{"json"}},
		{[]string{"prog", "get", "x", ""}, nil},
		{[]string{"prog", "get", "--", "-"}, nil},
		{[]string{"prog", "put", "-"}, []string{"-f", "--force"}},
		{[]string{"prog", "--", "-"}, nil},
		{[]string{"prog", "-v", "--", "tru"}, []string{"true"}},
		{[]string{"prog", "--", "true", "-"}, nil},
	} {
		drive := script + `
COMP_WORDS=("$@")
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
_prog prog "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
`
		cmd := exec.Command("bash", append([]string{"-c", drive, "bash"}, c.words...)...)
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("bash %q: %v", c.words, err)
		}
		var got []string
		for _, l := range strings.Split(string(out), "\n") {
			if l != "" {
				got = append(got, l)
			}
		}
		if len(c.want) == 1 && c.want[0] == "true" {
			// Command names: at least this one.
			if !slices.Contains(got, "true") {
				t.Errorf("%q completes to %q, which lacks true", c.words, got)
			}
			continue
		}
		if !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(c.want))) {
			t.Errorf("%q completes to %q, want %q", c.words, got, c.want)
		}
	}
}

// TestSummary: the scripts that show an option's help show its Summary
// where it has one, else its Help on one line; --help lists Help.
func TestSummary(t *testing.T) {
	c := &Command{Name: "prog", Options: []Option{
		{Long: "socket", Value: "PATH", Help: "the long\nhelp", Summary: "short"},
		{Long: "all", Help: "every\none"},
	}}
	for _, sh := range []string{"zsh", "fish"} {
		s, _ := Script(sh, c)
		if !strings.Contains(s, "short") || strings.Contains(s, "the long") || !strings.Contains(s, "every one") {
			t.Errorf("%s script:\n%s", sh, s)
		}
	}
	if h := Help(c.Options, 2); !strings.Contains(h, "the long") || strings.Contains(h, "short") {
		t.Errorf("Help:\n%s", h)
	}
}
