package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/npurun/npurun/internal/completion"
)

// TestNewFlags: a flag set made from a table has the table's options and
// no other, in its order, each taking a value as its entry says, with its
// entry's help, short name and default; and its parse reads them.
func TestNewFlags(t *testing.T) {
	tables := map[string][]completion.Option{
		"status": StatusOptions, "usage": UsageOptions, "drain": DrainOptions,
		"undrain": UndrainOptions, "reload": ReloadOptions,
	}
	for name, table := range tables {
		fs := NewFlags("npubroker "+name, table)
		var got []string
		fs.VisitAll(func(f *pflag.Flag) { got = append(got, f.Name) })
		if len(got) != len(table) {
			t.Errorf("%s: flags %v, table has %d", name, got, len(table))
			continue
		}
		for i, o := range table {
			f := fs.Lookup(o.Long)
			switch {
			case got[i] != o.Long:
				t.Errorf("%s: flag %d is --%s, table's is --%s", name, i, got[i], o.Long)
			case f.Usage != o.Help || f.DefValue != map[bool]string{true: "false", false: o.Default}[o.Value == ""]:
				t.Errorf("%s --%s: usage %q default %q, table's %q %q", name, o.Long, f.Usage, f.DefValue, o.Help, o.Default)
			case (f.Value.Type() == "bool") != (o.Value == ""):
				t.Errorf("%s --%s: pflag type %s, table's value %q", name, o.Long, f.Value.Type(), o.Value)
			case (f.Shorthand != "") != (o.Short != 0) || (o.Short != 0 && f.Shorthand != string(o.Short)):
				t.Errorf("%s --%s: short %q, table's %q", name, o.Long, f.Shorthand, o.Short)
			}
		}
	}
	fs := NewFlags("npubroker usage", UsageOptions)
	if err := fs.Parse([]string{"--json", "--user=alice", "--socket", "/s"}); err != nil {
		t.Fatal(err)
	}
	if !fs.Bool("json") || fs.String("user") != "alice" || fs.String("socket") != "/s" || fs.String("since") != DefaultUsageSince {
		t.Errorf("parsed json %v user %q socket %q since %q", fs.Bool("json"), fs.String("user"), fs.String("socket"), fs.String("since"))
	}
}

// TestHelpFromTable: a command's --help lists its table's options, a
// default where the entry has one, and its value as pflag names it.
func TestHelpFromTable(t *testing.T) {
	var out bytes.Buffer
	env := Env{Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }}
	if code := Usage([]string{"--help"}, env); code != 0 {
		t.Fatalf("usage --help: status %d", code)
	}
	_, opts, _ := strings.Cut(out.String(), "Options:\n")
	want := "" +
		"      --by string           sum per user, kind of lease and pool (user) or per device (device) (default \"user\")\n" +
		"      --json[=true|false]   print the sums as JSON\n" +
		"      --since string        how far back to count: a duration such as 7d, 24h or 90m (default \"7d\")\n" +
		"      --socket string       the broker's socket (default $NPURUN_SOCKET, or /run/npurun/broker.sock)\n" +
		"      --user string         only this user's leases\n"
	if opts != want {
		t.Errorf("usage --help lists:\n%s\nwant:\n%s", opts, want)
	}
}
