package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/slurm"
)

// slurmWarnings compares [slurm] gres_devices with gres.conf, where it can
// be read: a map that disagrees with Slurm's positions hands a job other
// devices than Slurm gave it.
func slurmWarnings(path string, cfg *policy.Config, inv *npu.Inventory) []policy.Error {
	s := cfg.Slurm
	var ws []policy.Error
	warn := func(format string, args ...any) {
		ws = append(ws, policy.Error{File: path, Key: "[slurm]", Msg: "warning: " + fmt.Sprintf(format, args...)})
	}
	node := s.Node
	if node == "" {
		h, err := os.Hostname()
		if err != nil {
			warn("this host's name: %v: gres.conf not compared (set [slurm] node)", err)
			return ws
		}
		node, _, _ = strings.Cut(h, ".")
	}
	gresConf := slurm.GresConfPath(s.GresConf, os.Getenv)
	g, err := slurm.ReadGres(gresConf, s.GRES, node)
	if err != nil {
		warn("read gres.conf: %v: gres_devices not compared with Slurm's (set [slurm] gres_conf, or SLURM_CONF)", err)
		return ws
	}
	for _, n := range g.Notes {
		warn("%s: %s", gresConf, n)
	}
	var numbers map[uint64]int
	if inv != nil {
		paths := map[int][]string{}
		for _, id := range s.Devices {
			paths[id] = inv.Nodes(id)
		}
		for _, id := range inv.IDs {
			paths[id] = inv.Nodes(id)
		}
		numbers = slurm.NodeNumbers(paths)
	}
	for _, p := range slurm.Check(s.Devices, g, gresConf, s.GRES, node, numbers) {
		warn("%s", p)
	}
	return ws
}
