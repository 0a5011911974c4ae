package local

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/tasks"
	"github.com/npurun/npurun/broker/tasks/journal"
	"github.com/npurun/npurun/internal/testhook"
	"github.com/npurun/npurun/wire"
)

// The local runner: a task runs under a supervisor, `npurun-supervise
// [ID]` (package supervisor; the program is found and checked in
// supervisorbin.go), started as the submitter in a session of its own.
// Its standard input is a SOCK_SEQPACKET socket to the broker carrying two
// messages: the Spec, and, once the task is granted and its start is
// durable in the journal, the go-ahead: the devices, their variables and
// their lock descriptors (SCM_RIGHTS). A supervisor that sees the socket
// close first exits having run nothing. So a grant costs one message, not
// a process start, wherever a supervisor could be started beforehand.
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
// A running task's notify command is run for a notice (the [idle]
// policy's warning: Room.Notice) by a third kind of launch, a notify-only
// supervisor (notice.go): the same program, started the same way
// (execSupervisor: as the submitter, in the task's control group where
// there is one, which must exist already), given the task's Spec with
// Notice set and nothing after it. It runs the command as the end
// notification is run (the same environment, NPURUN_TASK_STATE=idle,
// killed after wire.NotifyFor) and exits; the broker runs nothing of the
// user's itself. At most MaxNotices run at once.
//
// A task's processes are started in one place, execSupervisor (directly
// in the task's control group, where there are control groups: cgroup.go;
// an idle supervisor is moved into its task's group before it is given its
// Spec, so nothing of a task ever runs outside the group), and ended in
// one place, Kill (and, at the task's end, its group's removal,
// reapCgroup).

// maxWarm bounds the supervisors started ahead of their grant.
const maxWarm = 8

// MaxReady bounds the supervisors the local runner holds ready ahead of
// their tasks' grants, warm and idle together: each holds a socket and a
// pidfd (the broker's descriptor reserve counts them).
const MaxReady = maxWarm + maxIdle

// local is the local runner. Its state is under its host's lock (the
// task room's), but for what Open sets before any task runs.
type local struct {
	// Set by newLocal, never changed.
	host   tasks.Host
	self   string // the broker's executable, beside which the supervisor program is looked for first
	cgMode string // what was asked for: auto, off or a directory
	log    *log.Logger
	boot   string
	unpriv bool // not root: no credential change
	proc   procfs.FS

	// Set by Open, before any task runs; supBin and cg are read without
	// the lock from then on.
	supBin  *supervisorBin // npurun-supervise, open: every task runs under it; nil until found
	cg      *cgroups       // where tasks' control groups go; nil: none (see cgroup.go)
	cgReady bool           // cg was set up (once the state directory is ours)
	found   map[uint64]bool

	warm    map[*tasks.Task]*supervisor // supervisors started for tasks still waiting
	idle    idlePool                    // idle supervisors, one per user at most (idle.go)
	notices int                         // notify-only supervisors running (notice.go)
}

// localTask is what the local runner holds for a task (tasks.Task.RunnerData).
type localTask struct {
	cgroup bool // its control group may exist (cgroup.go)
	heard  bool // running: its supervisor spoke since its go-ahead (or was adopted), so it catches SIGTERM
	ended  bool // its group was killed at its end (Ended): nothing of it is left
	// exited is closed once its supervisor has exited (nil: none known)
	exited <-chan struct{}
}

// New makes the local runner of the room h: self is the broker's
// executable, beside which the supervisor program is looked for first;
// cgMode is where tasks' control groups go (auto, off or a directory).
func New(h tasks.Host, self, cgMode string, lg *log.Logger) tasks.Runner {
	return newLocal(h, self, cgMode, lg)
}

func newLocal(h tasks.Host, self, cgMode string, lg *log.Logger) *local {
	if lg == nil {
		lg = log.Default()
	}
	fs, err := procfs.NewFS("/proc")
	if err != nil {
		lg.Printf("read /proc: %v", err)
	}
	return &local{host: h, self: self, cgMode: cgMode, log: lg, boot: tasks.BootID(), unpriv: os.Geteuid() != 0, proc: fs,
		warm: map[*tasks.Task]*supervisor{}}
}

// of is what l holds for t.
func (l *local) of(t *tasks.Task) *localTask {
	lt, _ := t.RunnerData().(*localTask)
	if lt == nil {
		lt = &localTask{}
		t.SetRunnerData(lt)
	}
	return lt
}

// Open finds the supervisor program, and, once the state directory dir is
// this broker's, sets up the tasks' control groups.
func (l *local) Open(dir string) error {
	// Tasks run under the supervisor program; leases do not need it. One
	// that is missing or that another user could replace leaves tasks
	// unavailable, and the broker looks again as it tries again.
	if l.supBin == nil {
		bin, err := findSupervisor(l.self)
		if err != nil {
			return err
		}
		l.host.Lock()
		l.supBin = bin
		l.host.Unlock()
	}
	// The tasks' control groups, once the spool is this broker's (a broker
	// that must not start touches none).
	if !l.cgReady {
		owner, err := filepath.Abs(dir)
		if err != nil {
			return err
		}
		cg, err := setupCgroups(l.cgMode, owner, l.log)
		if err != nil {
			return fmt.Errorf("%w: %w", tasks.ErrFatal, err) // asked for by name, and cannot be had
		}
		l.host.Lock()
		l.cg, l.cgReady = cg, true
		l.host.Unlock()
		if cg != nil {
			l.reapLeftIdle()
		}
	}
	// The tasks' control groups left by the broker before this one: a
	// running task's is adopted with it, a waiting task's is used again
	// for its start, the others' are removed (TakeUp).
	found := map[uint64]bool{}
	if l.cg != nil {
		for _, id := range l.cg.tasks() {
			found[id] = true
		}
	}
	l.host.Lock()
	l.found = found
	l.host.Unlock()
	return nil
}

// TakeUp notes the control groups of the tasks taken up, and removes the
// others: those of tasks that had ended, or that the journal forgot.
// Nothing of them may run on. (Those of tasks found lost are killed and
// reaped by their end, once: not here as well.)
func (l *local) TakeUp(live []*tasks.Task) {
	known := make(map[uint64]bool, len(live))
	for _, t := range live {
		known[t.ID] = true
		l.of(t).cgroup = l.found[t.ID]
	}
	for id := range l.found {
		if !known[id] {
			go l.reapCgroup(id)
		}
	}
	l.found = nil
}

// Adopt takes up a task that was running when the broker stopped: its
// supervisor, if still there, reports to this broker.
func (l *local) Adopt(t *tasks.Task) bool {
	if !adoptable(l.proc, t.PID, t.PIDStart, t.ID) {
		return false
	}
	l.of(t).heard = true // running long enough to be adopted: it catches SIGTERM
	pid, start := t.PID, t.PIDStart
	exited := make(chan struct{})
	l.of(t).exited = exited
	go func() {
		waitExit(l.proc, pid, start)
		close(exited)
		l.host.Lock()
		l.host.Gone(t, pid)
		l.host.Unlock()
	}()
	return true
}

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

	t       *tasks.Task   // its task; nil while idle (the host's lock)
	started chan struct{} // idle: closed once its process exists (or failed: err)
	expire  *time.Timer   // idle: lets it go after idleFor
	group   uint64        // idle: its own control group, idle-N (0: none)

	notice bool // a notify-only launch (notice.go): neither idle nor a task's

	mu   sync.Mutex // dead, against a move of its pid once it may be reused
	dead bool       // exited; its pid may be reaped at any moment
}

// Process is the supervisor's pid and start time.
func (sup *supervisor) Process() (int, uint64) { return sup.pid, sup.start }

// gone tells whether the supervisor has exited.
func (sup *supervisor) gone() bool {
	select {
	case <-sup.exited:
		return true
	default:
		return false
	}
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

// Warm starts a supervisor for t, which waits, with its Spec: it opens
// the log and finds the program while t waits.
func (l *local) Warm(t *tasks.Task, spec func() *wire.Spec) (func(), bool) {
	if len(l.warm) >= maxWarm || l.idle.closed {
		return nil, false
	}
	sup, run := l.spawnLocked(t, spec())
	l.warm[t] = sup
	return run, true
}

// Warmed tells whether t has a warm supervisor, and whether it is ready.
func (l *local) Warmed(t *tasks.Task) (bool, bool) {
	sup := l.warm[t]
	return sup != nil, sup != nil && closed(sup.ready)
}

// Unwarm lets t's warm supervisor go: t will not start now (cancelled, or
// failed in line). It exits having run nothing.
func (l *local) Unwarm(t *tasks.Task) {
	sup := l.warm[t]
	if sup == nil {
		return
	}
	delete(l.warm, t)
	go func() {
		<-sup.ready
		if sup.sock != nil {
			dropSupervisor(sup, t.ID)
		}
	}()
}

// Prepare takes t's warm supervisor, or starts one.
func (l *local) Prepare(t *tasks.Task, spec func() *wire.Spec, fresh bool) func() (tasks.Proc, error) {
	l.of(t).heard = false // not yet, from this supervisor
	var sup *supervisor
	if fresh {
		l.Unwarm(t) // none: the first try took it
	} else if sup = l.warm[t]; sup != nil {
		delete(l.warm, t)
	}
	var run func()
	if sup == nil {
		sup, run = l.spawnLocked(t, spec())
	}
	return func() (tasks.Proc, error) {
		if run != nil {
			run()
		}
		<-sup.ready
		if sup.err == nil && !sup.gone() {
			return sup, nil
		}
		if sup.err != nil {
			return nil, sup.err
		}
		sup.sock.Close()
		return nil, errors.New("its supervisor exited before the start")
	}
}

// spawnLocked gets t a supervisor: the idle one of its user if there is
// one, else a new one. The function returned, run without the lock, gives
// the idle one t's Spec or starts the new one, and closes its ready
// channel.
func (l *local) spawnLocked(t *tasks.Task, spec *wire.Spec) (*supervisor, func()) {
	acct := t.Account()
	if l.cg != nil {
		l.of(t).cgroup = true // from now on its end removes the group
	}
	sup := l.takeIdleLocked(t)
	if sup == nil {
		sup = &supervisor{exited: make(chan struct{})}
	}
	sup.t, sup.ready = t, make(chan struct{})
	l.of(t).exited = sup.exited
	return sup, func() {
		defer close(sup.ready)
		if sup.started != nil {
			sup.err = l.bindSupervisor(t, sup, spec)
		} else if sup.err = l.startSupervisor(t, sup, spec, acct); sup.err != nil && sup.pid == 0 {
			close(sup.exited) // never started: nothing else will say it is gone
		}
		if l.cg != nil {
			l.host.Lock()
			if !l.host.Known(t.ID) {
				// Ended while its supervisor was being started: the
				// removal may have come before the group was made.
				go l.reapCgroup(t.ID)
			}
			l.host.Unlock()
		}
	}
}

// errUnknownUser is a submitter that the user database does not know;
// tasks.ErrLookup, one it could not be asked about (that passes).
var errUnknownUser = errors.New("is not in the user database now: its groups are unknown")

// startSupervisor starts a supervisor for t as the submitter, in t's
// control group, and gives it its Spec.
func (l *local) startSupervisor(t *tasks.Task, sup *supervisor, spec *wire.Spec, acct *tasks.Account) error {
	if err := l.credentials(sup, t.UID, acct); err != nil {
		return err
	}
	cgfd := -1
	if l.cg != nil {
		// Born in the task's group (clone3, CLONE_INTO_CGROUP): nothing of
		// the task runs outside it, not even for a moment.
		fd, err := l.cg.open(t.ID)
		if err != nil {
			return fmt.Errorf("start supervisor: %w: %w", tasks.ErrCgroup, err)
		}
		defer unix.Close(fd)
		cgfd = fd
	}
	if err := l.execSupervisor(sup, t.ID, cgfd); err != nil {
		return err
	}
	return sendSpec(sup, spec)
}

// credentials gives sup the credentials of account acct, uid's (looked
// up again where acct is not known), unless the broker is unprivileged.
func (l *local) credentials(sup *supervisor, uid uint32, acct *tasks.Account) error {
	sup.uid = uid
	if l.unpriv {
		return nil
	}
	if acct == nil || !acct.Known {
		acct = l.host.Lookup(uid)
	}
	if err := acct.Unanswered(); err != nil {
		return fmt.Errorf("look up uid %d: %w: %w", uid, tasks.ErrLookup, err)
	}
	if !acct.Known {
		return fmt.Errorf("uid %d %w", uid, errUnknownUser)
	}
	sup.gid, sup.gids = acct.GID, acct.GIDs
	return nil
}

// execSupervisor starts the supervisor program with sup's credentials
// (unless the broker is unprivileged), for task id (0: idle), in the
// control group open at cgfd (-1: the broker's own). It fills in sup's
// process and socket, and arranges for its exit to be seen.
func (l *local) execSupervisor(sup *supervisor, id uint64, cgfd int) error {
	attr := &syscall.SysProcAttr{Setsid: true}
	if !l.unpriv {
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
		Path:        l.supBin.execPath(),
		Args:        []string{wire.SupervisorName},
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
	// Its start time tells it from a later process with its pid: a task's
	// start record names it by both, and a broker that restarts adopts it,
	// or signals it, only so. Without it, a broker killed after the record
	// would take the task for lost and never run it: the supervisor is let
	// go at once, having been given nothing, and the start is made again.
	start := procStart(l.proc, cmd.Process.Pid)
	if start == 0 || testhook.Fails(hookNoStartTime) {
		sock.Close()
		cmd.Process.Kill()
		cmd.Wait()
		return fmt.Errorf("start supervisor: %w", tasks.ErrStartTime)
	}
	sup.sock = sock
	sup.pid, sup.start = cmd.Process.Pid, start
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
		l.supervisorExited(sup)
	}()
	return nil
}

// sendSpec gives a supervisor its task's Spec; on an error its socket is
// closed, and it exits having run nothing.
func sendSpec(sup *supervisor, spec *wire.Spec) error {
	b, err := json.Marshal(spec)
	if err == nil {
		err = wire.SendMsg(int(sup.sock.Fd()), b, nil, 0)
	}
	if err != nil {
		sup.sock.Close()
		return fmt.Errorf("give the supervisor its spec: %w", err)
	}
	return nil
}

// supervisorExited is called once a supervisor has exited and been
// reaped.
func (l *local) supervisorExited(sup *supervisor) {
	l.host.Lock()
	defer l.host.Unlock()
	if sup.notice {
		l.notices-- // notice.go
		return
	}
	if sup.t == nil {
		// Idle, and now out of the pool: nothing else will close its
		// socket (its user may kill it at will).
		l.idleGoneLocked(sup)
		sup.sock.Close()
		l.reapIdleLocked(sup)
		return
	}
	l.host.Gone(sup.t, sup.pid)
}

// Release tells a supervisor waiting for t's go-ahead that t will not
// start under it.
func (l *local) Release(t *tasks.Task, p tasks.Proc) { dropSupervisor(p.(*supervisor), t.ID) }

// dropSupervisor tells a supervisor waiting for task id's go-ahead that
// the task will not start under it, and closes its socket: it exits having
// run nothing. A socket that closes without this word (nor a go-ahead)
// means that the broker died, maybe after it recorded the start: the
// supervisor then tells the next broker that the task never started
// (Room.NotStarted).
func dropSupervisor(sup *supervisor, id uint64) {
	if b, err := json.Marshal(&wire.Spec{ID: id, Drop: true}); err == nil {
		_ = wire.SendMsg(int(sup.sock.Fd()), b, nil, unix.MSG_DONTWAIT) // failing, it asks, and hears there is nothing to undo
	}
	sup.sock.Close()
}

// dropWarm, as the broker stops, drops the warm supervisors (those of
// tasks still waiting), waiting up to d for those still being started:
// closed without a word by the broker's exit, they would wait for the next
// broker to tell it that their tasks never started.
func (l *local) dropWarm(d time.Duration) {
	l.host.Lock()
	type warm struct {
		sup *supervisor
		id  uint64
	}
	var all []warm
	for t, sup := range l.warm {
		all = append(all, warm{sup, t.ID})
		delete(l.warm, t)
	}
	l.host.Unlock()
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

// GoAhead sends the go-ahead with the lock descriptors. Closed without a
// word on an error: the supervisor tells the broker that its task never
// started (Room.NotStarted), and it goes back in line.
func (l *local) GoAhead(t *tasks.Task, p tasks.Proc, goAhead *wire.Spec, fds []int) error {
	sup := p.(*supervisor)
	b, err := json.Marshal(goAhead)
	if err == nil {
		err = wire.SendMsg(int(sup.sock.Fd()), b, fds, 0)
	}
	if err != nil {
		sup.sock.Close()
		return err
	}
	go l.awaitStarted(sup)
	return nil
}

// Gone tells whether p's supervisor has exited.
func (l *local) Gone(p tasks.Proc) bool { return p.(*supervisor).gone() }

// Unstarted: t's supervisor never got its go-ahead, and has not been
// heard since one.
func (l *local) Unstarted(t *tasks.Task) { l.of(t).heard = false }

// awaitStarted waits for a supervisor given its go-ahead to say that its
// command has started (or for it to close its socket: it could not, or
// exited), then keeps an idle supervisor for its user: started any
// earlier, it would slow this start. A cancel that came meanwhile is sent
// now (Stop).
func (l *local) awaitStarted(sup *supervisor) {
	buf := make([]byte, 512)
	_, fds, _ := wire.RecvMsg(int(sup.sock.Fd()), buf, nil, 0)
	for _, fd := range fds {
		closeFD(fd)
	}
	sup.sock.Close()
	l.host.Lock()
	defer l.host.Unlock()
	if t := sup.t; t != nil && t.PID == sup.pid {
		l.of(t).heard = true
		if t.Cancelled() && t.State == journal.Running {
			l.Stop(t)
		}
	}
	l.keepIdleLocked(sup)
}

// Stop asks a running task's supervisor to stop it (SIGTERM to the group,
// SIGKILL after the grace). A supervisor not heard from since its
// go-ahead gets the signal once it has (awaitStarted): one just started
// may not catch SIGTERM yet, and would die of it, leaving its task lost
// rather than cancelled.
func (l *local) Stop(t *tasks.Task) {
	if l.of(t).heard && (t.Boot == "" || t.Boot == l.boot) {
		signalChecked(l.proc, t.PID, t.PIDStart, unix.SIGTERM)
	}
}

// Kill kills what is left of a running task: everything in its control
// group, or, without one, in its supervisor's session (with the lock
// released during the /proc scan).
func (l *local) Kill(t *tasks.Task) {
	pid, start, uid := t.PID, t.PIDStart, t.UID
	if t.Boot != "" && t.Boot != l.boot {
		return // started in an earlier boot: nothing of it is left
	}
	if lt := l.of(t); lt.cgroup {
		if lt.ended {
			return // killed at its end already
		}
		if err := l.cg.kill(t.ID); err != nil && !errors.Is(err, fs.ErrNotExist) {
			l.log.Printf("task %d: kill its control group: %v", t.ID, err)
		}
		return // a group is removed only once empty: gone, nothing is left
	}
	l.host.Unlock()
	killSession(l.proc, pid, start, uid)
	l.host.Lock()
}

// Usage is what t's control group measured, if it has one.
func (l *local) Usage(t *tasks.Task) (time.Duration, int64) {
	if !l.of(t).cgroup {
		return 0, 0
	}
	return l.cg.usage(t.ID)
}

// Ended lets t's warm supervisor go, and kills what is left in t's
// control group at once, removing the group once empty. A task that
// ended by its supervisor's report and has a notify command is left to
// its supervisor, which runs it now, in the group, for wire.NotifyFor
// at most: the group is killed once the supervisor has exited, or after
// that and notifySlack.
func (l *local) Ended(t *tasks.Task) {
	l.Unwarm(t)
	lt := l.of(t)
	if !lt.cgroup {
		return
	}
	// Nothing it started outlives it: killed now, the group removed once
	// empty.
	lt.ended = true
	id := t.ID
	kill := func() {
		if err := l.cg.kill(id); err != nil && !errors.Is(err, fs.ErrNotExist) {
			l.log.Printf("task %d: kill its control group: %v", id, err)
		}
	}
	if exited := lt.exited; t.Notify != "" && t.Status != nil && exited != nil && !closed(exited) {
		go func() {
			select {
			case <-exited:
			case <-time.After(wire.NotifyFor + notifySlack):
			}
			kill()
			l.reapCgroup(id)
		}()
		return
	}
	kill()
	go l.reapCgroup(id)
}

// notifySlack is how long past wire.NotifyFor a supervisor running its
// task's notify command may take to exit before its group is killed.
const notifySlack = 10 * time.Second

// Close drops the warm supervisors and lets the idle ones go (letIdleGo).
func (l *local) Close(d time.Duration) { l.letIdleGo(d) }
