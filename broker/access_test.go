package broker

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
)

// TestGrantAllowsOnce: a restricted account's grant of two devices adds
// its ACL entry to each node once (the two device nodes and the three
// control nodes: five), not once for the grant and again per device as it
// is handed to its watcher. Each call reads a node's ACL under the
// broker's lock. A real broker on real character nodes, asked by root on
// behalf of the restricted account nobody.
func TestGrantAllowsOnce(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("this test needs root (device nodes and their ACLs), and CI=true: run CI as root")
		}
		t.Skip("needs root: device nodes and their ACLs")
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("no account nobody: %v", err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	// The lease ends last, once the broker has stopped and its
	// directories are gone: its watchers then write nothing there.
	var fds []int
	t.Cleanup(func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	})
	dev := t.TempDir()
	for _, name := range []string{"davinci0", "davinci1", "davinci_manager", "devmm_svm", "hisi_hdc"} {
		if err := unix.Mknod(filepath.Join(dev, name), unix.S_IFCHR|0o660, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := policy.Parse("npurun.conf", fmt.Appendf(nil, "[devices]\nvendor = \"ascend\"\nids = \"0-1\"\ndev_dir = %q\nnpu_smi = %q\n\n[restrict]\nusers = [\"nobody\"]\n",
		dev, filepath.Join(dev, "no-npu-smi")))
	if err != nil {
		t.Fatal(err)
	}
	inv, err := npu.Discover(npu.Vendor(cfg.Vendor), cfg.IDs, cfg.DevDir, cfg.NPUSmi)
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var calls []string
	allowUser = func(path string, uid uint32) error {
		mu.Lock()
		calls = append(calls, filepath.Base(path))
		mu.Unlock()
		return npu.AllowUser(path, uid)
	}
	t.Cleanup(func() { allowUser = npu.AllowUser })

	run := t.TempDir()
	sock := filepath.Join(run, "broker.sock")
	ln, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Config: cfg, Inventory: inv, RunDir: run, StateDir: filepath.Join(run, "spool"),
		Socket: sock, Cgroup: "off", Log: log.New(io.Discard, "", 0)})
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		stop()
		<-served
	})

	// Each device's watcher makes the next lease's lock file as the lease
	// begins: awaited below, so that nothing is written in the run
	// directory while it is removed.
	ifd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ifd)
	locks := filepath.Join(run, "locks")
	if _, err := unix.InotifyAddWatch(ifd, locks, unix.IN_CREATE); err != nil {
		t.Fatal(err)
	}

	c, err := client.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Send(&client.Request{Op: client.OpAcquire, N: 2, User: "nobody", NoWait: true}); err != nil {
		t.Fatal(err)
	}
	var r *client.Reply
	r, fds, err = c.Recv(10 * time.Second)
	if err != nil || r.Type != client.TypeGrant || len(r.Devices) != 2 {
		t.Fatalf("acquire 2 on behalf of nobody: %+v, %v; want a grant of 2", r, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, name := range []string{".npu0.lock.new", ".npu1.lock.new"} {
		for {
			if _, err := os.Lstat(filepath.Join(locks, name)); err == nil {
				break
			}
			ms := int(time.Until(deadline) / time.Millisecond)
			if ms <= 0 {
				t.Fatalf("the watcher did not make %s", name)
			}
			if n, _ := unix.Poll([]unix.PollFd{{Fd: int32(ifd), Events: unix.POLLIN}}, ms); n > 0 {
				unix.Read(ifd, make([]byte, 4096))
			}
		}
	}
	mu.Lock()
	got := slices.Clone(calls)
	mu.Unlock()
	slices.Sort(got)
	if want := []string{"davinci0", "davinci1", "davinci_manager", "devmm_svm", "hisi_hdc"}; !slices.Equal(got, want) {
		t.Errorf("ACL entries added for the grant: %v, want each node once: %v", got, want)
	}
	// The one pass did open the devices.
	if uids, err := npu.ACLUsers(filepath.Join(dev, "davinci1")); err != nil || !slices.Contains(uids, uint32(uid)) {
		t.Errorf("davinci1's ACL names %v (%v) during the lease, not nobody (%d)", uids, err, uid)
	}
}
