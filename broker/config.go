package broker

import (
	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
)

// LoadConfig reads and validates the configuration file at path as the
// broker takes it up: the one validation of npubroker serve, reload and
// check-config. It is the file itself (policy.Load: every problem with
// its line), then what the file names on this machine: the devices
// (npu.Discover: the vendor's nodes in dev_dir, each of ids among them)
// and the pools' devices among them. A device node that does not exist,
// or a pool of a device not managed, is a problem of the file's, named
// as policy.Errors name theirs ("FILE: [devices]: no gpu 0: /dev/nvidia0
// does not exist"): serve does not start on it, reload does not take it,
// check-config exits 1. What a reload of it changes against the running
// broker is Server.CheckReload's.
func LoadConfig(path string) (*policy.Config, *npu.Inventory, error) {
	cfg, err := policy.Load(path)
	if err != nil {
		return nil, nil, err
	}
	inv, err := npu.Discover(npu.Vendor(cfg.Vendor), cfg.IDs, cfg.DevDir, cfg.NPUSmi)
	if err != nil {
		return nil, nil, &policy.Errors{{File: path, Key: "[devices]", Msg: err.Error()}}
	}
	if err := lease.CheckPools(inv.IDs, tablePools(cfg, inv.IDs), cfg.DefaultPool); err != nil {
		return nil, nil, &policy.Errors{{File: path, Key: "[pools]", Msg: err.Error()}}
	}
	return cfg, inv, nil
}
