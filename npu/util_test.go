package npu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestParseNPUSmiUsages reads every layout and key alias of npu-smi info
// -t usages seen (../shared/vendor-utilization.md), and refuses an answer
// with no compute figure: such a device's utilization is unknown.
func TestParseNPUSmiUsages(t *testing.T) {
	for _, tt := range []struct {
		file        string
		pct         float64
		used, total int64
		wantErr     string
	}{
		{"910b-hbm.txt", 0, 1966, 65536, ""},     // 3% of 65536
		{"910b-busy.txt", 97, 30147, 65536, ""},  // Aicore, the busiest
		{"310-ddr.txt", 12, 776, 7759, ""},       // AI Core alias; Memory Usage Rate of Memory Capacity
		{"new-driver.txt", 55, 30120, 65536, ""}, // AICore NA: NPU Utilization; HBM Usage(MB)
		{"950-abridged.txt", 7, -1, -1, ""},      // Aivector busier than Aicore; no memory printed
		{"realtime.txt", 81, 1024, 32768, ""},    // NPU Real-time Utilization, HBM Used(MB)
		{"chip-usage.txt", 0, 1024, 4096, ""},    // Chip Usage Rate; DDR
		{"no-compute.txt", 0, 0, 0, "no compute utilization"},
		{"error.txt", 0, 0, 0, "no compute utilization"},
	} {
		out, err := os.ReadFile(filepath.Join("testdata", "usages", tt.file))
		if err != nil {
			t.Fatal(err)
		}
		u, err := ParseNPUSmiUsages(out)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: got %+v, %v; want error %q", tt.file, u, err, tt.wantErr)
			}
			continue
		}
		if err != nil || u != (Util{tt.pct, tt.used, tt.total}) {
			t.Errorf("%s: got %+v, %v; want %v%% %d/%d MiB", tt.file, u, err, tt.pct, tt.used, tt.total)
		}
	}
}

// TestParseGPUUtil reads nvidia-smi's csv by minor number; [N/A] and
// [Not Supported] utilization is unknown, such memory -1.
func TestParseGPUUtil(t *testing.T) {
	out := "0, 97, 30120, 81559\n1, 0, 4, 81559\n2, [N/A], 0, 81559\n3, [Not Supported], [N/A], [N/A]\n7, 12, [N/A], [N/A]\ngarbage\n"
	got, bad := ParseGPUUtil([]byte(out))
	want := map[int]Util{0: {97, 30120, 81559}, 1: {0, 4, 81559}, 7: {12, -1, -1}}
	if len(got) != len(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("gpu %d: got %+v, want %+v", id, got[id], w)
		}
	}
	if bad[2] != "[N/A]" || bad[3] != "[Not Supported]" || len(bad) != 2 {
		t.Errorf("bad = %v", bad)
	}
}

// TestUtilizationTools runs fake npu-smi and nvidia-smi programs that
// print the real tools' layouts, one that fails and one that hangs: the
// devices they did not answer for are in errs, the others read.
func TestUtilizationTools(t *testing.T) {
	dir := t.TempDir()
	script := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	busy, _ := filepath.Abs(filepath.Join("testdata", "usages", "910b-busy.txt"))
	idle, _ := filepath.Abs(filepath.Join("testdata", "usages", "910b-hbm.txt"))
	// Card 1 answers busy, card 0 idle, card 2 fails: -i CARD -c CHIP.
	npuSmi := script("npu-smi", `[ "$1 $2 $3 $4 $6 $7" = "info -t usages -i -c 0" ] || exit 2
case $5 in 0) cat `+idle+`;; 1) cat `+busy+`;; *) echo "Error: no such card" >&2; exit 3;; esac
`)
	inv := &Inventory{Vendor: Ascend, IDs: []int{0, 1, 2}, NPUSmi: npuSmi, Logical: map[int]int{0: 0, 1: 1, 2: 2}}
	got, errs := inv.Utilization(context.Background(), inv.IDs, Tools{})
	if got[0].Percent != 0 || got[1].Percent != 97 || len(got) != 2 || errs[2] == nil || !strings.Contains(errs[2].Error(), "no such card") || errors.Is(errs[2], ErrNoTool) {
		t.Errorf("ascend: got %+v, errs %v", got, errs)
	}
	// A chip map: device 5 is card 2's chip 1.
	inv.Chips = map[int]Chip{5: {NPU: 2, Chip: 1}}
	inv.NPUSmi = script("npu-smi-chips", `[ "$5 $7" = "2 1" ] && cat `+busy+`
`)
	if got, errs := inv.Utilization(context.Background(), []int{5}, Tools{}); got[5].Percent != 97 || len(errs) != 0 {
		t.Errorf("ascend chip map: got %+v, errs %v", got, errs)
	}

	nv := &Inventory{Vendor: NVIDIA, IDs: []int{0, 1, 3}}
	smi := script("nvidia-smi", `[ "$1" = "--query-gpu=minor_number,utilization.gpu,memory.used,memory.total" ] || exit 2
printf '0, 97, 30120, 81559\n1, [N/A], 0, 81559\n'
`)
	got, errs = nv.Utilization(context.Background(), nv.IDs, Tools{NVIDIASmi: smi})
	if got[0].Percent != 97 || len(got) != 1 || errs[1] == nil || errs[3] == nil || !strings.Contains(errs[3].Error(), "not in") {
		t.Errorf("nvidia: got %+v, errs %v", got, errs)
	}
	// A hung tool: every device unknown once the round's time is up.
	hang := script("hang", "exec sleep 60\n")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	got, errs = nv.Utilization(ctx, nv.IDs, Tools{NVIDIASmi: hang})
	if len(got) != 0 || len(errs) != 3 || !strings.Contains(errs[0].Error(), "no answer in time") {
		t.Errorf("hung nvidia-smi: got %+v, errs %v", got, errs)
	}
	// No tool at all: ErrNoTool for every device.
	for _, bin := range []string{filepath.Join(dir, "none"), "no-such-npu-smi"} {
		inv.NPUSmi = bin
		got, errs = inv.Utilization(context.Background(), inv.IDs, Tools{})
		if len(got) != 0 || len(errs) != 3 || !errors.Is(errs[0], ErrNoTool) || !errors.Is(errs[2], ErrNoTool) {
			t.Errorf("npu-smi %s missing: got %+v, errs %v; want ErrNoTool for all", bin, got, errs)
		}
	}
	if _, errs = nv.Utilization(context.Background(), nv.IDs, Tools{NVIDIASmi: filepath.Join(dir, "none")}); !errors.Is(errs[1], ErrNoTool) {
		t.Errorf("nvidia-smi missing: errs %v; want ErrNoTool", errs)
	}
	inv.Chips, inv.NPUSmi = nil, hang
	got, errs = inv.Utilization(ctx, inv.IDs, Tools{})
	if len(got) != 0 || len(errs) != 3 {
		t.Errorf("hung npu-smi: got %+v, errs %v", got, errs)
	}
}

// TestReadFakeUtil: the fake vendor's file per device, "UTIL [USED
// TOTAL]"; missing or unparsable is unknown.
func TestReadFakeUtil(t *testing.T) {
	dir := t.TempDir()
	write := func(id, s string) {
		if err := os.WriteFile(filepath.Join(dir, "npu"+id), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("0", "97 30120 65536\n")
	write("1", "3\n")
	write("2", "lots\n")
	write("3", "101\n")
	inv := &Inventory{Vendor: Fake, IDs: []int{0, 1, 2, 3, 4}}
	got, errs := inv.Utilization(context.Background(), inv.IDs, Tools{FakeUtilDir: dir})
	if got[0] != (Util{97, 30120, 65536}) || got[1] != (Util{3, -1, -1}) || len(got) != 2 || len(errs) != 3 {
		t.Errorf("got %+v, errs %v", got, errs)
	}
	if _, errs := inv.Utilization(context.Background(), inv.IDs, Tools{}); len(errs) != 5 {
		t.Errorf("no directory: errs %v, want all unknown", errs)
	}
	// NaN (strconv reads "nan"), a FIFO (the sampler would wait on it for
	// ever) and a link are unknown, not figures.
	write("5", "nan\n")
	if err := unix.Mkfifo(filepath.Join(dir, "npu6"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "npu1"), filepath.Join(dir, "npu7")); err != nil {
		t.Fatal(err)
	}
	odd := &Inventory{Vendor: Fake, IDs: []int{5, 6, 7}}
	if got, errs := odd.Utilization(context.Background(), odd.IDs, Tools{FakeUtilDir: dir}); len(got) != 0 || len(errs) != 3 {
		t.Errorf("nan, a FIFO, a link: got %+v, errs %v; want all unknown", got, errs)
	}
	if _, ok := parsePercent("NaN", 100); ok {
		t.Error("parsePercent takes NaN")
	}
}
