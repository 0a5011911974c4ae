package npu

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// A process uses a device through its node, whatever path it reached the
// node by (a link, a bind mount, a container's own /dev): what names the
// device is the node's device number, not its path. WatchNodes finds the
// numbers of the nodes a broker watches, and refuses to guess where two
// of them share one (fake trees made with `mknod … c 1 3` for each do):
// a use of that number could be either, and a report would name the
// wrong one.

// Node is a device node the broker watches for use without a lease.
type Node struct {
	Path    string
	Device  int    // the physical id whose node it is; ControlNode for a control node
	Number  uint64 // its device number (rdev)
	Control bool   // a control node (davinci_manager, nvidiactl, …): every user of any device opens it
}

// ControlNode is Node.Device of a control node, which belongs to no one
// device.
const ControlNode = -1

// WatchNodes returns the nodes of the inventory's devices and its control
// nodes (SharedNodes) that are character devices, each with a device
// number no other of them has, in the order of the devices, then the
// control nodes. Notes say, one line each, what is left out and why: a
// node missing or not a character device, or nodes that share a number.
func (inv *Inventory) WatchNodes() (nodes []Node, notes []string) {
	var all []Node
	for _, id := range inv.IDs {
		for _, p := range inv.Nodes(id) {
			all = append(all, Node{Path: p, Device: id})
		}
	}
	for _, p := range inv.SharedNodes() {
		all = append(all, Node{Path: p, Device: ControlNode, Control: true})
	}
	byNumber := map[uint64][]int{}
	var ok []Node
	for _, n := range all {
		var st unix.Stat_t
		if err := unix.Stat(n.Path, &st); err != nil {
			if n.Control && os.IsNotExist(err) {
				continue // not every driver has every control node
			}
			notes = append(notes, fmt.Sprintf("%s: %v; its use without a lease is not watched", describe(n), err))
			continue
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR {
			notes = append(notes, fmt.Sprintf("%s: %s is not a character device; its use without a lease is not watched", describe(n), n.Path))
			continue
		}
		n.Number = st.Rdev
		byNumber[n.Number] = append(byNumber[n.Number], len(ok))
		ok = append(ok, n)
	}
	for i, n := range ok {
		shared := byNumber[n.Number]
		if len(shared) == 1 {
			nodes = append(nodes, n)
			continue
		}
		if shared[0] != i {
			continue // said with the first
		}
		paths := make([]string, len(shared))
		for i, k := range shared {
			paths[i] = ok[k].Path
		}
		notes = append(notes, fmt.Sprintf("%s share device number %d:%d: a process using it could be using any of them, so their use without a lease is not watched (give each node its own number)",
			strings.Join(paths, ", "), unix.Major(n.Number), unix.Minor(n.Number)))
	}
	return nodes, notes
}

func describe(n Node) string {
	if n.Control {
		return "control node " + n.Path
	}
	return fmt.Sprintf("npu %d: device node %s", n.Device, n.Path)
}
