package npu

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// ParseNPUSmiMap parses the output of `npu-smi info -m` into a map from
// physical device id (the N of /dev/davinciN) to the logical id the CANN
// runtime uses in ASCEND_RT_VISIBLE_DEVICES.
//
// The table has the columns NPU ID, Chip ID, Chip Logic ID, an optional
// Chip Phy-ID (newer drivers), and Chip Name. Rows whose logic id is not a
// number ("-" or "N/A", such as the Mcu of each card) are not compute chips
// and are skipped.
//
// When the Chip Phy-ID column is present it gives the physical id. When it
// is absent we assume what holds on 910B machines: the driver creates
// /dev/davinciN for the compute chips in the order npu-smi enumerates them
// (by NPU ID, then Chip ID), so the k-th compute row, counting from 0, is
// physical device k. Where that assumption is wrong, `npu-smi info -t
// phyid-remap -p N` is the authority.
func ParseNPUSmiMap(out []byte) (map[int]int, error) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	lineNo, header, hasPhy := 0, false, false
	m := make(map[int]int)
	seenLogical := make(map[int]int)
	k := 0
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if !header {
			if strings.Contains(line, "NPU ID") && strings.Contains(line, "Chip Logic ID") {
				header = true
				hasPhy = strings.Contains(line, "Phy-ID") || strings.Contains(line, "Phy ID")
				continue
			}
			return nil, fmt.Errorf("line %d: want the header \"NPU ID  Chip ID  Chip Logic ID ...\", got %q", lineNo, line)
		}
		f := strings.Fields(line)
		want := 4
		if hasPhy {
			want = 5
		}
		if len(f) < want {
			return nil, fmt.Errorf("line %d: want %d columns, got %q", lineNo, want, line)
		}
		if _, err := strconv.Atoi(f[0]); err != nil {
			return nil, fmt.Errorf("line %d: bad NPU ID %q", lineNo, f[0])
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			return nil, fmt.Errorf("line %d: bad Chip ID %q", lineNo, f[1])
		}
		if f[2] == "-" || f[2] == "N/A" {
			continue
		}
		logical, err := strconv.Atoi(f[2])
		if err != nil || logical < 0 {
			return nil, fmt.Errorf("line %d: bad Chip Logic ID %q", lineNo, f[2])
		}
		phys := k
		if hasPhy {
			if phys, err = strconv.Atoi(f[3]); err != nil || phys < 0 {
				return nil, fmt.Errorf("line %d: bad Chip Phy-ID %q", lineNo, f[3])
			}
		}
		k++
		if _, dup := m[phys]; dup {
			return nil, fmt.Errorf("line %d: physical id %d listed twice", lineNo, phys)
		}
		if _, dup := seenLogical[logical]; dup {
			return nil, fmt.Errorf("line %d: logical id %d listed twice", lineNo, logical)
		}
		m[phys] = logical
		seenLogical[logical] = phys
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !header {
		return nil, fmt.Errorf("no npu-smi table in the output")
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("no chips with a logic id in the npu-smi table")
	}
	return m, nil
}
