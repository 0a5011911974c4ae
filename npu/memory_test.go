package npu

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseNPUSmiProcesses(t *testing.T) {
	out, err := os.ReadFile("testdata/npu-smi-info-910b.txt")
	if err != nil {
		t.Fatal(err)
	}
	got := ParseNPUSmiProcesses(out)
	want := []ProcMem{{Device: -1, Chip: ChipID{0, 0}, PID: 4121, MiB: 9800}, {Device: -1, Chip: ChipID{0, 0}, PID: 5120, MiB: 3378}}
	if !slices.Equal(got, want) {
		t.Fatalf("ParseNPUSmiProcesses = %+v, want %+v", got, want)
	}
}

func TestParseComputeApps(t *testing.T) {
	got := ParseComputeApps([]byte("4121, 9800\n5120, 15462\nbad line\n"))
	want := []ProcMem{{Device: -1, PID: 4121, MiB: 9800}, {Device: -1, PID: 5120, MiB: 15462}}
	if !slices.Equal(got, want) {
		t.Fatalf("ParseComputeApps = %+v, want %+v", got, want)
	}
	if m := ParseGPUMemory([]byte("0, 81559\n1, 81559\n")); m[0] != 81559 || m[1] != 81559 || len(m) != 2 {
		t.Fatalf("ParseGPUMemory = %v", m)
	}
}

func TestParseNPUSmiHBM(t *testing.T) {
	out, err := os.ReadFile("testdata/npu-smi-info-910b.txt")
	if err != nil {
		t.Fatal(err)
	}
	if got := ParseNPUSmiHBM(out); len(got) != 2 || got[ChipID{0, 0}] != 65536 || got[ChipID{1, 0}] != 65536 {
		t.Fatalf("ParseNPUSmiHBM = %v, want npu 0 and 1 of 65536 MiB", got)
	}
}

// TestMemoryByChip: on an Ascend node whose npu-smi info -m said which
// chip each davinci node is (Chips), npu-smi info's HBM totals and
// processes, named by card and chip, land on the physical ids: card 6's
// chip 1 is davinci2 here, not device 6; a chip the map does not know is
// no device. On NVIDIA the devices are nvidia-smi's minor numbers.
func TestMemoryByChip(t *testing.T) {
	dir := t.TempDir()
	info := `| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 6     910C                | OK            | 96.5        40                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          13178/ 65536         |
| 1                         | 0000:C1:00.0  | 0           0    / 0          13178/ 32768         |
+===========================+===============+====================================================+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| 6       1                 | 4121          | python                   | 9800                    |
| 7       0                 | 5120          | python                   | 100                     |
`
	smi := filepath.Join(dir, "npu-smi")
	if err := os.WriteFile(filepath.Join(dir, "info"), []byte(info), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(smi, []byte("#!/bin/sh\nexec cat "+filepath.Join(dir, "info")+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	inv := &Inventory{Vendor: Ascend, NPUSmi: smi, Chips: map[int]Chip{1: {NPU: 6, Chip: 0}, 2: {NPU: 6, Chip: 1}}}
	if m, err := inv.Memory(Tools{}); err != nil || len(m) != 2 || m[1] != 65536 || m[2] != 32768 {
		t.Errorf("Memory = %v, %v; want davinci1 65536 and davinci2 32768 MiB", m, err)
	}
	if m, err := (&Inventory{Vendor: Ascend, NPUSmi: filepath.Join(dir, "missing")}).Memory(Tools{}); m != nil || err == nil {
		t.Errorf("Memory with its tool missing = %v, %v; want nil and the error", m, err)
	}
	procs, ok, err := inv.ProcessMemory(Tools{})
	if !ok || err != nil || len(procs) != 2 || procs[0].Device != 2 || procs[0].PID != 4121 || procs[1].Device != -1 {
		t.Errorf("ProcessMemory = %+v, %v, %v; want pid 4121 on davinci2 and pid 5120 on no device of ours", procs, ok, err)
	}

	nv := filepath.Join(dir, "nvidia-smi")
	if err := os.WriteFile(nv, []byte("#!/bin/sh\necho \"$@\" > "+filepath.Join(dir, "args")+"\nprintf '3, 81559\\n1, 40960\\n'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	gpus := &Inventory{Vendor: NVIDIA}
	if m, err := gpus.Memory(Tools{NVIDIASmi: nv}); err != nil || len(m) != 2 || m[3] != 81559 || m[1] != 40960 {
		t.Errorf("NVIDIA Memory = %v, %v", m, err)
	}
	if args, _ := os.ReadFile(filepath.Join(dir, "args")); !strings.Contains(string(args), "--query-gpu=minor_number,memory.total") {
		t.Errorf("nvidia-smi asked %q, want the minor numbers", args)
	}
}
