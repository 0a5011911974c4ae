package npu

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// fakeDev makes a directory holding empty files with the given names.
func fakeDev(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// fakeNPUSmi writes a shell script that answers `info -m` with table and
// exit status code, and `info -t phyid-remap -p N` with remap[N] (or an
// error where remap has no N). Each call is appended to the file calls
// returns.
func fakeNPUSmi(t *testing.T, table string, code int, remap map[int]string) (bin string, calls func() []string) {
	t.Helper()
	dir := t.TempDir()
	for id, out := range remap {
		if err := os.WriteFile(filepath.Join(dir, "remap-"+strconv.Itoa(id)), []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	log := filepath.Join(dir, "calls")
	bin = filepath.Join(dir, "npu-smi")
	script := "#!/bin/sh\necho \"$*\" >> " + log + "\n" +
		"case \"$*\" in\n" +
		"\"info -m\")\ncat <<'END'\n" + table + "END\nexit " + strconv.Itoa(code) + " ;;\n" +
		"\"info -t phyid-remap -p \"*)\n[ -f " + dir + "/remap-$5 ] && exec cat " + dir + "/remap-$5\n" +
		"echo \"Error: the device $5 does not exist\"; exit 2 ;;\n" +
		"esac\nexit 9\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, func() []string {
		data, err := os.ReadFile(log)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		return strings.Fields(strings.ReplaceAll(strings.TrimSpace(string(data)), " ", "_"))
	}
}

// remapOut is what `npu-smi info -t phyid-remap -p PHYS` prints on 910B
// drivers.
func remapOut(phys, logical, card, chip int) string {
	var b strings.Builder
	for _, kv := range []struct {
		k string
		v int
	}{{"Chip Physical ID", phys}, {"Chip Logic ID", logical}, {"NPU ID", card}, {"Chip ID", chip}} {
		fmt.Fprintf(&b, "\t%-30s:%d\n", kv.k, kv.v)
	}
	return b.String()
}

// testdata reads a fixture.
func testdata(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// remapFixtures reads testdata/phyid-remap/PREFIX-N.txt for each id.
func remapFixtures(t *testing.T, prefix string, ids ...int) map[int]string {
	t.Helper()
	m := make(map[int]string, len(ids))
	for _, id := range ids {
		m[id] = testdata(t, "phyid-remap/"+prefix+"-"+strconv.Itoa(id)+".txt")
	}
	return m
}

// sampleRemapped lists four 910B chips whose logical ids differ from their
// enumeration order.
const sampleRemapped = `	NPU ID                         Chip ID                        Chip Logic ID                  Chip Name
	0                              0                              2                              Ascend 910B3
	0                              1                              -                              Mcu
	1                              0                              3                              Ascend 910B3
	1                              1                              -                              Mcu
	2                              0                              0                              Ascend 910B3
	2                              1                              -                              Mcu
	3                              0                              1                              Ascend 910B3
	3                              1                              -                              Mcu
`

// sampleRemaps are npu-smi's answers for sampleRemapped's chips: the
// listing is in physical order.
var sampleRemaps = map[int]string{0: remapOut(0, 2, 0, 0), 1: remapOut(1, 3, 1, 0), 2: remapOut(2, 0, 2, 0), 3: remapOut(3, 1, 3, 0)}

func TestDiscover(t *testing.T) {
	ascendDev := fakeDev(t, "davinci0", "davinci1", "davinci2", "davinci3", "davinci_manager", "devmm_svm", "hisi_hdc")
	nvidiaDev := fakeDev(t, "nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm")
	emptyDev := fakeDev(t)
	smi, _ := fakeNPUSmi(t, sampleRemapped, 0, sampleRemaps)
	brokenSmi, _ := fakeNPUSmi(t, "", 3, nil)
	missingSmi := filepath.Join(t.TempDir(), "npu-smi")

	tests := []struct {
		name    string
		vendor  Vendor
		ids     []int
		devDir  string
		npuSmi  string
		want    *Inventory
		wantErr string
	}{
		{
			name: "auto finds ascend and maps logical ids", vendor: Auto, devDir: ascendDev, npuSmi: smi,
			want: &Inventory{Vendor: Ascend, IDs: []int{0, 1, 2, 3}, DevDir: ascendDev, Logical: map[int]int{0: 2, 1: 3, 2: 0, 3: 1}},
		},
		{
			name: "ascend subset", vendor: Ascend, ids: []int{3, 1}, devDir: ascendDev, npuSmi: smi,
			want: &Inventory{Vendor: Ascend, IDs: []int{1, 3}, DevDir: ascendDev, Logical: map[int]int{1: 3, 3: 1}},
		},
		{
			name: "npu-smi missing gives identity and a note", vendor: Ascend, ids: []int{0, 1}, devDir: ascendDev, npuSmi: missingSmi,
			want: &Inventory{Vendor: Ascend, IDs: []int{0, 1}, DevDir: ascendDev, Logical: map[int]int{0: 0, 1: 1},
				Note: "npu-smi not found at " + missingSmi + ": logical ids taken equal to physical ids"},
		},
		{
			name: "npu-smi failing gives identity and a note", vendor: Ascend, ids: []int{2}, devDir: ascendDev, npuSmi: brokenSmi,
			want: &Inventory{Vendor: Ascend, IDs: []int{2}, DevDir: ascendDev, Logical: map[int]int{2: 2},
				Note: "run " + brokenSmi + " info -m: exit status 3: logical ids taken equal to physical ids"},
		},
		{
			name: "auto finds nvidia", vendor: Auto, devDir: nvidiaDev,
			want: &Inventory{Vendor: NVIDIA, IDs: []int{0, 1}, DevDir: nvidiaDev, Logical: map[int]int{0: 0, 1: 1}},
		},
		{
			name: "fake needs no nodes", vendor: Fake, ids: []int{5, 4}, devDir: emptyDev,
			want: &Inventory{Vendor: Fake, IDs: []int{4, 5}, DevDir: emptyDev, Logical: map[int]int{4: 4, 5: 5}},
		},
		{
			name: "auto with nothing", vendor: Auto, devDir: emptyDev,
			wantErr: "no accelerators found in " + emptyDev + " (looked for davinciN and nvidiaN); set vendor in the config",
		},
		{
			name: "missing node", vendor: Ascend, ids: []int{1, 7}, devDir: ascendDev, npuSmi: smi,
			wantErr: "no npu 7: " + filepath.Join(ascendDev, "davinci7") + " does not exist",
		},
		{
			name: "missing nvidia node", vendor: NVIDIA, ids: []int{2}, devDir: nvidiaDev,
			wantErr: "no gpu 2: " + filepath.Join(nvidiaDev, "nvidia2") + " does not exist",
		},
		{
			name: "fake without ids", vendor: Fake, devDir: emptyDev,
			wantErr: "vendor fake needs its device ids ([devices] ids)",
		},
		{
			name: "unknown vendor", vendor: "amd", devDir: emptyDev,
			wantErr: `unknown vendor "amd" (want ascend, nvidia, fake or auto)`,
		},
		{
			name: "negative id", vendor: Fake, ids: []int{-1}, devDir: emptyDev,
			wantErr: "negative device id -1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Discover(tt.vendor, tt.ids, tt.devDir, tt.npuSmi)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("Discover error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Discover: %v", err)
			}
			want := *tt.want
			want.NPUSmi = tt.npuSmi
			want.Chips = got.Chips // TestDiscoverAscendIDs checks the chips
			if !reflect.DeepEqual(got, &want) {
				t.Errorf("Discover = %+v, want %+v", got, &want)
			}
		})
	}
}

func TestFound(t *testing.T) {
	ascendDev := fakeDev(t, "davinci0", "davinci3", "davinci_manager", "nvidia7")
	nvidiaDev := fakeDev(t, "nvidia1", "nvidia0", "nvidiactl", "nvidia-uvm")
	for _, tt := range []struct {
		vendor Vendor
		dir    string
		want   []int
	}{
		{Auto, ascendDev, []int{0, 3}},
		{Ascend, ascendDev, []int{0, 3}},
		{NVIDIA, ascendDev, []int{7}},
		{Auto, nvidiaDev, []int{0, 1}},
		{Fake, ascendDev, nil},
		{Auto, fakeDev(t), nil},
	} {
		if got := Found(tt.vendor, tt.dir); !slices.Equal(got, tt.want) {
			t.Errorf("Found(%s, %s) = %v, want %v", tt.vendor, tt.dir, got, tt.want)
		}
	}
}

func TestDiscoverNPUSmiInPath(t *testing.T) {
	dev := fakeDev(t, "davinci0", "davinci1", "davinci2", "davinci3")
	smi, _ := fakeNPUSmi(t, sampleRemapped, 0, sampleRemaps)
	t.Setenv("PATH", filepath.Dir(smi)+string(os.PathListSeparator)+os.Getenv("PATH"))
	inv, err := Discover(Ascend, nil, dev, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[int]int{0: 2, 1: 3, 2: 0, 3: 1}; !reflect.DeepEqual(inv.Logical, want) || inv.Note != "" {
		t.Errorf("Logical = %v, Note = %q; want %v and no note", inv.Logical, inv.Note, want)
	}

	t.Setenv("PATH", t.TempDir())
	inv, err = Discover(Ascend, nil, dev, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := "npu-smi not found: logical ids taken equal to physical ids"; inv.Note != want {
		t.Errorf("Note = %q, want %q", inv.Note, want)
	}
}

func TestEnv(t *testing.T) {
	tests := []struct {
		name     string
		inv      Inventory
		physical []int
		want     []string
	}{
		{
			name:     "ascend uses logical ids, ascending",
			inv:      Inventory{Vendor: Ascend, Logical: map[int]int{0: 2, 1: 3, 2: 0, 3: 1}},
			physical: []int{1, 0},
			want:     []string{"NPURUN_DEVICES=0,1", "ASCEND_RT_VISIBLE_DEVICES=2,3"},
		},
		{
			name:     "ascend: NPURUN_DEVICES in the order of the logical ids",
			inv:      Inventory{Vendor: Ascend, Logical: map[int]int{3: 5, 5: 1}},
			physical: []int{3, 5},
			want:     []string{"NPURUN_DEVICES=5,3", "ASCEND_RT_VISIBLE_DEVICES=1,5"},
		},
		{
			name:     "ascend: four devices, entries correspond",
			inv:      Inventory{Vendor: Ascend, Logical: map[int]int{0: 2, 1: 3, 2: 0, 3: 1}},
			physical: []int{3, 2, 1, 0},
			want:     []string{"NPURUN_DEVICES=2,3,0,1", "ASCEND_RT_VISIBLE_DEVICES=0,1,2,3"},
		},
		{
			name:     "fake is identity",
			inv:      Inventory{Vendor: Fake, Logical: map[int]int{3: 3, 5: 5}},
			physical: []int{5, 3},
			want:     []string{"NPURUN_DEVICES=3,5", "ASCEND_RT_VISIBLE_DEVICES=3,5"},
		},
		{
			name:     "nvidia",
			inv:      Inventory{Vendor: NVIDIA},
			physical: []int{1, 0},
			want:     []string{"NPURUN_DEVICES=0,1", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=0,1"},
		},
		{
			name:     "nothing",
			inv:      Inventory{Vendor: Fake},
			physical: nil,
			want:     []string{"NPURUN_DEVICES=", "ASCEND_RT_VISIBLE_DEVICES="},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.inv.Env(tt.physical); !slices.Equal(got, tt.want) {
				t.Errorf("Env(%v) = %q, want %q", tt.physical, got, tt.want)
			}
		})
	}
}

func TestHiddenEnv(t *testing.T) {
	want := []string{"NPURUN_DEVICES=", "ASCEND_RT_VISIBLE_DEVICES=", "CUDA_VISIBLE_DEVICES="}
	if got := HiddenEnv(); !slices.Equal(got, want) {
		t.Errorf("HiddenEnv() = %q, want %q", got, want)
	}
}

func TestNodes(t *testing.T) {
	tests := []struct {
		vendor     Vendor
		wantNodes  []string
		wantShared []string
	}{
		{Ascend, []string{"/d/davinci3"}, []string{"/d/davinci_manager", "/d/devmm_svm", "/d/hisi_hdc"}},
		{NVIDIA, []string{"/d/nvidia3"}, []string{"/d/nvidiactl", "/d/nvidia-uvm"}},
		{Fake, nil, []string{}},
	}
	for _, tt := range tests {
		t.Run(string(tt.vendor), func(t *testing.T) {
			inv := &Inventory{Vendor: tt.vendor, DevDir: "/d"}
			if got := inv.Nodes(3); !slices.Equal(got, tt.wantNodes) {
				t.Errorf("Nodes(3) = %q, want %q", got, tt.wantNodes)
			}
			if got := inv.SharedNodes(); !slices.Equal(got, tt.wantShared) {
				t.Errorf("SharedNodes() = %q, want %q", got, tt.wantShared)
			}
		})
	}
}

func TestParseNPUSmiTable(t *testing.T) {
	type row = [3]int // NPU ID, Chip ID, logic id
	rows := func(chips []Chip) []row {
		var out []row
		for _, c := range chips {
			out = append(out, row{c.NPU, c.Chip, c.Logical})
		}
		return out
	}
	tests := []struct {
		name     string
		out      string
		want     []row
		wantPhys []int // nil: no Phy-ID column
		wantName string
		wantErr  string
	}{
		{
			name: "910B3 host, tab-led rows", out: testdata(t, "npu-smi-m-910b3.txt"),
			want:     []row{{0, 0, 0}, {1, 0, 1}, {2, 0, 2}, {3, 0, 3}, {4, 0, 4}, {5, 0, 5}, {6, 0, 6}, {7, 0, 7}},
			wantName: "Ascend 910B3",
		},
		{
			name: "910C, two dies per card", out: testdata(t, "npu-smi-m-910c.txt"),
			want: []row{{0, 0, 0}, {0, 1, 1}, {1, 0, 2}, {1, 1, 3}, {2, 0, 4}, {2, 1, 5}, {3, 0, 6}, {3, 1, 7},
				{4, 0, 8}, {4, 1, 9}, {5, 0, 10}, {5, 1, 11}, {6, 0, 12}, {6, 1, 13}, {7, 0, 14}, {7, 1, 15}},
			wantName: "Ascend 910C",
		},
		{
			name: "container with cards 8 and 9", out: testdata(t, "npu-smi-m-container.txt"),
			want: []row{{8, 0, 0}, {9, 0, 1}}, wantName: "Ascend 910B3",
		},
		{name: "remapped", out: sampleRemapped, want: []row{{0, 0, 2}, {1, 0, 3}, {2, 0, 0}, {3, 0, 1}}, wantName: "Ascend 910B3"},
		{
			name: "phy-id column",
			out: `NPU ID  Chip ID  Chip Logic ID  Chip Phy-ID  Chip Name
0  0  0  4  Ascend 910
0  1  1  5  Ascend 910
0  2  -  -  Mcu
1  0  2  0  Ascend 910
`,
			want: []row{{0, 0, 0}, {0, 1, 1}, {1, 0, 2}}, wantPhys: []int{4, 5, 0}, wantName: "Ascend 910",
		},
		{name: "N/A logic id skipped", out: "NPU ID Chip ID Chip Logic ID Chip Name\n8 0 N/A 910B\n9 0 0 910B\n", want: []row{{9, 0, 0}}, wantName: "910B"},
		{name: "empty", out: "", wantErr: "no npu-smi table in the output"},
		{name: "garbage", out: "dcmi model initialized failed\n", wantErr: `line 1: want the header "NPU ID  Chip ID  Chip Logic ID ...", got "dcmi model initialized failed"`},
		{
			name: "newer table without a logic id column", out: "NPU ID  Slot ID  Chip ID  Chip Phy-ID  Chip Name\n0 0 0 0 Ascend 950\n",
			wantErr: `line 1: want the header "NPU ID  Chip ID  Chip Logic ID ...", got "NPU ID  Slot ID  Chip ID  Chip Phy-ID  Chip Name"`,
		},
		{name: "header only", out: "NPU ID Chip ID Chip Logic ID Chip Name\n", wantErr: "no chips with a logic id in the npu-smi table"},
		{name: "bad logic id", out: "NPU ID Chip ID Chip Logic ID Chip Name\n0 0 x Ascend\n", wantErr: `line 2: bad Chip Logic ID "x"`},
		{name: "bad npu id", out: "NPU ID Chip ID Chip Logic ID Chip Name\nz 0 0 Ascend\n", wantErr: `line 2: bad NPU ID "z"`},
		{name: "short row", out: "NPU ID Chip ID Chip Logic ID Chip Name\n0 0\n", wantErr: `line 2: want 4 columns, got "0 0"`},
		{name: "duplicate logic id", out: "NPU ID Chip ID Chip Logic ID Chip Name\n0 0 0 A\n1 0 0 A\n", wantErr: "line 3: logical id 0 listed twice"},
		{name: "duplicate phy id", out: "NPU ID Chip ID Chip Logic ID Chip Phy-ID Chip Name\n0 0 0 3 A\n1 0 1 3 A\n", wantErr: "line 3: physical id 3 listed twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chips, hasPhy, err := ParseNPUSmiTable([]byte(tt.out))
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := rows(chips); !slices.Equal(got, tt.want) {
				t.Errorf("chips = %v, want %v", got, tt.want)
			}
			if hasPhy != (tt.wantPhys != nil) {
				t.Errorf("hasPhy = %v, want %v", hasPhy, tt.wantPhys != nil)
			}
			for i, c := range chips {
				if tt.wantPhys != nil && c.Phys != tt.wantPhys[i] || tt.wantPhys == nil && c.Phys != -1 {
					t.Errorf("chip %d: Phys = %d, want %v", i, c.Phys, tt.wantPhys)
				}
				if c.Name != tt.wantName {
					t.Errorf("chip %d: Name = %q, want %q", i, c.Name, tt.wantName)
				}
			}
		})
	}
}

func TestParsePhyIDRemap(t *testing.T) {
	tests := []struct {
		name          string
		out           string
		phys, logical int
		wantErr       string
	}{
		{name: "910B driver", out: testdata(t, "phyid-remap/container-9.txt"), phys: 9, logical: 1},
		{name: "910C die", out: testdata(t, "phyid-remap/910c-13.txt"), phys: 13, logical: 13},
		{name: "Chip Phy-ID spelling", out: "Chip Phy-ID : 4\nChip Logic ID : 2\n", phys: 4, logical: 2},
		{name: "newer driver: no logic id", out: testdata(t, "phyid-remap/v2-0.txt"), wantErr: "no Chip Logic ID in the output"},
		{name: "no physical id", out: "\tChip Logic ID                 :6\n", wantErr: "no Chip Physical ID in the output"},
		{name: "error text", out: "Error: the device 7 does not exist\n", wantErr: "no Chip Physical ID in the output"},
		{name: "not key and value", out: "Usage: npu-smi info <watch|proc|-h|-m|-l|-t type>\nphyid-remap\n", wantErr: `line 2: want "Key : value", got "phyid-remap"`},
		{name: "bad value", out: "\tChip Physical ID              :6\n\tChip Logic ID                 :-1\n", wantErr: `line 2: bad Chip Logic ID "-1"`},
		{name: "twice", out: "Chip Logic ID :1\nChip Logic ID :2\n", wantErr: "line 2: Chip Logic ID given twice"},
		{name: "empty", out: "", wantErr: "no Chip Physical ID in the output"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			phys, logical, err := ParsePhyIDRemap([]byte(tt.out))
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if phys != tt.phys || logical != tt.logical {
				t.Errorf("got %d -> %d, want %d -> %d", phys, logical, tt.phys, tt.logical)
			}
		})
	}
}

// TestDiscoverAscendIDs: where `npu-smi info -m` has no Phy-ID column the
// physical ids come from `npu-smi info -t phyid-remap`, asked for each
// managed device; a listing that skips cards (a container) is mapped right.
func TestDiscoverAscendIDs(t *testing.T) {
	davinci := func(ids ...int) []string {
		var names []string
		for _, id := range ids {
			names = append(names, "davinci"+strconv.Itoa(id))
		}
		return append(names, "davinci_manager", "devmm_svm", "hisi_hdc")
	}
	tests := []struct {
		name      string
		table     string
		remap     map[int]string
		nodes     []int
		ids       []int // managed; nil: all nodes
		want      map[int]int
		wantCard  map[int]int // nil: not checked
		wantNote  string      // substring; "" for none
		wantCalls []string
	}{
		{
			name: "910B3 host", table: testdata(t, "npu-smi-m-910b3.txt"), remap: remapFixtures(t, "910b3", seq(0, 7)...),
			nodes: seq(0, 7), want: map[int]int{0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6, 7: 7},
		},
		{
			name: "910C, a subset of the dies", table: testdata(t, "npu-smi-m-910c.txt"), remap: remapFixtures(t, "910c", seq(0, 15)...),
			nodes: seq(0, 15), ids: []int{3, 12, 13}, want: map[int]int{3: 3, 12: 12, 13: 13}, wantCard: map[int]int{3: 1, 12: 6, 13: 6},
			wantCalls: []string{"info_-m", "info_-t_phyid-remap_-p_3", "info_-t_phyid-remap_-p_12", "info_-t_phyid-remap_-p_13"},
		},
		{
			name: "container with cards 8 and 9", table: testdata(t, "npu-smi-m-container.txt"), remap: remapFixtures(t, "container", 8, 9),
			nodes: []int{8, 9}, want: map[int]int{8: 0, 9: 1}, wantCard: map[int]int{8: 8, 9: 9},
			wantCalls: []string{"info_-m", "info_-t_phyid-remap_-p_8", "info_-t_phyid-remap_-p_9"},
		},
		{
			name: "remapped host", table: sampleRemapped, remap: sampleRemaps,
			nodes: seq(0, 3), want: map[int]int{0: 2, 1: 3, 2: 0, 3: 1},
		},
		{
			name: "a failed card: the listing skips it, phyid-remap does not", table: "NPU ID Chip ID Chip Logic ID Chip Name\n0 0 0 Ascend 910B3\n2 0 1 Ascend 910B3\n",
			remap: map[int]string{0: remapOut(0, 0, 0, 0), 2: remapOut(2, 1, 2, 0)},
			nodes: []int{0, 1, 2}, ids: []int{0, 2}, want: map[int]int{0: 0, 2: 1},
		},
		{
			name: "no phyid-remap: container nodes matched in listing order", table: testdata(t, "npu-smi-m-container.txt"),
			nodes: []int{8, 9}, want: map[int]int{8: 0, 9: 1},
			wantNote: "logical ids taken from",
		},
		{
			name: "no phyid-remap and a node the listing lacks: identity", table: "NPU ID Chip ID Chip Logic ID Chip Name\n0 0 0 Ascend 910B3\n2 0 1 Ascend 910B3\n",
			nodes: []int{0, 1, 2}, want: map[int]int{0: 0, 1: 1, 2: 2},
			wantNote: "info -m lists 2 chips and ",
		},
		{
			name: "phyid-remap answers for another device", table: testdata(t, "npu-smi-m-container.txt"),
			remap: map[int]string{8: remapOut(9, 1, 9, 0), 9: remapOut(9, 1, 9, 0)},
			nodes: []int{8, 9}, want: map[int]int{8: 0, 9: 1},
			wantNote: "it answers for physical id 9",
		},
		{
			name: "phyid-remap names a logic id npu-smi -m does not list", table: testdata(t, "npu-smi-m-container.txt"),
			remap: map[int]string{8: remapOut(8, 5, 8, 0), 9: remapOut(9, 1, 9, 0)},
			nodes: []int{8, 9}, want: map[int]int{8: 0, 9: 1},
			wantNote: "logical id 5 is not in",
		},
		{
			name: "Phy-ID column: no phyid-remap asked", table: "NPU ID  Chip ID  Chip Logic ID  Chip Phy-ID  Chip Name\n8 0 0 8 Ascend 910B3\n9 0 1 9 Ascend 910B3\n",
			nodes: []int{8, 9}, want: map[int]int{8: 0, 9: 1}, wantCalls: []string{"info_-m"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dev := fakeDev(t, davinci(tt.nodes...)...)
			smi, calls := fakeNPUSmi(t, tt.table, 0, tt.remap)
			inv, err := Discover(Ascend, tt.ids, dev, smi)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(inv.Logical, tt.want) {
				t.Errorf("Logical = %v, want %v (note %q)", inv.Logical, tt.want, inv.Note)
			}
			if tt.wantCard != nil {
				card := map[int]int{}
				for phys, c := range inv.Chips {
					card[phys] = c.NPU
					if back, ok := inv.physicalOf(c.NPU, c.Chip); !ok || back != phys {
						t.Errorf("physicalOf(%d, %d) = %d, %v; want %d", c.NPU, c.Chip, back, ok, phys)
					}
				}
				if !reflect.DeepEqual(card, tt.wantCard) {
					t.Errorf("cards = %v, want %v", card, tt.wantCard)
				}
			}
			switch {
			case tt.wantNote == "" && inv.Note != "":
				t.Errorf("Note = %q, want none", inv.Note)
			case !strings.Contains(inv.Note, tt.wantNote):
				t.Errorf("Note = %q, want it to contain %q", inv.Note, tt.wantNote)
			}
			if tt.wantCalls != nil && !slices.Equal(calls(), tt.wantCalls) {
				t.Errorf("npu-smi calls = %q, want %q", calls(), tt.wantCalls)
			}
		})
	}
}

func TestParseIDs(t *testing.T) {
	tests := []struct {
		in      string
		want    []int
		wantErr string
	}{
		{in: "0", want: []int{0}},
		{in: "0-3,8", want: []int{0, 1, 2, 3, 8}},
		{in: " 8, 0-2 ,1", want: []int{0, 1, 2, 8}},
		{in: "3-3", want: []int{3}},
		{in: "", wantErr: "no device ids"},
		{in: "x", wantErr: `"x" is not a device id`},
		{in: "1,,2", wantErr: "empty item between commas"},
		{in: "-1", wantErr: `negative device id "-1"`},
		{in: "3-1", wantErr: `range "3-1" runs backwards`},
		{in: "1-x", wantErr: `"1-x" is not a range of device ids`},
		{in: "0-3-5", wantErr: `"0-3-5" is not a range of device ids`},
		{in: "+1", wantErr: `"+1" is not a device id`},
		{in: "0-4096", wantErr: "more than 4096 device ids"},
		{in: "0-4095", want: seq(0, 4095)},
		{in: "99999999999999999999999", wantErr: `"99999999999999999999999" is not a device id`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseIDs(tt.in)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("ParseIDs(%q) error = %v, want %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Errorf("ParseIDs(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestVendorFormat(t *testing.T) {
	tests := []struct {
		vendor Vendor
		ids    []int
		want   string
	}{
		{Ascend, []int{5, 0, 1, 2, 3}, "npu 0-3,5"},
		{Fake, []int{1}, "npu 1"},
		{NVIDIA, []int{0, 1, 2, 3, 5}, "gpu 0-3,5"},
		{NVIDIA, []int{2}, "gpu 2"},
		{Unknown, []int{2}, "device 2"},
		{Unknown, []int{2, 3, 3}, "devices 2-3"},
	}
	for _, tt := range tests {
		if got := tt.vendor.Format(tt.ids); got != tt.want {
			t.Errorf("Vendor(%q).Format(%v) = %q, want %q", tt.vendor, tt.ids, got, tt.want)
		}
	}
}

func TestFormatIDs(t *testing.T) {
	tests := []struct {
		ids  []int
		want string
	}{
		{nil, ""},
		{[]int{0}, "0"},
		{[]int{0, 1, 2, 3, 8}, "0-3,8"},
		{[]int{8, 3, 2, 1, 0, 10, 11, 3}, "0-3,8,10-11"},
		{[]int{1, 3, 5}, "1,3,5"},
		{[]int{4, 5}, "4-5"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			got := FormatIDs(tt.ids)
			if got != tt.want {
				t.Errorf("FormatIDs(%v) = %q, want %q", tt.ids, got, tt.want)
			}
		})
	}
}

func seq(a, b int) []int {
	var s []int
	for i := a; i <= b; i++ {
		s = append(s, i)
	}
	return s
}
