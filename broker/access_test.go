package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
	"github.com/npurun/npurun/wire"
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

	c, err := wire.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Send(&wire.Request{Op: wire.OpAcquire, N: 2, User: "nobody", NoWait: true}); err != nil {
		t.Fatal(err)
	}
	var r *wire.Reply
	r, fds, err = c.Recv(10 * time.Second)
	if err != nil || r.Type != wire.TypeGrant || len(r.Devices) != 2 {
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

// aclBroker serves a real broker on real character nodes in a temporary
// tree (davinci0..n-1 and the control nodes), restricting the account
// nobody; it returns the broker, its socket, the tree and nobody's uid.
func aclBroker(t *testing.T, n int) (*Server, string, string, uint32) {
	t.Helper()
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
	dev := t.TempDir()
	names := []string{"davinci_manager", "devmm_svm", "hisi_hdc"}
	for i := range n {
		names = append(names, fmt.Sprintf("davinci%d", i))
	}
	for _, name := range names {
		if err := unix.Mknod(filepath.Join(dev, name), unix.S_IFCHR|0o660, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := policy.Parse("npurun.conf", fmt.Appendf(nil, "[devices]\nvendor = \"ascend\"\nids = \"0-%d\"\ndev_dir = %q\nnpu_smi = %q\n\n[restrict]\nusers = [\"nobody\"]\n",
		n-1, dev, filepath.Join(dev, "no-npu-smi")))
	if err != nil {
		t.Fatal(err)
	}
	inv, err := npu.Discover(npu.Vendor(cfg.Vendor), cfg.IDs, cfg.DevDir, cfg.NPUSmi)
	if err != nil {
		t.Fatal(err)
	}
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
	return s, sock, dev, uint32(uid)
}

// TestRevokeFailsClosed: when the ACL entry of a restricted account whose
// lease has ended cannot be removed (here the removal fails as it does out
// of descriptors), the device is out of service, and a waiting request is
// not granted it, until a later try removes the entry.
func TestRevokeFailsClosed(t *testing.T) {
	s, sock, dev, uid := aclBroker(t, 1)
	var failing atomic.Bool
	tries := make(chan string, 64) // each failed removal
	s.acc.mu.Lock()
	s.acc.removeUsers = func(path string, managed func(uint32) bool) ([]uint32, error) {
		if failing.Load() {
			select {
			case tries <- path:
			default:
			}
			return nil, fmt.Errorf("open %s: %w", path, unix.EMFILE)
		}
		return npu.RemoveUsers(path, managed)
	}
	s.acc.mu.Unlock()
	node := filepath.Join(dev, "davinci0")
	named := func() bool {
		uids, err := npu.ACLUsers(node)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Contains(uids, uid)
	}
	awaitTry := func(what string) {
		t.Helper()
		select {
		case <-tries:
		case <-time.After(10 * time.Second):
			t.Fatalf("no removal tried %s", what)
		}
	}

	lessee, err := wire.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer lessee.Close()
	lessee.Send(&wire.Request{Op: wire.OpAcquire, N: 1, User: "nobody", NoWait: true})
	r, fds, err := lessee.Recv(10 * time.Second)
	if err != nil || r.Type != wire.TypeGrant {
		t.Fatalf("acquire on behalf of nobody: %+v, %v; want a grant", r, err)
	}
	if !named() {
		t.Fatal("during nobody's lease davinci0's ACL does not name it")
	}
	failing.Store(true)
	for _, fd := range fds {
		unix.Close(fd) // the lease ends
	}
	awaitTry("when the lease ended")

	waiter, err := wire.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	waiter.Send(&wire.Request{Op: wire.OpAcquire, N: 1})
	r, _, err = waiter.Recv(10 * time.Second)
	if err != nil || r.Type != wire.TypeQueued {
		t.Fatalf("acquire while the revoke fails: %+v, %v; want it queued", r, err)
	}
	awaitTry("again")
	awaitTry("yet again") // the waiter was in line for a whole retry
	states := s.status.States()
	if states[0] != wire.DeviceOut {
		t.Errorf("npu 0 while its node's entries cannot be removed: %s, want %s", states[0], wire.DeviceOut)
	}
	for {
		r, fds, err := waiter.Recv(100 * time.Millisecond) // what came meanwhile
		if errors.Is(err, wire.ErrTimeout) {
			break
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
		if err != nil || r.Type != wire.TypeQueued {
			t.Fatalf("while nobody's entry is still on davinci0 the waiter got %+v, %v", r, err)
		}
	}
	if !named() {
		t.Fatal("the entry went although every removal failed: the test shows nothing")
	}

	failing.Store(false)
	for {
		r, fds, err := waiter.Recv(10 * time.Second)
		if err != nil {
			t.Fatalf("once the entry can be removed: %v; want a grant", err)
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
		if r.Type == wire.TypeGrant {
			break
		}
	}
	if named() {
		t.Error("npu 0 was granted again with nobody's entry still on davinci0")
	}
	// The waiter's lease ended as its descriptors were closed: the broker
	// puts a fresh lock file in locks/ as it takes the device back. Wait
	// for that before the test's directories are removed, which failed
	// once with "locks: directory not empty" (the file came meanwhile).
	for deadline := time.Now().Add(10 * time.Second); s.status.States()[0] != wire.DeviceFree; {
		if time.Now().After(deadline) {
			t.Fatalf("npu 0 not free again 10s after its last lease ended: %s", s.status.States()[0])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestGroupLookupFailsClosed: an account whose groups cannot be read (the
// user database fails, as NSS does out of descriptors or with LDAP down)
// is taken as restricted where [restrict] names a group: its ACL entries
// are the broker's to remove, not left on a device granted to someone
// else. "No such group" is an answer, not a failure.
func TestGroupLookupFailsClosed(t *testing.T) {
	nssDown := errors.New("nss: connection refused")
	ids := func() ([]string, error) { return []string{"1000", "1001"}, nil }
	cases := []struct {
		name      string
		groupIDs  func() ([]string, error)
		lookup    func(string) (*user.Group, error)
		wantNames []string
		wantErr   bool
	}{
		{"every group found", ids, func(gid string) (*user.Group, error) { return &user.Group{Gid: gid, Name: "g" + gid}, nil }, []string{"g1000", "g1001"}, false},
		{"a group that does not exist", ids, func(gid string) (*user.Group, error) {
			if gid == "1001" {
				return nil, user.UnknownGroupIdError(gid)
			}
			return &user.Group{Gid: gid, Name: "g" + gid}, nil
		}, []string{"g1000"}, false},
		{"a group lookup fails", ids, func(gid string) (*user.Group, error) {
			if gid == "1001" {
				return nil, nssDown
			}
			return &user.Group{Gid: gid, Name: "g" + gid}, nil
		}, []string{"g1000"}, true},
		{"the group list fails", func() ([]string, error) { return nil, nssDown }, nil, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			names, _, err := accountGroups(tc.groupIDs, tc.lookup)
			if !slices.Equal(names, tc.wantNames) || (err != nil) != tc.wantErr {
				t.Errorf("groups %v, error %v; want %v, an error: %v", names, err, tc.wantNames, tc.wantErr)
			}
		})
	}

	cfg, err := policy.Parse("npurun.conf", []byte("[devices]\nvendor = \"ascend\"\n\n[restrict]\ngroups = [\"students\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	s := &access{inv: &npu.Inventory{Vendor: npu.Ascend}, users: &accounts{}}
	s.setPolicy(cfg)
	_, _, lookupErr := accountGroups(ids, func(string) (*user.Group, error) { return nil, nssDown })
	s.users.store(2001, &account{name: "stu1", known: true, groupsErr: lookupErr, at: time.Now()})
	s.users.store(2002, &account{name: "staff1", known: true, groups: []string{"staff"}, at: time.Now()})
	s.users.store(2003, &account{name: "stu2", known: true, groups: []string{"students"}, at: time.Now()})
	for _, tc := range []struct {
		uid  uint32
		want bool
	}{{2001, true}, {2002, false}, {2003, true}} {
		if got := s.managed(tc.uid); got != tc.want {
			t.Errorf("uid %d: managed %v, want %v", tc.uid, got, tc.want)
		}
		if got := s.restricted(tc.uid); got != tc.want {
			t.Errorf("uid %d: restricted %v, want %v", tc.uid, got, tc.want)
		}
	}
	// Restricted by name only: groups do not matter.
	if cfg, err = policy.Parse("npurun.conf", []byte("[devices]\nvendor = \"ascend\"\n\n[restrict]\nusers = [\"stu9\"]\n")); err != nil {
		t.Fatal(err)
	}
	s.pol.Store(nil) // a broker started with this policy, not reloaded to it
	s.setPolicy(cfg)
	if s.managed(2001) {
		t.Error("with [restrict] naming no group, an account whose groups failed is taken as restricted")
	}
}

// TestReloadKeepsManaged: a reload that lifts a restriction gives no new
// entries to the account it freed, but its entries stay the broker's to
// remove (a lease granted before the reload added one, and its end must
// take it away); a reload that restricts an account gives it entries
// from its next grant.
func TestReloadKeepsManaged(t *testing.T) {
	parse := func(text string) *policy.Config {
		t.Helper()
		cfg, err := policy.Parse("npurun.conf", []byte("[devices]\nvendor = \"ascend\"\n"+text))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	a := &access{inv: &npu.Inventory{Vendor: npu.Ascend}, users: &accounts{}}
	a.setPolicy(parse("[restrict]\nusers = [\"stu1\"]\n"))
	a.users.store(2001, &account{name: "stu1", known: true, at: time.Now()})
	a.users.store(2002, &account{name: "stu2", known: true, groups: []string{"students"}, at: time.Now()})
	if !a.restricted(2001) || !a.managed(2001) || a.restricted(2002) || a.managed(2002) {
		t.Fatal("before the reload: want stu1 restricted and managed, stu2 neither")
	}
	a.setPolicy(parse("[restrict]\ngroups = [\"students\"]\n"))
	if a.restricted(2001) {
		t.Error("stu1, whose restriction the reload lifted, is given entries")
	}
	if !a.managed(2001) {
		t.Error("stu1's entries, added under the policy before the reload, are not the broker's to remove after it")
	}
	if !a.restricted(2002) || !a.managed(2002) {
		t.Error("stu2, restricted by the reload (group students), is not given entries")
	}
	a.setPolicy(parse(""))
	if !a.aclsManaged() || !a.managed(2001) || !a.managed(2002) {
		t.Error("with no [restrict] after a reload, the entries of earlier policies are left behind")
	}
}
