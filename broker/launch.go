package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/tasklife"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
)

// A task runs under a supervisor, `npurun-supervise [ID]` (package
// supervisor; the program is found and checked in supervisorbin.go),
// started as the submitter in a session of its own. Its standard input is
// a SOCK_SEQPACKET socket to the broker carrying two messages: the Spec,
// and, once the task is granted and its start is durable in the journal,
// the go-ahead: the devices, their variables and their lock descriptors
// (SCM_RIGHTS). A supervisor that sees the socket close first exits having
// run nothing. So a grant costs one message, not a process start, wherever
// a supervisor could be started beforehand; and a broker that dies before
// the start record is on disk leaves nothing running that the journal does
// not know.
//
// Supervisors are started beforehand in two ways:
//
//   - warm: for the first task waiting in each pool (at most maxWarm), with
//     its Spec at once, so that it opens the log and finds the program
//     while the task waits;
//   - idle (idle.go): after a user's task has started, one supervisor is
//     kept ready for that user's next task, in no task yet, for
//     idleFor; the next task of that user (submitted to an idle queue, or
//     granted from the line) takes it instead of starting one.
//
// A task's processes are started in one place, execSupervisor (directly
// in the task's control group, where there are control groups: cgroup.go;
// an idle supervisor is moved into its task's group before it is given its
// Spec, so nothing of a task ever runs outside the group), and ended in
// one place, endProcesses (and, at the task's end, its group's removal,
// reapCgroup).
//
// When a start cannot be made for a reason that passes (the journal cannot
// be written, the broker is out of descriptors or processes), the task goes
// back to its place in line and the broker starts no task until it has
// tried again, with a growing wait; leases are served meanwhile.

// maxWarm bounds the supervisors started ahead of their grant.
const maxWarm = 8

// supervisor is a task's supervisor process, or an idle one.
type supervisor struct {
	pid    int
	start  uint64        // its start time, against pid reuse
	sock   *os.File      // the broker's end of its standard input
	exited chan struct{} // closed once it has exited and been reaped
	err    error         // why it could not be started, or given its task
	ready  chan struct{} // closed once it has its task's Spec (or failed)

	// Its credentials, as started: an idle one is given only a task of
	// the same account.
	uid  uint32
	gid  uint32
	gids []uint32

	t       *task         // its task; nil while idle (s.mu)
	started chan struct{} // idle: closed once its process exists (or failed: err)
	expire  *time.Timer   // idle: lets it go after idleFor
	group   uint64        // idle: its own control group, idle-N (0: none)

	mu   sync.Mutex // dead, against a move of its pid once it may be reused
	dead bool       // exited; its pid may be reaped at any moment
}

// gone tells whether the supervisor has exited.
func (sup *supervisor) gone() bool {
	select {
	case <-sup.exited:
		return true
	default:
		return false
	}
}

// warmLocked starts supervisors for the first task waiting in each pool,
// so that their grants start their commands at once.
func (s *Server) warmLocked() {
	// Called on every scheduling pass, under the lock: with no task waiting
	// (npurun alone) it must cost nothing, and with a long line no more
	// than the walk to each pool's first task.
	if s.warm >= maxWarm || s.life == nil || !s.life.AnyWaiting() || s.paused != nil || s.idle.closed {
		return
	}
	var few [16]*lease.Waiter
	for _, w := range s.cpuq.FirstTasks(s.table.FirstTasks(few[:0])) {
		t := taskOf(w)
		if t.sup != nil {
			continue
		}
		if s.warm >= maxWarm {
			return
		}
		s.warm++
		var run func()
		t.sup, run = s.spawnLocked(t)
		go s.warmUp(t, run)
	}
}

// warmUp starts t's warm supervisor with run, then arms t (tasklife):
// its start, when it is granted, need not wait for the disk. An arm that
// cannot be recorded leaves t's start to wait for the disk, as any.
func (s *Server) warmUp(t *task, run func()) {
	run()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.life != nil && t.IsWaiting() {
		_ = s.life.Arm(t.Task)
	}
}

// spawnLocked gets t a supervisor: the idle one of its user if there is
// one, else a new one. The function returned, run without the lock, gives
// the idle one t's Spec or starts the new one, and closes its ready
// channel.
func (s *Server) spawnLocked(t *task) (*supervisor, func()) {
	spec := s.specLocked(t.Task)
	acct := t.acct
	if s.cg != nil {
		t.cgroup = true // from now on its end removes the group
	}
	sup := s.takeIdleLocked(t)
	if sup == nil {
		sup = &supervisor{exited: make(chan struct{})}
	}
	sup.t, sup.ready = t, make(chan struct{})
	return sup, func() {
		defer close(sup.ready)
		if sup.started != nil {
			sup.err = s.bindSupervisor(t, sup, spec)
		} else if sup.err = s.startSupervisor(t, sup, spec, acct); sup.err != nil && sup.pid == 0 {
			close(sup.exited) // never started: nothing else will say it is gone
		}
		if s.cg != nil {
			s.mu.Lock()
			if s.jobs[t.ID] == nil {
				// Ended while its supervisor was being started: the
				// removal may have come before the group was made.
				go s.reapCgroup(t.ID)
			}
			s.mu.Unlock()
		}
	}
}

// errUnknownUser is a submitter that the user database does not know;
// errLookup, one it could not be asked about (that passes).
var (
	errUnknownUser = errors.New("is not in the user database now: its groups are unknown")
	errLookup      = errors.New("the user database cannot be read now")
)

// errCgroup is a task's control group that cannot be made now: the task
// waits rather than run outside it.
var errCgroup = errors.New("no control group for the task")

// startSupervisor starts a supervisor for t as the submitter, in t's
// control group, and gives it its Spec.
func (s *Server) startSupervisor(t *task, sup *supervisor, spec *client.Spec, acct *account) error {
	sup.uid = t.UID
	if !s.unprivileged {
		if acct == nil || !acct.known {
			acct = s.users.lookup(t.UID)
		}
		if err := acct.unanswered(); err != nil {
			return fmt.Errorf("look up uid %d: %w: %w", t.UID, errLookup, err)
		}
		if !acct.known {
			return fmt.Errorf("uid %d %w", t.UID, errUnknownUser)
		}
		sup.gid, sup.gids = acct.gid, acct.gids
	}
	cgfd := -1
	if s.cg != nil {
		// Born in the task's group (clone3, CLONE_INTO_CGROUP): nothing of
		// the task runs outside it, not even for a moment.
		fd, err := s.cg.open(t.ID)
		if err != nil {
			return fmt.Errorf("start supervisor: %w: %w", errCgroup, err)
		}
		defer unix.Close(fd)
		cgfd = fd
	}
	if err := s.execSupervisor(sup, t.ID, cgfd); err != nil {
		return err
	}
	return s.sendSpec(sup, spec)
}

// execSupervisor starts the supervisor program with sup's credentials
// (unless the broker is unprivileged), for task id (0: idle), in the
// control group open at cgfd (-1: the broker's own). It fills in sup's
// process and socket, and arranges for its exit to be seen.
func (s *Server) execSupervisor(sup *supervisor, id uint64, cgfd int) error {
	attr := &syscall.SysProcAttr{Setsid: true}
	if !s.unprivileged {
		attr.Credential = &syscall.Credential{Uid: sup.uid, Gid: sup.gid, Groups: sup.gids}
	}
	if cgfd >= 0 {
		attr.UseCgroupFD, attr.CgroupFD = true, cgfd
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("start supervisor: %w", err)
	}
	child := os.NewFile(uintptr(pair[1]), "supervisor")
	defer child.Close()
	sock := os.NewFile(uintptr(pair[0]), "supervisor")
	// Run from the file opened at the broker's start, whatever is at its
	// path now (supervisorbin.go).
	cmd := &exec.Cmd{
		Path:        s.supBin.execPath(),
		Args:        []string{client.SupervisorName},
		Dir:         "/",
		Env:         []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Stdin:       child,
		SysProcAttr: attr,
	}
	if id != 0 {
		cmd.Args = append(cmd.Args, strconv.FormatUint(id, 10))
	}
	if err := cmd.Start(); err != nil {
		sock.Close()
		return fmt.Errorf("start supervisor: %w", err)
	}
	sup.sock = sock
	sup.pid = cmd.Process.Pid
	sup.start = procStart(s.proc, sup.pid)
	go func() {
		// Seen exited before it is reaped: until then its pid is its own,
		// and an idle one may still be moved into its task's group.
		var info unix.Siginfo
		for unix.Waitid(unix.P_PID, sup.pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
		}
		sup.mu.Lock()
		sup.dead = true
		sup.mu.Unlock()
		cmd.Wait()
		close(sup.exited)
		s.supervisorExited(sup)
	}()
	return nil
}

// sendSpec gives a supervisor its task's Spec; on an error its socket is
// closed, and it exits having run nothing.
func (s *Server) sendSpec(sup *supervisor, spec *client.Spec) error {
	b, err := json.Marshal(spec)
	if err == nil {
		err = client.SendMsg(int(sup.sock.Fd()), b, nil, 0)
	}
	if err != nil {
		sup.sock.Close()
		return fmt.Errorf("give the supervisor its spec: %w", err)
	}
	return nil
}

// supervisorExited is called once a supervisor has exited and been
// reaped.
func (s *Server) supervisorExited(sup *supervisor) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sup.t == nil {
		// Idle, and now out of the pool: nothing else will close its
		// socket (its user may kill it at will).
		s.idleGoneLocked(sup)
		sup.sock.Close()
		s.reapIdleLocked(sup)
		return
	}
	s.supervisorGoneLocked(sup.t, sup.pid)
}

// passing tells whether a supervisor could not be started for a reason
// that passes: the broker is out of descriptors, processes or memory.
func passing(err error) bool {
	for _, e := range []error{errLookup, errCgroup, unix.EMFILE, unix.ENFILE, unix.EAGAIN, unix.ENOMEM, unix.ENOBUFS, unix.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// dropSupervisorLocked lets a warm supervisor go: its task will not start
// (cancelled, or failed in line). It exits having run nothing.
func (s *Server) dropSupervisorLocked(t *task) {
	sup := t.sup
	if sup == nil {
		return
	}
	t.sup = nil
	s.warm--
	go func() {
		<-sup.ready
		if sup.sock != nil {
			dropSupervisor(sup, t.ID)
		}
	}()
}

// dropSupervisor tells a supervisor waiting for task id's go-ahead that
// the task will not start under it, and closes its socket: it exits having
// run nothing. A socket that closes without this word (nor a go-ahead)
// means that the broker died, maybe after it recorded the start: the
// supervisor then tells the next broker that the task never started
// (taskNotStarted).
func dropSupervisor(sup *supervisor, id uint64) {
	if b, err := json.Marshal(&client.Spec{ID: id, Drop: true}); err == nil {
		_ = client.SendMsg(int(sup.sock.Fd()), b, nil, unix.MSG_DONTWAIT) // failing, it asks, and hears there is nothing to undo
	}
	sup.sock.Close()
}

// dropWarm, as the broker stops, drops the warm supervisors (those of
// tasks still waiting), waiting up to d for those still being started:
// closed without a word by the broker's exit, they would wait for the next
// broker to tell it that their tasks never started.
func (s *Server) dropWarm(d time.Duration) {
	s.mu.Lock()
	type warm struct {
		sup *supervisor
		id  uint64
	}
	var all []warm
	for _, t := range s.jobs {
		if t.sup != nil {
			all = append(all, warm{t.sup, t.ID})
			t.sup = nil
			s.warm--
		}
	}
	s.mu.Unlock()
	deadline := time.After(d)
	for _, w := range all {
		select {
		case <-w.sup.ready:
			if w.sup.sock != nil {
				dropSupervisor(w.sup, w.id)
			}
		case <-deadline:
			return
		}
	}
}

// startTaskLocked starts a granted task: the devices (or CPU slot) are
// its from now on, and it is starting; its supervisor, its start record
// and the go-ahead follow in launch. h is the lease table's handover of
// its devices (nil for a --no-device task, granted CPU slot slot instead,
// -1 otherwise): its lease begins here, and the broker keeps its copies of
// the lock descriptors only until the supervisor has inherited them.
func (s *Server) startTaskLocked(t *task, h *lease.Handover, slot int) bool {
	var devices []int
	if h != nil {
		devices = h.Devices
	}
	if err := s.life.Grant(t.Task, devices, slot, time.Now()); err != nil {
		// Only pending tasks that are not being cancelled are in line
		// unheld: this is a bug. Keep the devices free and the task in
		// its place, held so that the next pass does not grant it again.
		s.log.Printf("%v", err)
		if h != nil {
			s.table.Return(h)
		}
		t.inLine = false // Plan's caller took it out
		s.requeueLocked(t)
		s.holdLocked(t, true)
		return false
	}
	s.leftLineLocked(t)
	var fds []int
	if h != nil {
		// A restricted account's access, before its supervisor starts (a
		// --no-device task gets none, the control nodes' included).
		if err := s.table.Allow(h); err != nil {
			s.log.Printf("task %d: open npu %s to uid %d: %v", t.ID, npu.FormatIDs(devices), t.UID, err)
		}
		l := s.table.Commit(h)
		fds = h.FDs()
		s.status.Started(l, h)
	}
	if slot >= 0 {
		s.cpuFree[slot] = false
	}
	if s.here {
		s.launches = append(s.launches, grantedTask{t, fds, t.sup != nil && closed(t.sup.ready)})
	} else {
		go s.launch(t, fds)
	}
	return true
}

// grantedTask is a granted task to launch, with its lock descriptors;
// ready tells that its warm supervisor is ready, so that its launch takes
// no process start and no user lookup.
type grantedTask struct {
	t     *task
	fds   []int
	ready bool
}

// closed tells whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// scheduleHereLocked is scheduleLocked for a caller that launches the tasks
// it grants itself, with launchAll once it has let the lock go. Where a
// lease's end hands its device to the next task (the handoff), a goroutine
// started for the launch costs a wake-up on the start's path, 0.1–0.3 ms
// on a busy machine here.
func (s *Server) scheduleHereLocked() []grantedTask {
	s.here = true
	s.scheduleLocked()
	s.here = false
	starts := s.launches
	s.launches = nil
	return starts
}

// launchAll launches starts: one whose supervisor is ready in this
// goroutine (the caller, a device's release watcher, waits for its next
// release meanwhile: not for a process start or a lookup), the others in
// goroutines of their own.
func (s *Server) launchAll(starts []grantedTask) {
	here := -1
	for i, l := range starts {
		if l.ready {
			here = i
		}
	}
	for i, l := range starts {
		if i != here {
			go s.launch(l.t, l.fds)
		}
	}
	if here >= 0 {
		s.launch(starts[here].t, starts[here].fds)
	}
}

// launch starts a granted task: its supervisor (warm, or started now), the
// start record with the supervisor's pid made durable, then the go-ahead
// with the lock descriptors. The broker's copies of the descriptors are
// closed at the end: by then the supervisor has them, or nobody will, and
// the devices go back to the line.
func (s *Server) launch(t *task, fds []int) {
	defer func() {
		for _, fd := range fds {
			closeFD(fd)
		}
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	sup := t.sup
	if sup != nil {
		t.sup = nil
		s.warm--
	}
	for try := 0; ; try++ {
		var run func()
		if sup == nil {
			sup, run = s.spawnLocked(t)
		}
		s.mu.Unlock()
		if run != nil {
			run() // here: a goroutine more would be a wake-up more
		}
		<-sup.ready
		s.mu.Lock()
		if sup.err == nil && !sup.gone() {
			break
		}
		err := sup.err
		if err == nil {
			sup.sock.Close()
			err = errors.New("its supervisor exited before the start")
		}
		if try == 0 {
			sup = nil // a warm one that failed or died while waiting: start another
			continue
		}
		if passing(err) {
			s.ungrantLocked(t, fmt.Errorf("task %d: %w", t.ID, err), false)
			return
		}
		s.log.Printf("task %d: %v", t.ID, err)
		if err := s.life.End(t.Task, tasklife.Failed, nil, "not started: "+err.Error()); err != nil {
			s.ungrantLocked(t, fmt.Errorf("task %d: record its failure: %w", t.ID, err), true)
		}
		return
	}
	if t.cancel {
		// Cancelled while it was being granted: it never starts.
		dropSupervisor(sup, t.ID)
		s.ungrantLocked(t, nil, false)
		s.cancelLocked(t, t.cancelBy)
		return
	}
	if err := s.life.Start(t.Task, sup.pid, sup.start, s.boot, int64(monoNow()/time.Millisecond)); err != nil {
		dropSupervisor(sup, t.ID) // it exits having run nothing
		s.ungrantLocked(t, fmt.Errorf("task %d: record its start: %w", t.ID, err), true)
		return
	}
	s.pauseWait = 0
	t.heard = false // not yet, from this supervisor
	goAhead := s.goAheadLocked(t.Task)
	t.launching = true
	s.mu.Unlock()
	s.testHook(hookBeforeGoAhead, t.ID)
	b, err := json.Marshal(goAhead)
	if err == nil {
		err = client.SendMsg(int(sup.sock.Fd()), b, fds, 0)
	}
	if err != nil {
		// Closed without a word: the supervisor tells us that its task
		// never started (taskNotStarted), and it goes back in line.
		sup.sock.Close()
	} else {
		go s.awaitStarted(sup)
	}
	s.mu.Lock()
	t.launching = false
	if err != nil {
		s.log.Printf("task %d: give the supervisor its go-ahead: %v", t.ID, err)
	}
	if sup.gone() {
		// Gone before or while starting: supervisorGone left it to us,
		// so that its end is recorded after its start.
		s.supervisorGoneLocked(t, sup.pid)
		return
	}
	s.enforceLimitLocked(t)
	if t.cancel {
		s.stopLocked(t) // cancelled while it was being started
	}
}

// awaitStarted waits for a supervisor given its go-ahead to say that its
// command has started (or for it to close its socket: it could not, or
// exited), then keeps an idle supervisor for its user: started any
// earlier, it would slow this start. A cancel that came meanwhile is sent
// now (stopLocked).
func (s *Server) awaitStarted(sup *supervisor) {
	buf := make([]byte, 512)
	_, fds, _ := client.RecvMsg(int(sup.sock.Fd()), buf, nil, 0)
	for _, fd := range fds {
		closeFD(fd)
	}
	sup.sock.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := sup.t; t != nil && t.PID == sup.pid {
		t.heard = true
		if t.cancel {
			s.stopLocked(t)
		}
	}
	s.keepIdleLocked(sup)
}

// ungrantLocked puts a task whose start could not be made back in its
// place in line, and, when why is not nil, stops task starts until the
// broker has tried again: journal tells that the journal could not be
// written.
func (s *Server) ungrantLocked(t *task, why error, journal bool) {
	if t.Slot >= 0 && t.Slot < len(s.cpuFree) {
		s.cpuFree[t.Slot] = true
	}
	s.life.Ungrant(t.Task)
	if why != nil {
		s.pauseStartsLocked(why, journal)
	}
	s.requeueLocked(t)
}

// A pause of task starts, and how long it waits before trying again.
const (
	firstPause = 250 * time.Millisecond
	maxPause   = 10 * time.Second
)

// pause is why task starts are stopped.
type pause struct {
	why     error
	journal bool // the journal could not be written: test it before resuming
}

// pauseStartsLocked stops task starts: every task waiting is held in its
// place, and the broker tries again after a wait that grows each time.
func (s *Server) pauseStartsLocked(why error, journal bool) {
	if s.paused != nil {
		s.paused.journal = s.paused.journal || journal
		return
	}
	s.paused = &pause{why: why, journal: journal}
	s.pauseWait = min(max(2*s.pauseWait, firstPause), maxPause)
	s.log.Printf("%v; task starts paused (leases go on), trying again in %s", why, quantity.Duration(s.pauseWait))
	s.holdTasksLocked(true)
	time.AfterFunc(s.pauseWait, s.retryStarts)
}

// retryStarts resumes task starts once the journal can be written, or
// waits longer.
func (s *Server) retryStarts() {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.paused
	if p.journal || s.life.Writable() != nil {
		if err := s.life.Recover(); err != nil {
			s.pauseWait = min(2*s.pauseWait, maxPause)
			if err.Error() != p.why.Error() {
				s.log.Printf("the journal: %v; task starts stay paused", err)
				p.why = err
			}
			time.AfterFunc(s.pauseWait, s.retryStarts)
			return
		}
	}
	s.paused = nil
	s.log.Print("task starts resume")
	s.holdTasksLocked(false)
	s.scheduleLocked()
}

// holdTasksLocked holds (or releases) every task waiting in line. A task
// being cancelled stays held.
func (s *Server) holdTasksLocked(hold bool) {
	for _, w := range s.cpuq.Waiters() {
		if t := taskOf(w); t != nil {
			w.Held = hold || t.Busy()
		}
	}
	for _, t := range s.jobs {
		if t.inLine && !t.Sub.NoDevice {
			s.table.Hold(t.w, hold || t.Busy())
		}
	}
}

// specLocked is what t's supervisor is told when it starts; the devices
// and their variables come with the go-ahead.
func (s *Server) specLocked(t *tasklife.Task) *client.Spec {
	env := slices.Clone(t.Sub.Env)
	if t.Sub.NoDevice {
		env = append(env, npu.HiddenEnv()...)
		threads := strconv.Itoa(s.cfg.Tasks.CPUThreads)
		for _, v := range []string{"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"} {
			env = capThreads(env, v, s.cfg.Tasks.CPUThreads, threads)
		}
	}
	env = append(env, "NPURUN_TASK_ID="+strconv.FormatUint(t.ID, 10), "NPURUN_SOCKET="+s.socket)
	return &client.Spec{
		ID: t.ID, UID: t.UID, Argv: t.Argv, Cwd: t.Sub.Cwd, Env: env, Log: t.Log, Umask: t.Sub.Umask,
		TimeSec: t.TimeSec, GraceSec: int64(s.cfg.Tasks.KillGrace / time.Second),
		Idle: t.Sub.NoDevice && s.cfg.Tasks.IdlePriority, Socket: s.socket,
	}
}

// goAheadLocked is the go-ahead for a granted task: its devices and their
// variables (the descriptors travel beside it).
func (s *Server) goAheadLocked(t *tasklife.Task) *client.Spec {
	g := &client.Spec{ID: t.ID, Devices: t.Devices}
	if !t.Sub.NoDevice {
		g.Env = s.inv.Env(t.Devices)
	}
	return g
}

// capThreads sets name to at most n threads: kept if the submitter asked
// for fewer, set to n otherwise.
func capThreads(env []string, name string, n int, text string) []string {
	for i, kv := range env {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			if k, err := strconv.Atoi(v); err == nil && k >= 1 && k <= n {
				return env
			}
			env[i] = name + "=" + text
			return env
		}
	}
	return append(env, name+"="+text)
}

// supervisorGone is called when a task's supervisor, pid, has exited. It
// has reported the end before exiting, unless it was killed: then the task
// is lost, and what is left of it in its control group or its session is
// killed, so that its lease, time limit and slot do not outlive the
// supervisor that kept them. A supervisor that exits while its task is
// being started is launch's to handle.
func (s *Server) supervisorGone(t *task, pid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.supervisorGoneLocked(t, pid)
}

func (s *Server) supervisorGoneLocked(t *task, pid int) {
	if t.launching || t.State != tasklife.Running || t.PID != pid {
		return
	}
	s.endProcessesLocked(t)
	if t.State != tasklife.Running || t.PID != pid {
		return // it reported meanwhile
	}
	reason := "its supervisor ended without reporting; exit status unknown"
	if t.overran {
		reason = fmt.Sprintf("killed by the broker: time limit %s overrun", quantity.Duration(time.Duration(t.TimeSec)*time.Second))
	}
	s.life.EndNow(t.Task, tasklife.Lost, reason)
}

// endProcessesLocked kills what is left of a running task: everything in
// its control group, or, without one, in its supervisor's session (with
// the lock released during the /proc scan).
func (s *Server) endProcessesLocked(t *task) {
	pid, start, uid := t.PID, t.PIDStart, t.UID
	if t.Boot != "" && t.Boot != s.boot {
		return // started in an earlier boot: nothing of it is left
	}
	if t.cgroup {
		if err := s.cg.kill(t.ID); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.log.Printf("task %d: kill its control group: %v", t.ID, err)
		}
		return // a group is removed only once empty: gone, nothing is left
	}
	s.mu.Unlock()
	killSession(s.proc, pid, start, uid)
	s.mu.Lock()
}

// stopLocked asks a running task's supervisor to stop it (SIGTERM to the
// group, SIGKILL after the grace). A supervisor the broker has not heard
// from since its go-ahead gets the signal once it has (awaitStarted): one
// just started may not catch SIGTERM yet, and would die of it, leaving its
// task lost rather than cancelled.
func (s *Server) stopLocked(t *task) {
	t.cancel = true
	if t.State == tasklife.Running && t.heard && (t.Boot == "" || t.Boot == s.boot) {
		signalChecked(s.proc, t.PID, t.PIDStart, unix.SIGTERM)
	}
}

// overrunLimit is how long past its time limit and grace a task may run
// before the broker, not trusting the submitter's supervisor, kills it.
const overrunLimit = 30 * time.Second

// enforceLimitLocked arms the broker's own backstop for t's time limit,
// measured on the monotonic clock from the start recorded in this boot,
// so that a step of the wall clock cannot fool it. It returns how long the
// task may run on (0: no limit).
func (s *Server) enforceLimitLocked(t *task) time.Duration {
	if t.TimeSec <= 0 {
		return 0
	}
	limit := time.Duration(t.TimeSec)*time.Second + s.cfg.Tasks.KillGrace + overrunLimit
	var left time.Duration
	if t.StartMono > 0 && t.Boot == s.boot {
		left = limit - (monoNow() - time.Duration(t.StartMono)*time.Millisecond)
	} else {
		// Recorded by an older broker, without the monotonic clock.
		left = time.Until(time.UnixMilli(t.Started).Add(limit))
	}
	pid := t.PID
	time.AfterFunc(left, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if t.State != tasklife.Running || t.PID != pid {
			return
		}
		t.overran = true
		s.log.Printf("task %d overran its time limit; killing what is left of it", t.ID)
		s.endProcessesLocked(t)
	})
	return max(left, time.Nanosecond)
}
