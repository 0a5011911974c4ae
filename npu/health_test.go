package npu

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseNPUSmiHealth(t *testing.T) {
	for _, c := range []struct {
		name, out string
		bad       bool
		words     string
		err       bool
	}{
		{name: "ok", out: "        Health Status                  : OK\n        Error Code                     : NA\n        Error Information              : NA\n"},
		{name: "older driver", out: "\tHealth                         : OK\n"},
		{name: "warning", out: "        Health Status                  : Warning\n        Error Code                     : 80CD8008\n",
			words: "Health Status: Warning; Error Code: 80CD8008"},
		{name: "critical", bad: true,
			out:   "        Health Status                  : Critical\n        Error Code                     : 80E01801\n        Error Information              : node type=HBM, sensor type=Memory, event state=uncorrectable ECC: multi-bit\n",
			words: "Health Status: Critical; Error Code: 80E01801; Error Information: node type=HBM, sensor type=Memory, event state=uncorrectable ECC: multi-bit"},
		{name: "alarm", out: "Health Status : Alarm\n", bad: true, words: "Health Status: Alarm"},
		{name: "no health line", out: "Error Code : NA\n", err: true},
		{name: "empty", out: "", err: true},
	} {
		h, err := ParseNPUSmiHealth([]byte(c.out))
		if c.err {
			if err == nil {
				t.Errorf("%s: parsed %+v, want an error", c.name, h)
			}
			continue
		}
		if err != nil || h.Unhealthy != c.bad || h.Words != c.words {
			t.Errorf("%s: got %+v, %v; want unhealthy %v, words %q", c.name, h, err, c.bad, c.words)
		}
	}
}

func TestParseNVIDIAHealth(t *testing.T) {
	out := "0, 0, No\n1, 3, No\n2, [N/A], [N/A]\n4, 0, Yes\n" +
		"Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.  Reboot the system to recover this GPU\n"
	got, err := ParseNVIDIAHealth([]byte(out), []int{0, 1, 2, 3, 4})
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]bool{0: false, 1: true, 2: false, 3: true, 4: true}
	for id, bad := range want {
		if got[id].Unhealthy != bad {
			t.Errorf("gpu %d: %+v, want unhealthy %v", id, got[id], bad)
		}
	}
	if !strings.Contains(got[1].Words, "3 uncorrected ECC") || !strings.Contains(got[3].Words, "GPU is lost") || !strings.Contains(got[4].Words, "retired page") {
		t.Errorf("words: %q, %q, %q", got[1].Words, got[3].Words, got[4].Words)
	}
	if _, err := ParseNVIDIAHealth([]byte("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"), []int{0}); err == nil || !strings.Contains(err.Error(), "couldn't communicate") {
		t.Errorf("an answer with no GPU: %v, want an error quoting it", err)
	}
}

func TestReadFakeHealth(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "health")
	got, err := ReadFakeHealth(path, []int{0, 1})
	if err != nil || got[0].Unhealthy || got[1].Unhealthy || len(got) != 2 {
		t.Fatalf("no file: %+v, %v; want both healthy", got, err)
	}
	if err := os.WriteFile(path, []byte("# test\n0 OK\nnpu1 Critical HBM ECC errors\n7 Critical not ours\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err = ReadFakeHealth(path, []int{0, 1})
	if err != nil || got[0].Unhealthy || !got[1].Unhealthy || got[1].Words != "Health Status: Critical; HBM ECC errors" {
		t.Fatalf("got %+v, %v", got, err)
	}
	if err := os.WriteFile(path, []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFakeHealth(path, []int{0, 1}); err == nil || !strings.Contains(err.Error(), path+":1") {
		t.Errorf("a malformed line: %v, want an error naming %s:1", err, path)
	}
}

// TestCheckHealthAscend runs a fake npu-smi: one run per card, the card
// from the chip table, a card's answer for each of its chips; a card
// whose npu-smi run fails or hangs is an error for its devices, not a
// finding.
func TestCheckHealthAscend(t *testing.T) {
	dir := t.TempDir()
	smi := filepath.Join(dir, "npu-smi")
	script := `#!/bin/sh
echo "$@" >> ` + filepath.Join(dir, "calls") + `
case "$5" in
0) printf '\tHealth Status : OK\n\tError Code : NA\n' ;;
1) printf '\tHealth Status : Critical\n\tError Code : 80E01801\n' ;;
2) echo "card 2 is gone" >&2; exit 3 ;;
3) exec sleep 60 ;;
esac
`
	if err := os.WriteFile(smi, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	inv := &Inventory{Vendor: Ascend, Logical: map[int]int{0: 0, 1: 1, 4: 2, 5: 3, 6: 4},
		Chips: map[int]Chip{0: {NPU: 0}, 1: {NPU: 1}, 4: {NPU: 1, Chip: 1}, 5: {NPU: 2}, 6: {NPU: 3}}, NPUSmi: smi}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	got, errs := inv.CheckHealth(ctx, []int{0, 1, 4, 5, 6}, Tools{})
	if got[0].Unhealthy || !got[1].Unhealthy || !got[4].Unhealthy || got[1].Words != "Health Status: Critical; Error Code: 80E01801" {
		t.Errorf("answers: %+v", got)
	}
	if errs[5] == nil || !strings.Contains(errs[5].Error(), "card 2 is gone") || errs[6] == nil || !strings.Contains(errs[6].Error(), "in time") {
		t.Errorf("errors: %v", errs)
	}
	if _, ok := got[5]; ok {
		t.Errorf("a failed run was taken for an answer: %+v", got[5])
	}
	calls, _ := os.ReadFile(filepath.Join(dir, "calls"))
	if strings.Count(string(calls), "-i 1") != 1 {
		t.Errorf("card 1 (two chips) was asked %d times, want once:\n%s", strings.Count(string(calls), "-i 1"), calls)
	}
}
