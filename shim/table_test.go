package shim

import (
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"slices"
	"strconv"
	"testing"

	"github.com/npurun/npurun/internal/completion"
)

// npurun keeps its parser by hand (shim/args.go says why); these tests
// keep it to its table of options, which --help and the completion
// scripts are written from.

// setCases are the option names that (*command).set in args.go has a
// case for, read from its source.
func setCases(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "args.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Name.Name != "set" || fd.Recv == nil {
			continue
		}
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			if cc, ok := n.(*ast.CaseClause); ok {
				for _, e := range cc.List {
					if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						s, _ := strconv.Unquote(lit.Value)
						names = append(names, s)
					}
				}
			}
			return true
		})
	}
	if len(names) == 0 {
		t.Fatal("no case of (*command).set found in args.go")
	}
	return names
}

// TestParserIsTable: every option the parser sets is in the table, and
// every option of the table is set: given, it changes what the command
// line means; given with a value, its value does; and its short name
// means what its long one does.
func TestParserIsTable(t *testing.T) {
	var table []string
	for _, o := range options {
		table = append(table, o.Long)
	}
	cases := setCases(t)
	for _, c := range cases {
		if !slices.Contains(table, c) {
			t.Errorf("args.go sets --%s, which is not in the table", c)
		}
	}
	for _, l := range table {
		if !slices.Contains(cases, l) {
			t.Errorf("--%s of the table has no case in args.go's set", l)
		}
	}
	// Two values each option with a value takes, that mean different
	// things.
	samples := map[string][2]string{
		"devices": {"2", "3"}, "device": {"1", "2"}, "pool": {"a", "b"}, "mem": {"1G", "2G"},
		"timeout": {"1m", "2m"}, "time": {"1m", "2m"}, "container": {"docker", "podman"}, "socket": {"/a", "/b"},
		"completion": {"bash", "zsh"},
	}
	base, err := parseArgs([]string{"sh"})
	if err != nil {
		t.Fatal(err)
	}
	parse := func(args ...string) *command {
		t.Helper()
		c, err := parseArgs(append(args, "sh"))
		if err != nil {
			t.Fatalf("parseArgs(%q): %v", args, err)
		}
		return c
	}
	for _, o := range options {
		if o.Value == "" {
			c, err := parseArgs([]string{"--" + o.Long, "sh"})
			switch {
			case o.Long == "help":
				if err != errHelp {
					t.Errorf("--help: %v", err)
				}
				continue
			case err != nil:
				t.Errorf("--%s: %v", o.Long, err)
				continue
			case reflect.DeepEqual(c, base):
				t.Errorf("--%s changes nothing", o.Long)
			}
			if o.Short != 0 {
				if s := parse("-" + string(o.Short)); !reflect.DeepEqual(s, c) {
					t.Errorf("-%c means %+v, --%s %+v", o.Short, s, o.Long, c)
				}
			}
			continue
		}
		v, ok := samples[o.Long]
		if !ok {
			t.Errorf("--%s: no sample values", o.Long)
			continue
		}
		c1, c2 := parse("--"+o.Long+"="+v[0]), parse("--"+o.Long, v[1])
		if reflect.DeepEqual(c1, base) || reflect.DeepEqual(c1, c2) {
			t.Errorf("--%s: its value changes nothing: %+v, %+v", o.Long, c1, c2)
		}
		if o.Short != 0 {
			if s := parse("-"+string(o.Short), v[0]); !reflect.DeepEqual(s, c1) {
				t.Errorf("-%c means %+v, --%s %+v", o.Short, s, o.Long, c1)
			}
		}
	}
}

// TestSharedOptions: npurun's -h, --help and --completion are those of
// every command, written out in the table so the compiler lays it out
// (nothing of it is computed at start-up).
func TestSharedOptions(t *testing.T) {
	for _, want := range []completion.Option{completion.HelpOption, completion.CompletionOption} {
		i := slices.IndexFunc(options, func(o completion.Option) bool { return o.Long == want.Long })
		switch {
		case i < 0:
			t.Errorf("npurun has no --%s", want.Long)
		case !reflect.DeepEqual(options[i], want):
			t.Errorf("npurun's --%s is not every command's: %+v, want %+v", want.Long, options[i], want)
		}
	}
}
