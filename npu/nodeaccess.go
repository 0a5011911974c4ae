package npu

import (
	"context"
	"os/exec"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// NodeAccess looks at the nodes of vendor's devices ids in devDir (the
// devices' and the shared control nodes; Auto as Found resolves it)
// and returns the groups that may open one through its group bits, and the
// nodes that every account may open: what policy.Config.RestrictWarnings
// checks [restrict] against.
func NodeAccess(vendor Vendor, devDir string, ids []int) (groups, worldOpen []string) {
	if vendor == Auto || vendor == Unknown {
		vendor = NVIDIA
		if len(Found(Ascend, devDir)) > 0 {
			vendor = Ascend
		}
	}
	inv := &Inventory{Vendor: vendor, IDs: ids, DevDir: devDir}
	var paths []string
	for _, id := range inv.IDs {
		paths = append(paths, inv.Nodes(id)...)
	}
	paths = append(paths, inv.SharedNodes()...)
	for _, p := range paths {
		var st syscall.Stat_t
		if syscall.Stat(p, &st) != nil {
			continue
		}
		if st.Mode&0o006 != 0 {
			worldOpen = append(worldOpen, p)
		}
		if st.Mode&0o060 == 0 || st.Gid == 0 {
			continue // root's group holds no restricted account
		}
		name := strconv.FormatUint(uint64(st.Gid), 10)
		if g, err := user.LookupGroupId(name); err == nil {
			name = g.Name
		}
		if !slices.Contains(groups, name) {
			groups = append(groups, name)
		}
	}
	return groups, worldOpen
}

// EngineSockets are the container engines' sockets whose group
// may run containers as root: Docker's, and rootful Podman's API.
var EngineSockets = []string{"/var/run/docker.sock", "/run/docker.sock", "/run/podman/podman.sock"}

// EngineGroups returns the groups that may run containers as root: docker
// (Debian's docker.io makes it, and gives its socket to it) where it
// exists, and the group of each engine socket that others than root may
// open through its group bits: what policy.Config.EngineWarnings checks
// [restrict] against.
func EngineGroups(sockets []string) []string {
	var groups []string
	if _, err := user.LookupGroup("docker"); err == nil {
		groups = append(groups, "docker")
	}
	for _, p := range sockets {
		var st syscall.Stat_t
		if syscall.Stat(p, &st) != nil || st.Mode&0o060 == 0 || st.Gid == 0 {
			continue
		}
		name := strconv.FormatUint(uint64(st.Gid), 10)
		if g, err := user.LookupGroupId(name); err == nil {
			name = g.Name
		}
		if !slices.Contains(groups, name) {
			groups = append(groups, name)
		}
	}
	return groups
}

// Member tells whether user belongs to group, as its primary group or a
// supplementary one (through NSS).
func Member(name, group string) bool {
	u, err := user.Lookup(name)
	if err != nil {
		return false
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return false
	}
	gids, err := u.GroupIds()
	if err != nil {
		return u.Gid == g.Gid
	}
	return u.Gid == g.Gid || slices.Contains(gids, g.Gid)
}

// Members lists the users that the group database (through NSS, with
// getent) names as members of group; those whose primary group it is are
// not listed there, and so not here.
func Members(group string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "getent", "group", group).Output()
	if err != nil {
		return nil
	}
	f := strings.Split(strings.TrimSpace(string(out)), ":")
	if len(f) != 4 || f[0] != group || f[3] == "" {
		return nil
	}
	return strings.Split(f[3], ",")
}
