package ociruntime

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
)

// maxSpec caps the bundle's config.json that the runtime reads.
const maxSpec = 16 << 20

// spec is what the runtime reads of a bundle's config.json (the OCI
// runtime specification): the process's environment, the device nodes,
// the device cgroup's rules, and where the engine keeps the container's
// files.
type spec struct {
	Process *struct {
		Env []string `json:"env"`
	} `json:"process"`
	Mounts []struct {
		Destination string `json:"destination"`
		Source      string `json:"source"`
	} `json:"mounts"`
	Linux *struct {
		CgroupsPath string `json:"cgroupsPath"`
		Resources   *struct {
			Devices []rule `json:"devices"`
		} `json:"resources"`
	} `json:"linux"`
}

// rule is one device cgroup rule: allow or deny access (r, w, m) to the
// devices of a type ("a" or "" for all, "c", "b"), a major and a minor
// number (nil or -1 for all).
type rule struct {
	Allow  bool   `json:"allow"`
	Type   string `json:"type"`
	Major  *int64 `json:"major"`
	Minor  *int64 `json:"minor"`
	Access string `json:"access"`
}

// readSpec reads bundle/config.json.
func readSpec(bundle string) (*spec, error) {
	f, err := os.Open(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSpec+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", f.Name(), err)
	}
	if len(data) > maxSpec {
		return nil, fmt.Errorf("read %s: larger than %d MiB", f.Name(), maxSpec>>20)
	}
	s := &spec{}
	if err := json.Unmarshal(data, s); err != nil {
		return nil, fmt.Errorf("read %s: %w", f.Name(), err)
	}
	return s, nil
}

// env is the value of name in the container's environment, the last
// one counting; "" when absent.
func (s *spec) env(name string) string {
	if s.Process == nil {
		return ""
	}
	v := ""
	for _, kv := range s.Process.Env {
		if val, ok := strings.CutPrefix(kv, name+"="); ok {
			v = val
		}
	}
	return v
}

// home is the directory in which the engine keeps the container's files
// (its /etc/hostname's), which lives as long as the container does
// (docker rm, podman rm remove it); "" when unknown.
func (s *spec) home() string {
	for _, m := range s.Mounts {
		if m.Destination == "/etc/hostname" && filepath.IsAbs(m.Source) {
			return filepath.Dir(m.Source)
		}
	}
	return ""
}

// engine names the engine from the container's cgroup path: docker's
// /docker/ID (or docker-ID.scope), podman's libpod-ID; "" for another.
func (s *spec) engine() string {
	if s.Linux == nil {
		return ""
	}
	p := s.Linux.CgroupsPath
	switch {
	case strings.Contains(p, "docker"):
		return "docker"
	case strings.Contains(p, "libpod"):
		return "podman"
	}
	return ""
}

// name is the engine's name for the container where it can be read:
// Docker keeps it in config.v2.json beside the hostname file. "" when
// unknown (podman's is not in the bundle).
func (s *spec) name() string {
	home := s.home()
	if home == "" || s.engine() != "docker" {
		return ""
	}
	f, err := os.Open(filepath.Join(home, "config.v2.json"))
	if err != nil {
		return ""
	}
	defer f.Close()
	var c struct{ Name string }
	if json.NewDecoder(io.LimitReader(f, 4<<20)).Decode(&c) != nil {
		return ""
	}
	return strings.TrimPrefix(c.Name, "/")
}

// node is a managed device's node: its physical id and device number.
type node struct {
	id           int
	major, minor int64
	path         string
}

// managed returns the nodes of the devices the configuration's broker
// manages ([devices]: vendor, ids, dev_dir). Fake devices have none.
func managed(cfg *policy.Config) (npu.Vendor, []node) {
	vendor := npu.Vendor(cfg.Vendor)
	if vendor == npu.Auto {
		vendor = npu.NVIDIA
		if len(npu.Found(npu.Ascend, cfg.DevDir)) > 0 {
			vendor = npu.Ascend
		}
	}
	ids := cfg.IDs
	if ids == nil {
		ids = npu.Found(vendor, cfg.DevDir)
	}
	inv := &npu.Inventory{Vendor: vendor, IDs: ids, DevDir: cfg.DevDir}
	var nodes []node
	for _, id := range ids {
		for _, p := range inv.Nodes(id) {
			var st unix.Stat_t
			if unix.Stat(p, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
				continue
			}
			nodes = append(nodes, node{id: id, major: int64(unix.Major(st.Rdev)), minor: int64(unix.Minor(st.Rdev)), path: p})
		}
	}
	return vendor, nodes
}

// wanted returns the ids of the nodes the container may open, by its
// device cgroup's rules: no rules allow every device; otherwise the rules
// apply in order, each setting read and write access of the devices it
// matches (as runc applies them), and a device is the container's if it
// may read or write it. A node made in the container (linux.devices)
// without access is no use; a device allowed without a node (a cgroup
// rule, or --privileged) is, to a process that may mknod.
func (s *spec) wanted(nodes []node) []int {
	var rules []rule
	if s.Linux != nil && s.Linux.Resources != nil {
		rules = s.Linux.Resources.Devices
	}
	var ids []int
	for _, n := range nodes {
		r, w := true, true
		for _, ru := range rules {
			if !ru.matches(n) {
				continue
			}
			if strings.Contains(ru.Access, "r") || ru.Access == "" {
				r = ru.Allow
			}
			if strings.Contains(ru.Access, "w") || ru.Access == "" {
				w = ru.Allow
			}
		}
		if (r || w) && !slices.Contains(ids, n.id) {
			ids = append(ids, n.id)
		}
	}
	slices.Sort(ids)
	return ids
}

func (ru rule) matches(n node) bool {
	switch ru.Type {
	case "", "a", "c":
	default:
		return false
	}
	if ru.Major != nil && *ru.Major >= 0 && *ru.Major != n.major {
		return false
	}
	if ru.Minor != nil && *ru.Minor >= 0 && *ru.Minor != n.minor {
		return false
	}
	return true
}
