// Package npu finds the accelerators of this machine and the variables that
// select them, and owns their device nodes and who may open them (ACLs). It
// imports nothing of the project: it knows no lease, broker, policy or
// wire.
package npu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Vendor names a kind of accelerator.
type Vendor string

// The vendors npurun knows. Auto is resolved by Discover and never appears
// in an Inventory.
const (
	Ascend Vendor = "ascend"
	NVIDIA Vendor = "nvidia"
	Fake   Vendor = "fake"
	Auto   Vendor = "auto"
)

// npuSmiTimeout bounds the run of npu-smi, which can hang on a sick driver.
const npuSmiTimeout = 15 * time.Second

// Inventory is the set of devices a broker manages.
type Inventory struct {
	Vendor  Vendor       // resolved: never Auto
	IDs     []int        // physical ids managed, ascending
	DevDir  string       // "/dev" normally; a fake tree in tests
	Logical map[int]int  // physical -> logical (Ascend); identity when unknown
	Chips   map[int]Chip // physical -> its chip in npu-smi info -m (Ascend: its card's NPU ID, the chip on it), where npu-smi said; nil otherwise
	NPUSmi  string       // npu-smi as configured ("" means npu-smi in PATH)
	Note    string       // a one-time notice for the broker log, "" if none
}

// Discover resolves the inventory of vendor's devices with the given
// physical ids (nil: all found) under devDir. For Auto it looks for davinciN
// nodes, then nvidiaN nodes. For Ascend it maps physical to logical ids with
// `npuSmi info -m` (npuSmi "" means "npu-smi" in PATH); when npu-smi is
// missing or fails the map is the identity and Note says so. Fake needs
// explicit ids and no device nodes. Empty ids count as nil.
func Discover(vendor Vendor, ids []int, devDir, npuSmi string) (*Inventory, error) {
	if devDir == "" {
		devDir = "/dev"
	}
	if vendor == "" {
		vendor = Auto
	}
	if vendor == Auto {
		switch {
		case len(scanNodes(devDir, "davinci")) > 0:
			vendor = Ascend
		case len(scanNodes(devDir, "nvidia")) > 0:
			vendor = NVIDIA
		default:
			return nil, fmt.Errorf("no accelerators found in %s (looked for davinciN and nvidiaN); set vendor in the config", devDir)
		}
	}
	ids = sortedUnique(ids)
	for _, id := range ids {
		if id < 0 {
			return nil, fmt.Errorf("negative device id %d", id)
		}
	}
	inv := &Inventory{Vendor: vendor, DevDir: devDir, NPUSmi: npuSmi}
	switch vendor {
	case Fake:
		if len(ids) == 0 {
			return nil, fmt.Errorf("vendor fake needs its device ids ([devices] ids)")
		}
		inv.IDs = ids
		inv.Logical = identity(ids)
		return inv, nil
	case Ascend, NVIDIA:
	default:
		return nil, fmt.Errorf("unknown vendor %q (want ascend, nvidia, fake or auto)", vendor)
	}
	prefix := nodePrefix(vendor)
	if len(ids) == 0 {
		ids = scanNodes(devDir, prefix)
		if len(ids) == 0 {
			return nil, fmt.Errorf("no %s devices: no %sN nodes in %s", vendor, prefix, devDir)
		}
	}
	for _, id := range ids {
		p := filepath.Join(devDir, prefix+strconv.Itoa(id))
		if _, err := os.Stat(p); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("no %s: %s does not exist", vendor.Format([]int{id}), p)
			}
			return nil, fmt.Errorf("%s: %w", vendor.Format([]int{id}), err)
		}
	}
	inv.IDs = ids
	inv.Logical = identity(ids)
	if vendor == Ascend {
		m, chips, note := logicalMap(npuSmi, ids, devDir)
		if m != nil {
			inv.Logical = m
			inv.Chips = chipsOf(m, chips)
		}
		inv.Note = note
	}
	return inv, nil
}

// Found returns the ids of the vendor's device nodes in devDir ("" for
// /dev), ascending, without running npu-smi: the devices a broker whose
// configuration names no ids would manage. Auto looks for davinciN, then
// nvidiaN; Fake has no nodes, and so no ids.
func Found(vendor Vendor, devDir string) []int {
	if devDir == "" {
		devDir = "/dev"
	}
	switch vendor {
	case Ascend, NVIDIA:
		return scanNodes(devDir, nodePrefix(vendor))
	case Auto, Unknown:
		if ids := scanNodes(devDir, "davinci"); len(ids) > 0 {
			return ids
		}
		return scanNodes(devDir, "nvidia")
	}
	return nil
}

// logicalMap runs npu-smi and returns the physical -> logical map of ids,
// or nil and a notice saying why the identity is used instead. A note
// comes with a map too when the map is a guess.
//
// `npu-smi info -m` lists every compute chip with its logical id. Where it
// also has a Chip Phy-ID column, that is the map. Where it has not, each
// device is asked for with `npu-smi info -t phyid-remap -p N`. Where that
// fails too (an npu-smi that lacks it), the listing order is matched to
// the davinciN nodes of devDir in ascending order, but only when there are
// as many of each, with a note: a listing that skips a card (a container,
// a failed card) would otherwise shift every id after it.
func logicalMap(npuSmi string, ids []int, devDir string) (map[int]int, []Chip, string) {
	const fallback = "logical ids taken equal to physical ids"
	bin := npuSmi
	if bin == "" {
		p, err := exec.LookPath("npu-smi")
		if err != nil {
			return nil, nil, "npu-smi not found: " + fallback
		}
		bin = p
	}
	out, err := runNPUSmi(bin, "info", "-m")
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Sprintf("npu-smi not found at %s: %s", bin, fallback)
		}
		return nil, nil, fmt.Sprintf("run %s info -m: %v: %s", bin, err, fallback)
	}
	chips, hasPhy, err := ParseNPUSmiTable(out)
	if err != nil {
		return nil, nil, fmt.Sprintf("read %s info -m: %v: %s", bin, err, fallback)
	}
	if hasPhy {
		all := make(map[int]int, len(chips))
		for _, c := range chips {
			all[c.Phys] = c.Logical
		}
		m := make(map[int]int, len(ids))
		for _, id := range ids {
			l, ok := all[id]
			if !ok {
				return nil, nil, fmt.Sprintf("read %s info -m: no chip with physical id %d: %s", bin, id, fallback)
			}
			m[id] = l
		}
		return m, chips, ""
	}
	m, err := remapIDs(bin, ids, chips)
	if err == nil {
		return m, chips, ""
	}
	nodes := scanNodes(devDir, "davinci")
	if len(nodes) != len(chips) {
		return nil, nil, fmt.Sprintf("%v; %s info -m lists %d chips and %s has %d davinci nodes: %s", err, bin, len(chips), devDir, len(nodes), fallback)
	}
	all := make(map[int]int, len(chips))
	for k, c := range chips {
		all[nodes[k]] = c.Logical
	}
	m = make(map[int]int, len(ids))
	for _, id := range ids {
		l, ok := all[id]
		if !ok {
			return nil, nil, fmt.Sprintf("%v; no davinci%d among the nodes: %s", err, id, fallback)
		}
		m[id] = l
	}
	return m, chips, fmt.Sprintf("%v; logical ids taken from %s info -m in listing order, matched to the davinci nodes in ascending order", err, bin)
}

// chipsOf maps each physical id of m to its chip in chips: the chip of
// its logical id, with the physical id. A physical id whose chip is not
// listed is left out.
func chipsOf(m map[int]int, chips []Chip) map[int]Chip {
	out := make(map[int]Chip, len(m))
	for phys, logical := range m {
		for _, c := range chips {
			if c.Logical == logical {
				c.Phys = phys
				out[phys] = c
				break
			}
		}
	}
	return out
}

// physicalOf is the physical id of the chip npu-smi's tables name as
// card npuID, chip: from npu-smi info -m where it said (Chips), else the
// NPU ID itself for chip 0 (one chip a card, as the 910B's, numbered as
// its davinci node).
func (inv *Inventory) physicalOf(npuID, chip int) (int, bool) {
	if inv.Chips == nil {
		return npuID, chip == 0
	}
	for phys, c := range inv.Chips {
		if c.NPU == npuID && c.Chip == chip {
			return phys, true
		}
	}
	return -1, false
}

// remapIDs asks npu-smi for the logical id of each physical id, and checks
// each answer against the chips of `npu-smi info -m`.
func remapIDs(bin string, ids []int, chips []Chip) (map[int]int, error) {
	listed := make(map[int]bool, len(chips))
	for _, c := range chips {
		listed[c.Logical] = true
	}
	m := make(map[int]int, len(ids))
	taken := make(map[int]int, len(ids))
	for _, id := range ids {
		what := fmt.Sprintf("%s info -t phyid-remap -p %d", bin, id)
		out, err := runNPUSmi(bin, "info", "-t", "phyid-remap", "-p", strconv.Itoa(id))
		if err != nil {
			return nil, fmt.Errorf("run %s: %w", what, err)
		}
		phys, logical, err := ParsePhyIDRemap(out)
		switch {
		case err != nil:
			return nil, fmt.Errorf("read %s: %w", what, err)
		case phys != id:
			return nil, fmt.Errorf("read %s: it answers for physical id %d", what, phys)
		case !listed[logical]:
			return nil, fmt.Errorf("read %s: logical id %d is not in %s info -m", what, logical, bin)
		}
		if other, dup := taken[logical]; dup {
			return nil, fmt.Errorf("read %s: logical id %d is also physical id %d's", what, logical, other)
		}
		taken[logical] = id
		m[id] = logical
	}
	return m, nil
}

// runNPUSmi runs npu-smi with args, bounded by npuSmiTimeout, and returns
// its standard output.
func runNPUSmi(bin string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), npuSmiTimeout)
	defer cancel()
	return exec.CommandContext(ctx, bin, args...).Output()
}

// Env returns the environment entries that select the given physical
// devices for a command: NPURUN_DEVICES with the physical ids always, and
// the vendor's visible-device variable (ASCEND_RT_VISIBLE_DEVICES with
// logical ids for Ascend and Fake; CUDA_DEVICE_ORDER and
// CUDA_VISIBLE_DEVICES for NVIDIA). Lists are comma-separated and in
// matching order: the i-th entry of NPURUN_DEVICES is the device the i-th
// entry of the vendor's variable selects, and the runtime's device i
// inside the process. That order is ascending logical ids for Ascend (the
// CANN runtime wants them ascending), ascending ids for NVIDIA.
func (inv *Inventory) Env(physical []int) []string {
	phys := sortedUnique(physical)
	if inv.Vendor == NVIDIA {
		return []string{"NPURUN_DEVICES=" + JoinIDs(phys), "CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=" + JoinIDs(phys)}
	}
	logical := make([]int, len(phys))
	for i, p := range phys {
		l, ok := inv.Logical[p]
		if !ok {
			l = p
		}
		logical[i] = l
	}
	order := make([]int, len(phys))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return logical[a] - logical[b] })
	physOut := make([]int, len(phys))
	logOut := make([]int, len(phys))
	for i, k := range order {
		physOut[i], logOut[i] = phys[k], logical[k]
	}
	return []string{"NPURUN_DEVICES=" + JoinIDs(physOut), "ASCEND_RT_VISIBLE_DEVICES=" + JoinIDs(logOut)}
}

// HiddenEnv returns the environment entries of a command run with no lease:
// every visible-device variable set empty, whatever the vendor.
func HiddenEnv() []string {
	return []string{"NPURUN_DEVICES=", "ASCEND_RT_VISIBLE_DEVICES=", "CUDA_VISIBLE_DEVICES="}
}

// Nodes returns the device node paths a holder of physical device id uses;
// none for Fake.
func (inv *Inventory) Nodes(id int) []string {
	prefix := nodePrefix(inv.Vendor)
	if prefix == "" {
		return nil
	}
	return []string{filepath.Join(inv.DevDir, prefix+strconv.Itoa(id))}
}

// MachineNodes returns the device nodes of every device of the vendor in
// DevDir, managed here or not: another broker may manage the others, and
// the control nodes are the whole machine's. None for Fake.
func (inv *Inventory) MachineNodes() []string {
	prefix := nodePrefix(inv.Vendor)
	if prefix == "" {
		return nil
	}
	var paths []string
	for _, id := range scanNodes(inv.DevDir, prefix) {
		paths = append(paths, filepath.Join(inv.DevDir, prefix+strconv.Itoa(id)))
	}
	return paths
}

// SharedNodes returns the control nodes that every user of the vendor's
// devices opens; none for Fake.
func (inv *Inventory) SharedNodes() []string {
	var names []string
	switch inv.Vendor {
	case Ascend:
		names = []string{"davinci_manager", "devmm_svm", "hisi_hdc"}
	case NVIDIA:
		names = []string{"nvidiactl", "nvidia-uvm"}
	}
	paths := make([]string, 0, len(names))
	for _, n := range names {
		paths = append(paths, filepath.Join(inv.DevDir, n))
	}
	return paths
}

func nodePrefix(v Vendor) string {
	switch v {
	case Ascend:
		return "davinci"
	case NVIDIA:
		return "nvidia"
	}
	return ""
}

// scanNodes returns the ascending N of the entries prefixN in dir.
func scanNodes(dir, prefix string) []int {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var ids []int
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || rest == "" || strings.TrimLeft(rest, "0123456789") != "" {
			continue
		}
		if n, err := strconv.Atoi(rest); err == nil {
			ids = append(ids, n)
		}
	}
	return sortedUnique(ids)
}

func identity(ids []int) map[int]int {
	m := make(map[int]int, len(ids))
	for _, id := range ids {
		m[id] = id
	}
	return m
}

func sortedUnique(ids []int) []int {
	if ids == nil {
		return nil
	}
	s := slices.Clone(ids)
	slices.Sort(s)
	return slices.Compact(s)
}
