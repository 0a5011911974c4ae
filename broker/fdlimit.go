package broker

import (
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/status"
	"github.com/npurun/npurun/broker/tasks/local"
)

// Descriptors. Each client connection costs the broker one, and
// connections must never take the descriptors that a device needs to come
// back into service (its fresh lock file, the watcher's open of it, its
// node opened for its ACL), nor those of the tasks and of the broker
// itself: out of descriptors, devices would leave service while waiting
// clients wait on. So the connections served at once are capped below
// RLIMIT_NOFILE by a reserve, whatever max_connections says:
//
//   - what the broker holds once started (fdBase: its log, socket,
//     journal, claims, the free devices' lock files and their second
//     opens), read from /proc/self/fd at the end of New;
//   - two more per device (a leased device holds its watcher's open and
//     the fresh lock file made ahead for the next lease: three, where a
//     free one holds two, and one held at start one);
//   - two per task that may run at once (a supervisor's pidfd and
//     socket), for the devices and the CPU slots, and for the warm and
//     idle supervisors;
//   - the metrics endpoint's connections, and a margin for what comes and
//     goes (a node opened for its ACL, /proc, the user database, a
//     signal's pidfd, the accounting log's rotation);
//   - and, counted as they come and go, the pidfds of the processes the
//     ender waits on (leaseend) and the old lock files of leases it ended
//     while a descriptor in flight held them (lease.Table.Stale).
//
// The limit is read again at a connection a second after the last
// reading (a getrlimit costs a microsecond here, on every npurun's path),
// so that a limit changed while the broker runs (prlimit(1)) counts within
// a second.

// fdMargin is the reserve's margin for descriptors held for a moment.
const fdMargin = 32

// minConns is the fewest connections served whatever the limit: with
// fewer nobody could even ask. A limit that leaves fewer than this is
// said at start.
const minConns = 8

// fdReserve sets the descriptors kept from connections, once New has
// opened what the broker holds for its life.
func (s *Server) fdReserve() {
	base := 0
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		base = len(ents) - 1 // less ReadDir's own
	}
	procs := len(s.inv.IDs) + s.policy().Tasks.CPUSlots + local.MaxReady + local.MaxNotices
	s.fdKeep = base + 2*len(s.inv.IDs) + 2*procs + status.MaxMetricsConns + fdMargin
	if n := nofile(); n-s.fdKeep < minConns {
		s.log.Printf("warning: RLIMIT_NOFILE is %d, and the broker keeps %d descriptors for its devices, tasks and itself: it serves %d connections at once at most; raise the limit (LimitNOFILE= in the service)", n, s.fdKeep, minConns)
	}
}

// nofileCache is the soft limit on open descriptors, as last read.
type nofileCache struct {
	n, at atomic.Int64 // the limit; when it was read (Unix nanoseconds)
}

// get is the limit, read again if the last reading is a second old.
func (c *nofileCache) get() int {
	now := time.Now().UnixNano()
	if now-c.at.Load() < int64(time.Second) {
		return int(c.n.Load())
	}
	n := nofile()
	c.n.Store(int64(n))
	c.at.Store(now)
	return n
}

// nofile is the broker's soft limit on open descriptors.
func nofile() int {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<30 {
		return 1 << 30
	}
	return int(rl.Cur)
}

// connCap is how many connections the broker serves at once now: its
// max_connections, less where RLIMIT_NOFILE leaves less room above the
// reserve. fromLimit tells that the limit decided.
func (s *Server) connCap() (n int, fromLimit bool) {
	room := max(s.nofile.get()-s.fdKeep-s.ender.Descriptors()-s.table.Stale(), minConns)
	if room < s.policy().MaxConnections {
		return room, true
	}
	return s.policy().MaxConnections, false
}
