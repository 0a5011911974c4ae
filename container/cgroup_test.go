package container

import (
	"strings"
	"testing"
)

func TestFromCgroup(t *testing.T) {
	id := strings.Repeat("c44f463c", 8)
	for _, tc := range []struct {
		name, data   string
		engine, want string
		cgroup       string
	}{
		{"docker cgroupfs, v1 (as seen here)", "9:name=systemd:/docker/" + id + "\n8:pids:/docker/" + id + "\n0::/\n", "docker", id, "/docker/" + id},
		{"docker systemd", "0::/system.slice/docker-" + id + ".scope\n", "docker", id, "/system.slice/docker-" + id + ".scope"},
		{"podman cgroupfs (as seen here)", "4:memory:/libpod_parent/libpod-" + id + "\n", "podman", id, "/libpod_parent/libpod-" + id},
		{"podman systemd, nested", "0::/machine.slice/libpod-" + id + ".scope/container\n", "podman", id, "/machine.slice/libpod-" + id + ".scope"},
		{"containerd CRI", "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-" + id + ".scope\n", "containerd", id, "/kubepods.slice/kubepods-pod1.slice/cri-containerd-" + id + ".scope"},
		{"kubepods cgroupfs", "0::/kubepods/besteffort/pod1/" + id + "\n", "containerd", id, "/kubepods/besteffort/pod1/" + id},
		{"cri-o", "0::/kubepods.slice/crio-" + id + ".scope\n", "cri-o", id, "/kubepods.slice/crio-" + id + ".scope"},
		// A user's delegated subtree is hers to make groups in, of any
		// name (issue 27.2): none there names a container.
		{"a user's docker-ID.scope", "0::/user.slice/user-1000.slice/user@1000.service/docker-" + id + ".scope\n", "", "", ""},
		{"a user's docker/ID", "0::/user.slice/user-1000.slice/user@1000.service/app.slice/docker/" + id + "\n", "", "", ""},
		{"rootless podman", "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-" + id + ".scope/container\n", "", "", ""},
		{"a user's, then root's", "1:name=systemd:/user.slice/user-1000.slice/user@1000.service/docker-" + id + ".scope\n2:pids:/docker/" + id + "\n", "docker", id, "/docker/" + id},
		{"the host", "0::/\n4:memory:/user.slice\n", "", "", ""},
		{"conmon is no container", "4:memory:/libpod_parent/conmon\n", "", "", ""},
		{"a short id is none", "0::/docker/abc\n", "", "", ""},
		{"garbage", "nonsense\n::\n", "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := FromCgroup([]byte(tc.data))
			switch {
			case tc.want == "" && c != nil:
				t.Errorf("FromCgroup = %+v, want none", c)
			case tc.want != "" && (c == nil || c.Engine != tc.engine || c.ID != tc.want || c.Cgroup != tc.cgroup):
				t.Errorf("FromCgroup = %+v, want %s %s in %s", c, tc.engine, tc.want, tc.cgroup)
			}
		})
	}
}
