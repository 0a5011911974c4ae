package cli

import (
	"slices"
	"strings"
	"testing"

	"github.com/npurun/npurun/internal/completion"
)

// sampleValues are a value each option's value name takes.
var sampleValues = map[string]string{
	"N": "2", "LIST": "3", "POOL": "p", "SIZE": "1G", "DURATION": "1h", "NAME": "n", "ID[,ID...]": "1,2",
	"FILE": "f", "STRING": "s", "CMD": "c", "TOKEN": "t", "PATH": "/s", "SHELL": "bash",
}

// TestFlagSetsFromTables: each form's flag set is its table: every option
// of the table is bound to what it sets, given on a command line it is
// set, and --help and the completion scripts list the table, -h and
// --help added.
func TestFlagSetsFromTables(t *testing.T) {
	forms := map[string]func(*options) *flagSet{
		"": func(o *options) *flagSet { return submitFlags(o, &submitArgs{}) },
	}
	tables := map[string][]completion.Option{"": submitOptions}
	for _, c := range commands {
		forms[c.name] = func(o *options) *flagSet { return commandFlags(o, c.name) }
		tables[c.name] = c.options
	}
	script := completionCommand()
	for name, flags := range forms {
		fs := flags(&options{})
		if d := fs.unbound(); d != nil {
			t.Errorf("%q: --%s bound to nothing", name, d.Long)
			continue
		}
		want := append(slices.Clip(tables[name]), completion.HelpOption)
		if got := fs.options(); !optionsEqual(got, want) {
			t.Errorf("%q: --help lists %v, table %v", name, got, want)
		}
		scripted := script.Options
		for _, s := range script.Subcommands {
			if s.Name == name {
				scripted = s.Options
			}
		}
		if !optionsEqual(scripted, want) {
			t.Errorf("%q: the scripts see %v, table %v", name, scripted, want)
		}
		for _, o := range tables[name] {
			arg := "--" + o.Long
			if o.Value != "" {
				v, ok := sampleValues[o.Value]
				if !ok {
					t.Fatalf("%q --%s: no sample of %s", name, o.Long, o.Value)
				}
				arg += "=" + v
			}
			fs := flags(&options{})
			if err := fs.parse([]string{arg}); err != nil || !fs.changed[o.Long] {
				t.Errorf("%q %s: %v, set %v", name, arg, err, fs.changed[o.Long])
			}
		}
	}
}

func optionsEqual(a, b []completion.Option) bool {
	return slices.EqualFunc(a, b, func(x, y completion.Option) bool {
		return x.Short == y.Short && x.Long == y.Long && x.Value == y.Value && x.Help == y.Help &&
			x.Many == y.Many && x.Hidden == y.Hidden && x.Complete == y.Complete && slices.Equal(x.Words, y.Words)
	})
}

// TestBindChecksTable: binding an option otherwise than its table says
// (a value to a switch, one value to a repeatable option), or twice, is
// refused at once; parsing with an option of the table bound to nothing
// too.
func TestBindChecksTable(t *testing.T) {
	table := []completion.Option{{Long: "json", Help: "j"}, {Long: "after", Value: "ID", Many: true, Help: "a"}}
	for name, bind := range map[string]func(fs *flagSet){
		"switch bound as string":  func(fs *flagSet) { var s string; fs.stringVar(&s, "json") },
		"list bound as string":    func(fs *flagSet) { var s string; fs.stringVar(&s, "after") },
		"bound twice":             func(fs *flagSet) { var b bool; fs.switchVar(&b, "json"); fs.switchVar(&b, "json") },
		"parsed with one unbound": func(fs *flagSet) { var b bool; fs.switchVar(&b, "json"); fs.parse(nil) },
	} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(r.(string), "task-submit x: option --") {
					t.Errorf("%s: panic %v", name, r)
				}
			}()
			bind(newFlags("task-submit x", false, table))
		}()
	}
}
