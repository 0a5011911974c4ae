package supervisor

import (
	"bytes"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Everything a task starts stays below its supervisor: the supervisor is a
// child subreaper (PR_SET_CHILD_SUBREAPER), so a process whose parent dies
// (a daemon's double fork, `cmd &` in a shell that exits) is handed to the
// supervisor, not to init, whatever process group or session it made for
// itself. When the task ends — its leader exits, its time limit passes, it
// is cancelled — the supervisor ends all of that tree, not only the
// leader's process group, and reports the end only once the tree is gone
// (or killFor has passed): by then no process of the task holds its lease.
//
// A supervisor that is killed itself cannot do this; the broker then ends
// what is left (the task's control group, or its session: npubroker(8)).

// killFor bounds how long the supervisor goes on killing what is left of
// a task (processes it may not signal, set-user-ID ones, or stuck in the
// kernel) before it reports the end anyway.
const killFor = 10 * time.Second

// rekillEvery is how often the kill is repeated while processes remain: a
// process forked between a scan and the kill is caught by the next.
const rekillEvery = 50 * time.Millisecond

// becomeSubreaper makes orphans of the task's tree the supervisor's
// children.
func becomeSubreaper() error {
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}

// reaper waits for every child of the supervisor: the task's leader, and
// the orphans handed to the supervisor. Nothing else in the supervisor
// waits for children.
type reaper struct {
	leader     int
	leaderDone chan struct{}   // closed once the leader is reaped
	status     unix.WaitStatus // the leader's, once leaderDone is closed
	allGone    chan struct{}   // closed once the supervisor has no child left
	reaped     chan struct{}   // a child was reaped (buffered: a wake-up, not a count)
}

// startReaper starts reaping, once the leader is started.
func startReaper(leader int) *reaper {
	r := &reaper{leader: leader, leaderDone: make(chan struct{}), allGone: make(chan struct{}), reaped: make(chan struct{}, 1)}
	go r.run()
	return r
}

func (r *reaper) run() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil { // ECHILD: no child, so no descendant, is left
			close(r.allGone)
			return
		}
		if pid == r.leader {
			r.status = ws
			close(r.leaderDone)
		}
		select {
		case r.reaped <- struct{}{}:
		default:
		}
	}
}

// leftBehind counts the processes still running below the supervisor. A
// subreaper with no child has no descendant at all (an orphan becomes its
// child), so the usual end, a command that leaves nothing behind, costs
// no walk of /proc, which a machine of many processes makes dear.
func leftBehind() int {
	var info unix.Siginfo
	if unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil) == unix.ECHILD {
		return 0
	}
	return len(descendants(os.Getpid()))
}

// descendant is a process below the supervisor, with its start time (in
// clock ticks since boot) against the reuse of its pid.
type descendant struct {
	pid   int
	start uint64
	live  bool // not a zombie
}

// descendants lists the processes below pid root, from /proc.
func descendants(root int) []descendant {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]descendant{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, start, live, ok := procStat(pid)
		if ok {
			children[ppid] = append(children[ppid], descendant{pid, start, live})
		}
	}
	var out []descendant
	next := []int{root}
	for len(next) > 0 {
		p := next[len(next)-1]
		next = next[:len(next)-1]
		for _, c := range children[p] {
			if c.live {
				out = append(out, c)
			}
			next = append(next, c.pid)
		}
	}
	return out
}

// procStat reads a process's parent, start time and whether it is alive
// (not a zombie) from /proc/PID/stat.
func procStat(pid int) (ppid int, start uint64, live, ok bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false, false
	}
	// The name, in parentheses, may hold anything: the fields follow the
	// last ')'. State is field 3, ppid 4, starttime 22.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, 0, false, false
	}
	f := bytes.Fields(data[i+1:])
	if len(f) < 20 {
		return 0, 0, false, false
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	start, err2 := strconv.ParseUint(string(f[19]), 10, 64)
	live = string(f[0]) != "Z" && string(f[0]) != "X"
	return ppid, start, live, err1 == nil && err2 == nil
}

// signalTree sends sig to every process below the supervisor. Each is pinned with a pidfd and its start time
// checked before the signal, so a pid reused meanwhile is left alone.
func signalTree(sig unix.Signal) {
	for _, d := range descendants(os.Getpid()) {
		fd, err := unix.PidfdOpen(d.pid, 0)
		if err != nil {
			continue
		}
		if _, start, _, ok := procStat(d.pid); ok && start == d.start {
			_ = unix.PidfdSendSignal(fd, sig, nil, 0) // gone meanwhile: ESRCH
		}
		unix.Close(fd)
	}
}
