package wire

import (
	"encoding/json"
	"testing"

	"golang.org/x/sys/unix"
)

// TestContain: the container op goes as JSON with the lease's
// descriptors in the same packet, and waits for the broker's ok; a request
// naming a container is never the hand codec's (which does not know the
// field).
func TestContain(t *testing.T) {
	a, b := pair(t)
	c := &Conn{fd: a, path: "test", buf: make([]byte, MaxMessage), oob: make([]byte, oobSpace)}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	ref := &ContainerRef{Engine: "docker", ID: "c0ffee", Name: "train"}
	done := make(chan error, 1)
	go func() { done <- c.Contain(ref, []int{3}, []int{p[0]}) }()
	buf, oob := bufs()
	msg, fds, err := RecvMsg(b, buf, oob, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(fds)
	var req Request
	if err := json.Unmarshal(msg, &req); err != nil {
		t.Fatalf("%s: %v", msg, err)
	}
	if req.Op != OpContainer || req.V != Version || req.Container == nil || *req.Container != *ref || len(req.Devices) != 1 || req.Devices[0] != 3 {
		t.Errorf("sent %s", msg)
	}
	if len(fds) != 1 {
		t.Fatalf("%d descriptors came with it, want 1", len(fds))
	}
	if err := SendMsg(b, []byte(`{"v":1,"type":"ok"}`), nil, 0); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("Contain: %v", err)
	}
	if _, ok := appendRequest(nil, &Request{V: Version, Op: OpAcquire, Devices: []int{3}, User: "alice", Container: ref}); ok {
		t.Error("the hand codec encodes an acquire naming a container, and drops the container")
	}
}

// TestContainerRefCheck: what the broker takes as a container's engine, id
// and name (a name is shown in tables: no control characters).
func TestContainerRefCheck(t *testing.T) {
	id := "3f2a9c1d0b7e3f2a9c1d0b7e3f2a9c1d0b7e3f2a9c1d0b7e3f2a9c1d0b7e3f2a"
	for _, c := range []struct {
		ref ContainerRef
		ok  bool
	}{
		{ContainerRef{Engine: "docker", ID: id, Name: "train"}, true},
		{ContainerRef{Engine: "cri-o", ID: "pod_1.a-b"}, true},
		{ContainerRef{Engine: "", ID: id}, true},
		{ContainerRef{Engine: "Docker", ID: id}, false},
		{ContainerRef{Engine: "docker", ID: ""}, false},
		{ContainerRef{Engine: "docker", ID: "a/b"}, false},
		{ContainerRef{Engine: "docker", ID: string(make([]byte, 129))}, false},
		{ContainerRef{Engine: "docker", ID: id, Name: "x\x1b[2J"}, false},
		{ContainerRef{Engine: "docker", ID: id, Name: "x\u009b"}, false},
		{ContainerRef{Engine: "docker", ID: id, Name: "\xff"}, false},
	} {
		if err := c.ref.Check(); (err == nil) != c.ok {
			t.Errorf("%+v: %v, want ok %v", c.ref, err, c.ok)
		}
	}
}
