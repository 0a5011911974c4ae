package npu

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// visibleVars are the vendors' visible-device variables that Env pairs
// entry by entry with NPURUN_DEVICES.
var visibleVars = []string{"ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"}

// Narrow returns the environment entries that select only some of a
// lease's devices, from the lease's own variables as Env set them (lookup
// reads them): the devices ids when ids is not empty, else the first n in
// NPURUN_DEVICES' order (the runtime's devices 0 to n-1). NPURUN_DEVICES
// and each visible-device variable with as many entries are cut to the
// chosen entries, in their order: an Ascend logical id stays the one the
// broker mapped, and the order stays ascending as the runtimes want it.
// It also returns the chosen physical ids, in that order. It fails,
// naming the variable, where NPURUN_DEVICES does not list the devices
// asked for or no visible-device variable pairs with it (changed since
// the grant).
func Narrow(lookup func(string) (string, bool), ids []int, n int) ([]string, []int, error) {
	v, _ := lookup("NPURUN_DEVICES")
	phys, ok := parseList(v)
	if !ok {
		return nil, nil, fmt.Errorf("NPURUN_DEVICES=%q does not list the lease's devices", v)
	}
	var pick []int // indexes into phys
	if len(ids) > 0 {
		for _, id := range ids {
			i := slices.Index(phys, id)
			if i < 0 {
				return nil, nil, fmt.Errorf("NPURUN_DEVICES=%q does not list device %d", v, id)
			}
			pick = append(pick, i)
		}
		slices.Sort(pick)
	} else {
		if n > len(phys) {
			return nil, nil, fmt.Errorf("NPURUN_DEVICES=%q lists fewer than %d devices", v, n)
		}
		for i := range n {
			pick = append(pick, i)
		}
	}
	chosen := make([]int, len(pick))
	for k, i := range pick {
		chosen[k] = phys[i]
	}
	env := []string{"NPURUN_DEVICES=" + JoinIDs(chosen)}
	paired := false
	for _, name := range visibleVars {
		val, set := lookup(name)
		list, ok := parseList(val)
		if !set || !ok || len(list) != len(phys) {
			continue
		}
		out := make([]int, len(pick))
		for k, i := range pick {
			out[k] = list[i]
		}
		env = append(env, name+"="+JoinIDs(out))
		paired = true
	}
	if !paired {
		return nil, nil, fmt.Errorf("no visible-device variable (%s) lists the %d devices of NPURUN_DEVICES=%q", strings.Join(visibleVars, ", "), len(phys), v)
	}
	return env, chosen, nil
}

// parseList reads a visible-device list: ids, comma-separated, each once.
func parseList(s string) ([]int, bool) {
	if s == "" {
		return nil, false
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		id, err := strconv.Atoi(f)
		if err != nil || id < 0 || slices.Contains(out, id) {
			return nil, false
		}
		out = append(out, id)
	}
	return out, true
}
