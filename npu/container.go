package npu

import (
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Inside a container the devices are other numbers than on the host. The
// container gets the nodes of its devices under their host names
// (/dev/davinci3 stays /dev/davinci3), and the driver inside numbers the
// devices it finds from 0, in the host's order: Ascend's runtime (CANN)
// renumbers the chips mounted into a container, and CUDA numbers the GPUs
// it can open. So the runtime's variable inside lists 0 to k-1, where on
// the host it lists the logical ids; NPURUN_DEVICES keeps the physical
// ids, in the same order, so that its i-th entry is still the runtime's
// device i. The container runtimes of the vendors (Ascend Docker Runtime,
// NVIDIA Container Toolkit) mount devices named by a variable of their
// own, with physical ids: it is set too, for an engine whose runtime is
// one of them (and is inert under plain runc).

// ContainerEnv returns the environment entries of a container run on
// devices, physical ids in the order of the host's NPURUN_DEVICES (which
// Env gives): NPURUN_DEVICES as on the host, the runtime's variable with
// the ids inside the container (0 to k-1), and the vendor's container
// runtime's variable with the physical ids.
func ContainerEnv(vendor Vendor, devices []int) []string {
	phys := JoinIDs(devices)
	inside := make([]int, len(devices))
	for i := range inside {
		inside[i] = i
	}
	in := JoinIDs(inside)
	if vendor == NVIDIA {
		return []string{"NPURUN_DEVICES=" + phys, "CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=" + in, "NVIDIA_VISIBLE_DEVICES=" + phys}
	}
	return []string{"NPURUN_DEVICES=" + phys, "ASCEND_RT_VISIBLE_DEVICES=" + in, "ASCEND_VISIBLE_DEVICES=" + phys}
}

// DevicesOf reads the physical ids of an NPURUN_DEVICES entry among env
// ("NAME=value" entries, the last one counting), in their order; nil when
// there is none or it does not parse.
func DevicesOf(env []string) []int {
	value, found := "", false
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "NPURUN_DEVICES="); ok {
			value, found = v, true
		}
	}
	if !found || value == "" {
		return nil
	}
	var ids []int
	for part := range strings.SplitSeq(value, ",") {
		n, err := strconv.Atoi(part)
		if err != nil || n < 0 {
			return nil
		}
		ids = append(ids, n)
	}
	return ids
}

// ContainerNodes returns the device nodes in devDir ("" for /dev) that a
// container on devices needs: each device's node, then the vendor's
// control nodes that exist (not every driver has every one). None for
// Fake, whose devices have no nodes.
func ContainerNodes(vendor Vendor, devDir string, devices []int) []string {
	if devDir == "" {
		devDir = "/dev"
	}
	inv := &Inventory{Vendor: vendor, DevDir: devDir}
	var paths []string
	for _, id := range devices {
		paths = append(paths, inv.Nodes(id)...)
	}
	for _, p := range inv.SharedNodes() {
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil {
			paths = append(paths, p)
		}
	}
	return paths
}

// NodeID returns the physical id whose node a device node's name is
// (davinci3: 3) for vendor, and false for any other name (a control
// node, another vendor's).
func NodeID(vendor Vendor, path string) (int, bool) {
	prefix := nodePrefix(vendor)
	rest, ok := strings.CutPrefix(filepath.Base(path), prefix)
	if prefix == "" || !ok || rest == "" || strings.TrimLeft(rest, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil
}

// VendorOf names the vendor of a lease a process inherited, from what
// its environment (env) says and devDir ("" for /dev) holds: NVIDIA
// where CUDA_VISIBLE_DEVICES selects devices and ASCEND_RT_VISIBLE_DEVICES
// does not; else Ascend where devDir has the node of every device; else
// Fake, whose devices have no nodes. A grant names its vendor; a lease
// handed down (a nested npurun, a task's command) carries only the
// variables.
func VendorOf(env []string, devDir string, devices []int) Vendor {
	last := func(name string) string {
		v := ""
		for _, kv := range env {
			if s, ok := strings.CutPrefix(kv, name+"="); ok {
				v = s
			}
		}
		return v
	}
	if last("CUDA_VISIBLE_DEVICES") != "" && last("ASCEND_RT_VISIBLE_DEVICES") == "" {
		return NVIDIA
	}
	if devDir == "" {
		devDir = "/dev"
	}
	for _, id := range devices {
		var st unix.Stat_t
		if unix.Stat(filepath.Join(devDir, "davinci"+strconv.Itoa(id)), &st) != nil {
			return Fake
		}
	}
	if len(devices) == 0 {
		return Fake
	}
	return Ascend
}
