package npu

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Chip is one compute chip (a die) as `npu-smi info -m` lists it.
type Chip struct {
	NPU     int    // NPU ID: the card
	Chip    int    // Chip ID: the chip on the card
	Logical int    // Chip Logic ID: the CANN runtime's id
	Phys    int    // Chip Phy-ID: the N of /dev/davinciN; -1 where the table has no such column
	Name    string // Chip Name, such as "Ascend 910B3"
}

// The columns of `npu-smi info -m` that ParseNPUSmiTable knows. Drivers
// differ in which they print: all have NPU ID, Chip ID and Chip Name; most
// have Chip Logic ID; newer ones add Chip Phy-ID (and some Slot ID).
var npuSmiColumns = []string{"NPU ID", "Slot ID", "Chip ID", "Chip Logic ID", "Chip Phy-ID", "Chip Name"}

// ParseNPUSmiTable parses the output of `npu-smi info -m` into its compute
// chips, in listing order, and tells whether the table gives their
// physical ids (a Chip Phy-ID column).
//
// Rows whose logic id is not a number ("-" or "N/A", such as the Mcu of
// each card) are not compute chips and are left out. Rows may be led by
// spaces or tabs, and the chip name may hold spaces.
//
// Without a Chip Phy-ID column the table does not say which /dev/davinciN
// a chip is: the listing skips cards a container cannot see or that have
// failed, so the k-th row is not /dev/davincik in general. Ask
// `npu-smi info -t phyid-remap -p N` (ParsePhyIDRemap) for each device.
func ParseNPUSmiTable(out []byte) ([]Chip, bool, error) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	lineNo := 0
	var cols []string // the header's columns, in order
	var chips []Chip
	seenLogical := make(map[int]int)
	seenPhys := make(map[int]int)
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if cols == nil {
			cols = headerColumns(line)
			if !slices.Contains(cols, "NPU ID") || !slices.Contains(cols, "Chip ID") || !slices.Contains(cols, "Chip Logic ID") {
				return nil, false, fmt.Errorf("line %d: want the header \"NPU ID  Chip ID  Chip Logic ID ...\", got %q", lineNo, line)
			}
			continue
		}
		f := strings.Fields(line)
		// Every column but the last (the name) is one word.
		want := len(cols) - 1
		if len(f) < want {
			return nil, false, fmt.Errorf("line %d: want %d columns, got %q", lineNo, len(cols), line)
		}
		c := Chip{Phys: -1, Name: strings.Join(f[want:], " ")}
		mcu := false
		for i, name := range cols[:want] {
			v := f[i]
			if (name == "Chip Logic ID" || name == "Chip Phy-ID") && (v == "-" || v == "N/A") {
				mcu = mcu || name == "Chip Logic ID"
				continue
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return nil, false, fmt.Errorf("line %d: bad %s %q", lineNo, name, v)
			}
			switch name {
			case "NPU ID":
				c.NPU = n
			case "Chip ID":
				c.Chip = n
			case "Chip Logic ID":
				c.Logical = n
			case "Chip Phy-ID":
				c.Phys = n
			}
		}
		if mcu {
			continue
		}
		hasPhy := slices.Contains(cols, "Chip Phy-ID")
		if hasPhy && c.Phys < 0 {
			return nil, false, fmt.Errorf("line %d: chip with logic id %d has no Chip Phy-ID", lineNo, c.Logical)
		}
		if _, dup := seenLogical[c.Logical]; dup {
			return nil, false, fmt.Errorf("line %d: logical id %d listed twice", lineNo, c.Logical)
		}
		seenLogical[c.Logical] = lineNo
		if hasPhy {
			if _, dup := seenPhys[c.Phys]; dup {
				return nil, false, fmt.Errorf("line %d: physical id %d listed twice", lineNo, c.Phys)
			}
			seenPhys[c.Phys] = lineNo
		}
		chips = append(chips, c)
	}
	if err := sc.Err(); err != nil {
		return nil, false, err
	}
	if cols == nil {
		return nil, false, errors.New("no npu-smi table in the output")
	}
	if len(chips) == 0 {
		return nil, false, errors.New("no chips with a logic id in the npu-smi table")
	}
	return chips, slices.Contains(cols, "Chip Phy-ID"), nil
}

// headerColumns returns the known column names in the order line has
// them; nil when it has none.
func headerColumns(line string) []string {
	type at struct {
		name string
		pos  int
	}
	var found []at
	for _, name := range npuSmiColumns {
		if i := strings.Index(line, name); i >= 0 {
			found = append(found, at{name, i})
		}
	}
	if i := strings.Index(line, "Chip Phy ID"); i >= 0 && !slices.ContainsFunc(found, func(a at) bool { return a.name == "Chip Phy-ID" }) {
		found = append(found, at{"Chip Phy-ID", i})
	}
	slices.SortFunc(found, func(a, b at) int { return a.pos - b.pos })
	cols := make([]string, len(found))
	for i, a := range found {
		cols[i] = a.name
	}
	if len(cols) == 0 {
		return nil
	}
	return cols
}

// ParsePhyIDRemap parses the output of `npu-smi info -t phyid-remap -p N`:
// lines of "Key : value", possibly led by tabs, among which "Chip Physical
// ID" (or "Chip Phy-ID") and "Chip Logic ID". Other keys (NPU ID, Chip
// ID, Slot ID) are ignored.
func ParsePhyIDRemap(out []byte) (phys, logical int, err error) {
	phys, logical = -1, -1
	sc := bufio.NewScanner(bytes.NewReader(out))
	for lineNo := 1; sc.Scan(); lineNo++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		key, value, ok := strings.Cut(line, ":")
		if !ok {
			return -1, -1, fmt.Errorf("line %d: want \"Key : value\", got %q", lineNo, line)
		}
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		var dst *int
		switch key {
		case "Chip Physical ID", "Chip Phy-ID", "Chip Phy ID":
			dst = &phys
		case "Chip Logic ID":
			dst = &logical
		default:
			continue
		}
		if *dst >= 0 {
			return -1, -1, fmt.Errorf("line %d: %s given twice", lineNo, key)
		}
		n, err := strconv.Atoi(value)
		if err != nil || n < 0 {
			return -1, -1, fmt.Errorf("line %d: bad %s %q", lineNo, key, value)
		}
		*dst = n
	}
	if err := sc.Err(); err != nil {
		return -1, -1, err
	}
	switch {
	case phys < 0:
		return -1, -1, errors.New("no Chip Physical ID in the output")
	case logical < 0:
		return -1, -1, errors.New("no Chip Logic ID in the output")
	}
	return phys, logical, nil
}
