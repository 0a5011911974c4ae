package container

import (
	"bytes"
	"strings"

	"github.com/npurun/npurun/wire"
)

// FromCgroup names the container a process is in from its
// /proc/PID/cgroup, or returns nil for a process in none. From the host a
// container's processes have host pids and uid 0 (or a mapped uid); their
// control group is what names the container, in each engine's way:
//
//	docker, cgroupfs     /docker/ID
//	docker, systemd      /system.slice/docker-ID.scope
//	podman, cgroupfs     /libpod_parent/libpod-ID
//	podman, systemd      /machine.slice/libpod-ID.scope(/container)
//	containerd (CRI)     …/cri-containerd-ID.scope, or /kubepods/…/ID
//	CRI-O                …/crio-ID.scope
//
// where ID is the container's 64 hex digits. The first line that names one
// counts (every hierarchy names the same container). The ref's Cgroup is
// the path up to the group that names the container.
//
// Only the engines' own places are trusted: a group under a user's
// delegated subtree (user.slice, user@UID.service) is the user's to make,
// name and move processes into, so it names no container here (a user
// could wear another's container's id); a rootless engine's containers,
// which live there, are their user's processes, as any of hers.
func FromCgroup(data []byte) *wire.ContainerRef {
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		// hierarchy-ID:controllers:path
		i := bytes.IndexByte(line, ':')
		if i < 0 {
			continue
		}
		j := bytes.IndexByte(line[i+1:], ':')
		if j < 0 {
			continue
		}
		if c := fromPath(string(line[i+1+j+1:])); c != nil {
			return c
		}
	}
	return nil
}

// fromPath names the container of one cgroup path, nil for none.
func fromPath(path string) *wire.ContainerRef {
	parts := strings.Split(path, "/")
	for k, part := range parts {
		if userPlace(part) {
			return nil
		}
		at := func(engine, id string) *wire.ContainerRef {
			return &wire.ContainerRef{Engine: engine, ID: id, Cgroup: strings.Join(parts[:k+1], "/")}
		}
		for _, p := range [...]struct{ prefix, engine string }{
			{"docker-", "docker"}, {"libpod-", "podman"}, {"cri-containerd-", "containerd"}, {"crio-", "cri-o"},
		} {
			if id, ok := strings.CutPrefix(strings.TrimSuffix(part, ".scope"), p.prefix); ok && isID(id) {
				return at(p.engine, id)
			}
		}
		if isID(part) && k > 0 {
			switch {
			case parts[k-1] == "docker":
				return at("docker", part)
			case strings.HasPrefix(parts[1], "kubepods"):
				return at("containerd", part)
			}
		}
	}
	return nil
}

// userPlace tells whether a group of this name starts a place that systemd
// gives users (user.slice, user-UID.slice, user@UID.service): below it, a
// user makes groups.
func userPlace(part string) bool {
	return part == "user.slice" || strings.HasPrefix(part, "user@") && strings.HasSuffix(part, ".service") ||
		strings.HasPrefix(part, "user-") && strings.HasSuffix(part, ".slice")
}

// isID tells whether s is a container id: 64 lowercase hex digits.
func isID(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
