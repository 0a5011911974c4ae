package npu

import (
	"os"
	"slices"
	"testing"
)

func TestParseNPUSmiProcesses(t *testing.T) {
	out, err := os.ReadFile("testdata/npu-smi-info-910b.txt")
	if err != nil {
		t.Fatal(err)
	}
	got := ParseNPUSmiProcesses(out)
	want := []ProcMem{{Device: 0, PID: 4121, MiB: 9800}, {Device: 0, PID: 5120, MiB: 3378}}
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
	if got := ParseNPUSmiHBM(out); len(got) != 2 || got[0] != 65536 || got[1] != 65536 {
		t.Fatalf("ParseNPUSmiHBM = %v, want npu 0 and 1 of 65536 MiB", got)
	}
}
