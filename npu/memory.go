package npu

import (
	"bufio"
	"bytes"
	"context"
	"strconv"
	"strings"
)

// Memory is each device's memory in MiB, by physical id, as the
// vendor's tool tells it (nvidia-smi --query-gpu=minor_number,memory.total;
// npu-smi info's HBM total). It is nil, with a nil error, where there is
// no tool to ask (the fake vendor: [share] capacity says), and nil with
// the tool's error where it fails (missing, hung, exiting non-zero): the
// broker asks again later for a shared device whose memory it does not
// know.
func (inv *Inventory) Memory(tools Tools) (map[int]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), npuSmiTimeout)
	defer cancel()
	switch inv.Vendor {
	case NVIDIA:
		out, err := runTool(ctx, tools.nvidiaSmi(), "--query-gpu=minor_number,memory.total", "--format=csv,noheader,nounits")
		if err != nil {
			return nil, err
		}
		return ParseGPUMemory(out), nil
	case Ascend:
		out, err := runTool(ctx, inv.npuSmi(tools), "info")
		if err != nil {
			return nil, err
		}
		m := map[int]int64{}
		for c, mib := range ParseNPUSmiHBM(out) {
			if phys, ok := inv.physicalOf(c.NPU, c.Chip); ok {
				m[phys] = mib
			}
		}
		return m, nil
	}
	return nil, nil
}

// npuSmi is the npu-smi to run: tools', else the configuration's, else
// npu-smi in PATH.
func (inv *Inventory) npuSmi(tools Tools) string {
	switch {
	case tools.NPUSmi != "":
		return tools.NPUSmi
	case inv.NPUSmi != "":
		return inv.NPUSmi
	}
	return "npu-smi"
}

// nvidiaSmi is the nvidia-smi to run: tools', else nvidia-smi in PATH.
func (tools Tools) nvidiaSmi() string {
	if tools.NVIDIASmi != "" {
		return tools.NVIDIASmi
	}
	return "nvidia-smi"
}

// ChipID is a chip as npu-smi's tables name it: its card's NPU ID and
// the chip on the card.
type ChipID struct{ NPU, Chip int }

// ParseNPUSmiHBM reads each device's HBM from the devices' table of
// `npu-smi info`: the chip row under each NPU row ends with its
// HBM-Usage(MB), "used / total":
//
//	| 0     910B3               | OK            | 96.5        40                0    / 0             |
//	| 0                         | 0000:C1:00.0  | 0           0    / 0          13178/ 65536         |
//
// Each chip's row is under its card's; the total is in MiB. Inventory's
// physicalOf makes the chip a physical id.
func ParseNPUSmiHBM(out []byte) map[ChipID]int64 {
	m := map[ChipID]int64{}
	in := false
	npuID := -1
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.Contains(line, "HBM-Usage"):
			in = true
			continue
		case strings.Contains(line, "Process id"):
			return m
		case !in || !strings.HasPrefix(line, "|"):
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			continue
		}
		first := strings.Fields(cells[1])
		switch {
		case len(first) >= 2: // an NPU row: its id and name
			if id, err := strconv.Atoi(first[0]); err == nil {
				npuID = id
			}
		case len(first) == 1 && npuID >= 0: // a chip's row, under its card's
			chip, err := strconv.Atoi(first[0])
			usage := cells[3]
			slash := strings.LastIndexByte(usage, '/')
			if err != nil || chip < 0 || slash < 0 {
				continue
			}
			if total, err := strconv.ParseInt(strings.TrimSpace(usage[slash+1:]), 10, 64); err == nil && total > 0 {
				m[ChipID{npuID, chip}] = total
			}
		}
	}
	return m
}

// ParseGPUMemory reads nvidia-smi --query-gpu=minor_number,memory.total
// --format=csv,noheader,nounits: "0, 81559" a line, MiB, by minor number
// (the N of /dev/nvidiaN, the physical id; nvidia-smi's index is its own
// order, which need not be the nodes').
func ParseGPUMemory(out []byte) map[int]int64 {
	m := map[int]int64{}
	for id, mib := range csvPairs(out) {
		if mib > 0 {
			m[id] = mib
		}
	}
	return m
}

// ProcMem is a process's use of device memory as the vendor's tool shows
// it.
type ProcMem struct {
	Device int    // physical id; -1 where the tool does not say (nvidia-smi --query-compute-apps)
	Chip   ChipID // npu-smi's name of the device (ParseNPUSmiProcesses)
	PID    int
	MiB    int64
}

// ProcessMemory reads what each process uses of device memory: Ascend
// (and the fake vendor, when [devices] npu_smi names a tool) from
// `npu-smi info`'s process table, NVIDIA from `nvidia-smi
// --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`.
// ok is false where there is no tool to ask.
func (inv *Inventory) ProcessMemory(tools Tools) (procs []ProcMem, ok bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), npuSmiTimeout)
	defer cancel()
	switch inv.Vendor {
	case NVIDIA:
		out, err := runTool(ctx, tools.nvidiaSmi(), "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
		if err != nil {
			return nil, true, err
		}
		return ParseComputeApps(out), true, nil
	case Fake:
		if tools.NPUSmi == "" && inv.NPUSmi == "" {
			return nil, false, nil
		}
	}
	out, err := runTool(ctx, inv.npuSmi(tools), "info")
	if err != nil {
		return nil, true, err
	}
	procs = ParseNPUSmiProcesses(out)
	for i := range procs {
		if phys, ok := inv.physicalOf(procs[i].Chip.NPU, procs[i].Chip.Chip); ok {
			procs[i].Device = phys
		}
	}
	return procs, true, nil
}

// ParseComputeApps reads nvidia-smi --query-compute-apps=pid,used_memory
// --format=csv,noheader,nounits: "4121, 9800" a line, MiB. It names no
// device (Device -1).
func ParseComputeApps(out []byte) []ProcMem {
	var procs []ProcMem
	for pid, mib := range csvPairs(out) {
		procs = append(procs, ProcMem{Device: -1, PID: pid, MiB: mib})
	}
	return procs
}

// ParseNPUSmiProcesses reads the process table of `npu-smi info` (after
// the devices' table):
//
//	| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
//	+===========================+===============+====================================================+
//	| 0       0                 | 4121          | python                   | 9800                    |
//	| No running processes found in NPU 1                                                            |
//
// Each process is named with its chip (Device -1: Inventory's
// ProcessMemory makes it a physical id), the memory in MiB (the tool's
// "MB").
func ParseNPUSmiProcesses(out []byte) []ProcMem {
	var procs []ProcMem
	in := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, "Process id") && strings.Contains(line, "Process memory") {
			in = true
			continue
		}
		if !in || !strings.HasPrefix(strings.TrimSpace(line), "|") {
			continue
		}
		cells := strings.Split(strings.TrimSpace(line), "|")
		if len(cells) < 6 {
			continue
		}
		ids := strings.Fields(cells[1])
		if len(ids) != 2 {
			continue
		}
		card, err1 := strconv.Atoi(ids[0])
		chip, err4 := strconv.Atoi(ids[1])
		pid, err2 := strconv.Atoi(strings.TrimSpace(cells[2]))
		mib, err3 := strconv.ParseInt(strings.TrimSpace(cells[4]), 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || err4 != nil || card < 0 || chip < 0 || pid <= 0 || mib < 0 {
			continue
		}
		procs = append(procs, ProcMem{Device: -1, Chip: ChipID{card, chip}, PID: pid, MiB: mib})
	}
	return procs
}

// csvPairs reads lines of two integers "a, b", in order.
func csvPairs(out []byte) func(yield func(int, int64) bool) {
	return func(yield func(int, int64) bool) {
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			a, b, ok := strings.Cut(sc.Text(), ",")
			if !ok {
				continue
			}
			x, err1 := strconv.Atoi(strings.TrimSpace(a))
			y, err2 := strconv.ParseInt(strings.TrimSpace(b), 10, 64)
			if err1 == nil && err2 == nil && x >= 0 && y >= 0 && !yield(x, y) {
				return
			}
		}
	}
}
