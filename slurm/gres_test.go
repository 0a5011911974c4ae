package slurm

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestExpandHostlist(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want []string
		err  string
	}{
		{"/dev/davinci[4-7]", []string{"/dev/davinci4", "/dev/davinci5", "/dev/davinci6", "/dev/davinci7"}, ""},
		{"/dev/nvidia[3,1,0-1]", []string{"/dev/nvidia3", "/dev/nvidia1", "/dev/nvidia0", "/dev/nvidia1"}, ""},
		{"tux[08-10]", []string{"tux08", "tux09", "tux10"}, ""},
		{"a,b[1-2],c", []string{"a", "b1", "b2", "c"}, ""},
		{"r[1-2]n[1-2]", []string{"r1n1", "r1n2", "r2n1", "r2n2"}, ""},
		{"plain", []string{"plain"}, ""},
		{"x[3-1]", nil, `bad range "3-1"`},
		{"x[a]", nil, `bad range "a"`},
		{"x[1", nil, "unbalanced ["},
		{"x1]", nil, "unbalanced ]"},
		{"a,,b", nil, "empty name"},
		{"x[0-99999]", nil, "names more than 4096"},
	} {
		got, err := ExpandHostlist(tt.in)
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("ExpandHostlist(%q) error %v, want %q", tt.in, err, tt.err)
		case tt.err == "" && err != nil:
			t.Errorf("ExpandHostlist(%q): %v", tt.in, err)
		case tt.err == "" && !slices.Equal(got, tt.want):
			t.Errorf("ExpandHostlist(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestParseGres(t *testing.T) {
	conf := `# gres.conf
AutoDetect=off
NodeName=other[1-4] Name=gpu File=/dev/nvidia[0-7]
Name=gpu Type=910b File=/dev/davinci[4-5]   # two of them
NodeName=box[1-2] Name=gpu Type=910b \
    File=/dev/davinci7,/dev/davinci6
Name=mps Count=100
NodeName=box1 Name=npu File=/dev/davinci0
`
	g, err := ParseGres([]byte(conf), "gpu", "box1")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range g.Files {
		got = append(got, f.Path)
		if f.Position != len(got)-1 {
			t.Errorf("%s at position %d, want %d", f.Path, f.Position, len(got)-1)
		}
	}
	if want := []string{"/dev/davinci4", "/dev/davinci5", "/dev/davinci7", "/dev/davinci6"}; !slices.Equal(got, want) {
		t.Errorf("files %q, want %q", got, want)
	}
	if g.Files[0].Line != 4 || g.Files[2].Line != 5 {
		t.Errorf("lines %d and %d, want 4 and 5", g.Files[0].Line, g.Files[2].Line)
	}
	if g.Records != 2 || g.AutoDetect != "off" {
		t.Errorf("Records %d AutoDetect %q, want 2 and off", g.Records, g.AutoDetect)
	}
	if _, err := ParseGres([]byte("Name=gpu File\n"), "gpu", "x"); err == nil || !strings.Contains(err.Error(), `line 1: "File" is not KEY=VALUE`) {
		t.Errorf("a key without a value: %v", err)
	}
	if _, err := ParseGres([]byte("\n\nName=gpu File=/dev/x[1-\n"), "gpu", "x"); err == nil || !strings.Contains(err.Error(), "line 3: File=/dev/x[1-") {
		t.Errorf("a bad File=: %v", err)
	}
}

func TestGresConfPath(t *testing.T) {
	env := func(v string) func(string) string { return func(string) string { return v } }
	for _, tt := range []struct{ configured, slurmConf, want string }{
		{"/x/gres.conf", "/etc/slurm-llnl/slurm.conf", "/x/gres.conf"},
		{"", "/tmp/c/slurm.conf", "/tmp/c/gres.conf"},
		{"", "", "/etc/slurm/gres.conf"},
	} {
		if got := GresConfPath(tt.configured, env(tt.slurmConf)); got != tt.want {
			t.Errorf("GresConfPath(%q, SLURM_CONF=%q) = %q, want %q", tt.configured, tt.slurmConf, got, tt.want)
		}
	}
}

// nodeTree makes davinci0..3 in a temporary directory as links to real
// character devices (no root needed: Check follows links, as Slurm
// does), and a regular file "plain"; it returns the directory and the
// device numbers of davinci0..3 mapped to ids 0..3.
func nodeTree(t *testing.T) (string, map[uint64]int) {
	dir := t.TempDir()
	paths := map[int][]string{}
	for i, target := range []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random"} {
		p := filepath.Join(dir, "davinci"+string(rune('0'+i)))
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		paths[i] = []string{p}
	}
	if err := os.WriteFile(filepath.Join(dir, "plain"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/urandom", filepath.Join(dir, "stranger")); err != nil {
		t.Fatal(err)
	}
	return dir, NodeNumbers(paths)
}

func TestCheck(t *testing.T) {
	dir, numbers := nodeTree(t)
	if len(numbers) != 4 {
		t.Fatalf("NodeNumbers found %d devices, want 4", len(numbers))
	}
	for _, tt := range []struct {
		name    string
		conf    string
		ids     []int
		numbers map[uint64]int
		want    []string // one substring per problem, in order
	}{
		{"agree", "Name=gpu File=DIR/davinci[2-3]\n", []int{2, 3}, numbers, nil},
		{"agree, counts only", "Name=gpu File=DIR/davinci[0-1]\n", []int{2, 3}, nil, nil},
		{"count", "Name=gpu File=DIR/davinci[1-3]\n", []int{1, 2}, numbers, []string{
			"lists 3 device files of gres \"gpu\" for node \"box\", [slurm] gres_devices 2 (\"1,2\")",
			":1: position 2, DIR/davinci3: device 3's node, past the end of [slurm] gres_devices"}},
		{"order", "Name=gpu File=DIR/davinci[3,2]\n", []int{2, 3}, numbers, []string{
			":1: position 0, DIR/davinci3: device 3's node, but [slurm] gres_devices puts device 2 at position 0",
			":1: position 1, DIR/davinci2: device 2's node, but [slurm] gres_devices puts device 3 at position 1"}},
		{"missing and plain", "Name=gpu File=DIR/davinci9\nName=gpu File=DIR/plain\n", []int{0, 1}, numbers, []string{
			":1: position 0, DIR/davinci9: no such file",
			":2: position 1, DIR/plain: not a character device (Slurm refuses File= that is not one)"}},
		{"stranger", "Name=gpu File=DIR/stranger\n", []int{0}, numbers, []string{
			"position 0, DIR/stranger: device 1:9 is the node of none of the devices npurun manages"}},
		{"no record", "Name=gpu File=DIR/davinci0\n", []int{0}, numbers, []string{
			"names no gres \"npu\" for node \"box\": Slurm hands out none of [slurm] gres_devices \"0\""}},
		{"autodetect", "AutoDetect=nvml\nName=gpu File=DIR/davinci0\n", []int{0}, numbers, []string{
			"AutoDetect=nvml: Slurm may add or reorder devices"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			name := "gpu"
			if tt.name == "no record" {
				name = "npu"
			}
			conf := strings.ReplaceAll(tt.conf, "DIR", dir)
			g, err := ParseGres([]byte(conf), name, "box")
			if err != nil {
				t.Fatal(err)
			}
			got := Check(tt.ids, g, "gres.conf", name, "box", tt.numbers)
			if len(got) != len(tt.want) {
				t.Fatalf("Check: %d problems, want %d:\n%s", len(got), len(tt.want), strings.Join(got, "\n"))
			}
			for i, w := range tt.want {
				if w = strings.ReplaceAll(w, "DIR", dir); !strings.Contains(got[i], w) {
					t.Errorf("problem %d:\n%s\nwant it to contain\n%s", i, got[i], w)
				}
			}
		})
	}
}
