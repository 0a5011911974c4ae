package status

import (
	"fmt"
	"testing"

	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/wire"
)

// TestContainerNames: the names the runtime told are kept for the
// containers found by id alone, the least recently used going first past
// the cap, and hidden where show says so.
func TestContainerNames(t *testing.T) {
	var c containerNames
	for i := range maxContainerNames + 1 {
		c.put(&wire.ContainerRef{Engine: "docker", ID: fmt.Sprint(i), Name: fmt.Sprint("n", i)}, 0)
		if i == 0 {
			c.named(&wire.ContainerRef{ID: "0"}, true) // used: kept past the cap
		}
		if i == 1 {
			c.put(&wire.ContainerRef{ID: "0", Name: "n0"}, 0)
		}
	}
	if got := c.named(&wire.ContainerRef{Engine: "docker", ID: "0"}, true); got.Name != "n0" {
		t.Errorf("container 0, used lately: %+v, want its name n0", got)
	}
	if got := c.named(&wire.ContainerRef{ID: "1"}, true); got.Name != "" {
		t.Errorf("container 1, the least recently used past the cap: %+v, want no name", got)
	}
	if len(c.byID) != maxContainerNames {
		t.Errorf("%d names kept, want %d", len(c.byID), maxContainerNames)
	}
	ref := &wire.ContainerRef{Engine: "docker", ID: "7"}
	if got := c.named(ref, false); got.Name != "" || got.ID != "7" || ref.Name != "" {
		t.Errorf("hidden: %+v (the ref given: %+v), want the id, no name, the ref unchanged", got, ref)
	}
	if c.named(nil, true) != nil {
		t.Error("no container named one")
	}
}

// TestOneContainer: a lease found held at start is a container's when all
// its holders are in that one container, podman's conmon (outside it)
// aside.
func TestOneContainer(t *testing.T) {
	a, b := &wire.ContainerRef{Engine: "podman", ID: "a"}, &wire.ContainerRef{Engine: "podman", ID: "b"}
	res := &procscan.Result{Info: map[int]*procscan.Proc{
		10: {PID: 10, Container: a}, 11: {PID: 11, Container: a}, 12: {PID: 12, Comm: "conmon"},
		13: {PID: 13, Container: b}, 14: {PID: 14, Comm: "sleep"},
	}}
	for _, c := range []struct {
		pids []int
		want *wire.ContainerRef
	}{
		{[]int{10, 11}, a}, {[]int{12, 10}, a}, {[]int{10, 13}, nil}, {[]int{10, 14}, nil}, {[]int{12}, nil}, {nil, nil},
	} {
		if got := oneContainer(res, c.pids); got != c.want {
			t.Errorf("holders %v: %+v, want %+v", c.pids, got, c.want)
		}
	}
}

// TestContainerNamesGroup (issue 27.2): where root's runtime told the
// group a container was made in, a process whose group names that
// container's id elsewhere is shown in no container; one in the group is
// shown by the container's label (no group, no pid); a uid that did not
// name a container may not name it.
func TestContainerNamesGroup(t *testing.T) {
	var c containerNames
	made := &wire.ContainerRef{Engine: "docker", ID: "x", Name: "train", Cgroup: "/system.slice/docker-x.scope", PID: 42}
	if !c.put(made, 0) {
		t.Fatal("root may name any container")
	}
	if got := c.named(&wire.ContainerRef{Engine: "docker", ID: "x", Cgroup: "/system.slice/docker-x.scope"}, true); got == nil || got.Name != "train" || got.Cgroup != "" || got.PID != 0 {
		t.Errorf("a process in the container's group: %+v, want its label, named train", got)
	}
	if got := c.named(&wire.ContainerRef{Engine: "docker", ID: "x", Cgroup: "/elsewhere/docker-x.scope"}, true); got != nil {
		t.Errorf("a process in another group of that id: %+v, want no container", got)
	}
	// A later word without the group (a label) keeps it.
	c.put(&wire.ContainerRef{Engine: "docker", ID: "x", Name: "train2"}, 0)
	if got := c.named(&wire.ContainerRef{Engine: "docker", ID: "x", Cgroup: "/elsewhere/docker-x.scope"}, true); got != nil {
		t.Errorf("after a label: a process in another group: %+v, want no container", got)
	}
	if c.put(&wire.ContainerRef{Engine: "docker", ID: "x", Name: "mine"}, 1000) || c.mayName(made, 1000) {
		t.Error("uid 1000 may name root's container")
	}
	if !c.put(&wire.ContainerRef{Engine: "podman", ID: "y", Name: "hers"}, 1000) || c.put(&wire.ContainerRef{Engine: "podman", ID: "y", Name: "his"}, 1001) {
		t.Error("a uid names a container of its own, and another uid may not rename it")
	}
}
