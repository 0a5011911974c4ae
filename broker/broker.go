// Package broker is the npubroker daemon: it owns the device locks, queues the requests and hands out leases.
package broker

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
)

// Defaults of a production install.
const (
	DefaultRunDir = "/run/npurun"
	DefaultConfig = "/etc/npurun/npurun.conf"
)

// progressDelay is how long position updates are gathered before they are
// sent, so that a burst of grants costs one update per waiter, not one per
// grant.
const progressDelay = 50 * time.Millisecond

// Options configure a Server.
type Options struct {
	Config    *policy.Config
	Inventory *npu.Inventory
	RunDir    string // lock files go to RunDir/locks
	Log       *log.Logger
}

// Server is a running broker.
type Server struct {
	cfg   *policy.Config
	inv   *npu.Inventory
	locks string
	log   *log.Logger
	users accounts

	pools  map[string][]int // pool name -> ids
	poolOf map[int]string   // device id -> pool name

	mu      sync.Mutex
	devs    []*device // indexed by physical id; nil where not managed
	nfree   int
	held    map[uint32]int // devices held per uid, from this broker's grants
	q       *Queue
	conns   int
	pending bool // a progress update is scheduled
}

// New prepares a broker: the lock directory, the lock files, and the
// occupancy found in them (a device whose lock is held stays held).
func New(o Options) (*Server, error) {
	if o.Log == nil {
		o.Log = log.New(os.Stderr, "npubroker: ", 0)
	}
	s := &Server{
		cfg:    o.Config,
		inv:    o.Inventory,
		locks:  filepath.Join(o.RunDir, "locks"),
		log:    o.Log,
		pools:  map[string][]int{},
		poolOf: map[int]string{},
		held:   map[uint32]int{},
		q:      NewQueue(),
	}
	for _, p := range o.Config.Pools {
		ids := p.IDs
		if ids == nil {
			ids = o.Inventory.IDs
		}
		s.pools[p.Name] = ids
		for _, id := range ids {
			s.poolOf[id] = p.Name
		}
	}
	if err := prepareLockDir(s.locks); err != nil {
		return nil, err
	}
	maxID := 0
	for _, id := range s.inv.IDs {
		maxID = max(maxID, id)
	}
	s.devs = make([]*device, maxID+1)
	for _, id := range s.inv.IDs {
		d := &device{id: id, path: LockPath(s.locks, id), fd: -1}
		fd, free, err := tryLock(d.path)
		if err != nil {
			return nil, err
		}
		s.devs[id] = d
		if free {
			d.fd = fd
			s.nfree++
		} else {
			d.since = time.Now()
			s.log.Printf("npu %d is held by a lease from before this start; waiting for its release", id)
			go s.watch(d, fd)
		}
	}
	if s.inv.Note != "" {
		s.log.Print(s.inv.Note)
	}
	return s, nil
}

// watch waits in flock on fd, a second open of d's lock file, until the
// lease's process tree is gone; then d is free, locked by fd.
func (s *Server) watch(d *device, fd int) {
	if err := flock(fd, false); err != nil {
		// Nothing else can be done with this device; keep it out of use
		// rather than risk a double grant.
		s.log.Printf("npu %d: wait for release: %v; device taken out of service", d.id, err)
		unix.Close(fd)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d.fd = fd
	if d.leased {
		if s.held[d.holder]--; s.held[d.holder] <= 0 {
			delete(s.held, d.holder)
		}
	}
	d.leased = false
	s.nfree++
	s.scheduleLocked()
}

// Listen opens the broker's socket at path. A socket file left by a broker
// that is gone is replaced; one that answers is an error.
func Listen(path string) (*net.UnixListener, error) {
	if c, err := client.Dial(path); err == nil {
		c.Close()
		return nil, fmt.Errorf("listen %s: another broker is serving there", path)
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err == nil {
		if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			return nil, fmt.Errorf("listen %s: exists and is not a socket", path)
		}
		if err := unix.Unlink(path); err != nil {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	// Everyone may connect: identity comes from SO_PEERCRED and the
	// policy decides what each user gets.
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// Serve accepts connections until ctx is done.
func (s *Server) Serve(ctx context.Context, ln *net.UnixListener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
				s.log.Printf("accept: %v", err)
				time.Sleep(100 * time.Millisecond)
				continue
			}
			return fmt.Errorf("accept: %w", err)
		}
		go s.handle(c)
	}
}

// poolName resolves the pool a request names; "" is the default pool.
func (s *Server) poolName(name string) string {
	if name == "" {
		return s.cfg.DefaultPool
	}
	return name
}

func poolList(s *Server) string {
	var names []string
	for _, p := range s.cfg.Pools {
		names = append(names, p.Name)
	}
	return strings.Join(names, ", ")
}
