// Package npu finds the accelerators of this machine and the variables that select them.
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
	Vendor  Vendor      // resolved: never Auto
	IDs     []int       // physical ids managed, ascending
	DevDir  string      // "/dev" normally; a fake tree in tests
	Logical map[int]int // physical -> logical (Ascend); identity when unknown
	Note    string      // a one-time notice for the broker log, "" if none
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
			return nil, fmt.Errorf("discover %s devices: negative device id %d", vendor, id)
		}
	}
	inv := &Inventory{Vendor: vendor, DevDir: devDir}
	switch vendor {
	case Fake:
		if len(ids) == 0 {
			return nil, fmt.Errorf("discover fake devices: ids must be given for vendor fake")
		}
		inv.IDs = ids
		inv.Logical = identity(ids)
		return inv, nil
	case Ascend, NVIDIA:
	default:
		return nil, fmt.Errorf("discover devices: unknown vendor %q (want ascend, nvidia, fake or auto)", vendor)
	}
	prefix := nodePrefix(vendor)
	if len(ids) == 0 {
		ids = scanNodes(devDir, prefix)
		if len(ids) == 0 {
			return nil, fmt.Errorf("discover %s devices: no %sN nodes in %s", vendor, prefix, devDir)
		}
	}
	for _, id := range ids {
		p := filepath.Join(devDir, prefix+strconv.Itoa(id))
		if _, err := os.Stat(p); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("discover %s device %d: %s does not exist", vendor, id, p)
			}
			return nil, fmt.Errorf("discover %s device %d: %w", vendor, id, err)
		}
	}
	inv.IDs = ids
	inv.Logical = identity(ids)
	if vendor == Ascend {
		m, note := logicalMap(npuSmi, ids)
		if m != nil {
			inv.Logical = m
		}
		inv.Note = note
	}
	return inv, nil
}

// logicalMap runs npu-smi and returns the physical -> logical map of ids,
// or nil and a notice saying why the identity is used instead.
func logicalMap(npuSmi string, ids []int) (map[int]int, string) {
	const fallback = "logical ids taken equal to physical ids"
	bin := npuSmi
	if bin == "" {
		p, err := exec.LookPath("npu-smi")
		if err != nil {
			return nil, "npu-smi not found: " + fallback
		}
		bin = p
	}
	ctx, cancel := context.WithTimeout(context.Background(), npuSmiTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "info", "-m").Output()
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Sprintf("npu-smi not found at %s: %s", bin, fallback)
		}
		return nil, fmt.Sprintf("run %s info -m: %v: %s", bin, err, fallback)
	}
	all, err := ParseNPUSmiMap(out)
	if err != nil {
		return nil, fmt.Sprintf("read %s info -m: %v: %s", bin, err, fallback)
	}
	m := make(map[int]int, len(ids))
	for _, id := range ids {
		l, ok := all[id]
		if !ok {
			return nil, fmt.Sprintf("read %s info -m: no chip with physical id %d: %s", bin, id, fallback)
		}
		m[id] = l
	}
	return m, ""
}

// Env returns the environment entries that select the given physical
// devices for a command: NPURUN_DEVICES with the physical ids always, and
// the vendor's visible-device variable (ASCEND_RT_VISIBLE_DEVICES with
// logical ids for Ascend and Fake; CUDA_DEVICE_ORDER and
// CUDA_VISIBLE_DEVICES for NVIDIA). Lists are ascending and comma-separated.
func (inv *Inventory) Env(physical []int) []string {
	phys := sortedUnique(physical)
	env := []string{"NPURUN_DEVICES=" + joinInts(phys)}
	switch inv.Vendor {
	case NVIDIA:
		env = append(env, "CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES="+joinInts(phys))
	default:
		logical := make([]int, 0, len(phys))
		for _, p := range phys {
			l, ok := inv.Logical[p]
			if !ok {
				l = p
			}
			logical = append(logical, l)
		}
		slices.Sort(logical)
		env = append(env, "ASCEND_RT_VISIBLE_DEVICES="+joinInts(logical))
	}
	return env
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

func joinInts(ids []int) string {
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(id))
	}
	return b.String()
}
