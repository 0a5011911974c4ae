package slurm

import (
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// NodeNumbers maps the device number of each node in paths (a device id
// to its node paths, as npu.Inventory.Nodes gives them) to the device's
// id. A node that cannot be read is left out.
func NodeNumbers(paths map[int][]string) map[uint64]int {
	numbers := make(map[uint64]int)
	for id, list := range paths {
		for _, p := range list {
			var st unix.Stat_t
			if unix.Stat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR {
				numbers[st.Rdev] = id
			}
		}
	}
	return numbers
}

// Check compares [slurm] gres_devices (ids, physical, in gres.conf
// position order) with g, what gres.conf at path says of the GRES name on
// node, and returns each disagreement as one line: a count that differs,
// a File= that is missing or no character device (Slurm refuses it), and,
// where numbers maps the device numbers of the managed devices' nodes to
// their ids (NodeNumbers), a File= that is another device's node or none
// of npurun's. numbers nil or empty (a vendor without nodes) compares the
// counts only. Nothing means they agree.
func Check(ids []int, g *Gres, path, name, node string, numbers map[uint64]int) []string {
	var problems []string
	say := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if g.AutoDetect != "" && g.AutoDetect != "off" {
		say("%s: AutoDetect=%s: Slurm may add or reorder devices by what the driver reports, so its positions may not be File='s order; set AutoDetect=off for the node and list File= explicitly", path, g.AutoDetect)
	}
	if g.Records == 0 {
		say("%s names no gres %q for node %q: Slurm hands out none of [slurm] gres_devices %s (wrong gres_name or node?)", path, name, node, joinIDs(ids))
		return problems
	}
	if len(g.Files) != len(ids) {
		say("%s lists %d device files of gres %q for node %q, [slurm] gres_devices %d (%s): position i of a job's SLURM_JOB_GPUS is the i-th id of gres_devices", path, len(g.Files), name, node, len(ids), joinIDs(ids))
	}
	for i, f := range g.Files {
		where := fmt.Sprintf("%s:%d: position %d, %s", path, f.Line, f.Position, f.Path)
		var st unix.Stat_t
		if err := unix.Stat(f.Path, &st); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				say("%s: no such file", where)
			} else {
				say("%s: %v", where, err)
			}
			continue
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR {
			say("%s: not a character device (Slurm refuses File= that is not one)", where)
			continue
		}
		if len(numbers) == 0 {
			continue
		}
		id, known := numbers[st.Rdev]
		switch {
		case !known:
			say("%s: device %d:%d is the node of none of the devices npurun manages", where, unix.Major(st.Rdev), unix.Minor(st.Rdev))
		case i >= len(ids):
			say("%s: device %d's node, past the end of [slurm] gres_devices", where, id)
		case id != ids[i]:
			say("%s: device %d's node, but [slurm] gres_devices puts device %d at position %d", where, id, ids[i], i)
		}
	}
	return problems
}

func joinIDs(ids []int) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.Itoa(id)
	}
	return `"` + strings.Join(s, ",") + `"`
}
