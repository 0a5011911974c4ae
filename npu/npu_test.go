package npu

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
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

// fakeNPUSmi writes a shell script that prints out and exits with code.
func fakeNPUSmi(t *testing.T, out string, code int) string {
	t.Helper()
	dir := t.TempDir()
	p := filepath.Join(dir, "npu-smi")
	script := "#!/bin/sh\n[ \"$1 $2\" = \"info -m\" ] || exit 9\ncat <<'END'\n" + out + "END\nexit " + strconv.Itoa(code) + "\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
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

func TestDiscover(t *testing.T) {
	ascendDev := fakeDev(t, "davinci0", "davinci1", "davinci2", "davinci3", "davinci_manager", "devmm_svm", "hisi_hdc")
	nvidiaDev := fakeDev(t, "nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm")
	emptyDev := fakeDev(t)
	smi := fakeNPUSmi(t, sampleRemapped, 0)
	brokenSmi := fakeNPUSmi(t, "", 3)
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
			wantErr: "discover ascend device 7: " + filepath.Join(ascendDev, "davinci7") + " does not exist",
		},
		{
			name: "missing nvidia node", vendor: NVIDIA, ids: []int{2}, devDir: nvidiaDev,
			wantErr: "discover nvidia device 2: " + filepath.Join(nvidiaDev, "nvidia2") + " does not exist",
		},
		{
			name: "fake without ids", vendor: Fake, devDir: emptyDev,
			wantErr: "discover fake devices: ids must be given for vendor fake",
		},
		{
			name: "unknown vendor", vendor: "amd", devDir: emptyDev,
			wantErr: `discover devices: unknown vendor "amd" (want ascend, nvidia, fake or auto)`,
		},
		{
			name: "negative id", vendor: Fake, ids: []int{-1}, devDir: emptyDev,
			wantErr: "discover fake devices: negative device id -1",
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
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Discover = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestDiscoverNPUSmiInPath(t *testing.T) {
	dev := fakeDev(t, "davinci0", "davinci1", "davinci2", "davinci3")
	smi := fakeNPUSmi(t, sampleRemapped, 0)
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
			name:     "ascend logical order differs from physical order",
			inv:      Inventory{Vendor: Ascend, Logical: map[int]int{3: 5, 5: 1}},
			physical: []int{3, 5},
			want:     []string{"NPURUN_DEVICES=3,5", "ASCEND_RT_VISIBLE_DEVICES=1,5"},
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

func TestParseNPUSmiMap(t *testing.T) {
	tests := []struct {
		name    string
		out     string
		want    map[int]int
		wantErr string
	}{
		{
			name: "910B3 identity",
			out: `	NPU ID                         Chip ID                        Chip Logic ID                  Chip Name
	0                              0                              0                              Ascend 910B3
	0                              1                              -                              Mcu
	1                              0                              1                              Ascend 910B3
	1                              1                              -                              Mcu
`,
			want: map[int]int{0: 0, 1: 1},
		},
		{name: "remapped", out: sampleRemapped, want: map[int]int{0: 2, 1: 3, 2: 0, 3: 1}},
		{
			name: "phy-id column",
			out: `NPU ID  Chip ID  Chip Logic ID  Chip Phy-ID  Chip Name
0  0  0  4  Ascend 910
0  1  1  5  Ascend 910
0  2  -  -  Mcu
1  0  2  0  Ascend 910
`,
			want: map[int]int{4: 0, 5: 1, 0: 2},
		},
		{name: "N/A logic id skipped", out: "NPU ID Chip ID Chip Logic ID Chip Name\n8 0 N/A 910B\n9 0 0 910B\n", want: map[int]int{0: 0}},
		{name: "empty", out: "", wantErr: "no npu-smi table in the output"},
		{name: "garbage", out: "dcmi model initialized failed\n", wantErr: `line 1: want the header "NPU ID  Chip ID  Chip Logic ID ...", got "dcmi model initialized failed"`},
		{name: "header only", out: "NPU ID Chip ID Chip Logic ID Chip Name\n", wantErr: "no chips with a logic id in the npu-smi table"},
		{name: "bad logic id", out: "NPU ID Chip ID Chip Logic ID Chip Name\n0 0 x Ascend\n", wantErr: `line 2: bad Chip Logic ID "x"`},
		{name: "bad npu id", out: "NPU ID Chip ID Chip Logic ID Chip Name\nz 0 0 Ascend\n", wantErr: `line 2: bad NPU ID "z"`},
		{name: "short row", out: "NPU ID Chip ID Chip Logic ID Chip Name\n0 0\n", wantErr: `line 2: want 4 columns, got "0 0"`},
		{name: "duplicate logic id", out: "NPU ID Chip ID Chip Logic ID Chip Name\n0 0 0 A\n1 0 0 A\n", wantErr: "line 3: logical id 0 listed twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseNPUSmiMap([]byte(tt.out))
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
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
