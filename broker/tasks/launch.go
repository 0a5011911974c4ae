package tasks

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/tasks/journal"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
)

// A granted task starts in three steps, the same for every runner: its
// process is got ready (Runner.Prepare: readied while it waited, or made
// now), its start is recorded with that process in the journal (durable,
// or written only for an armed task: package journal), and only then is the
// process given its go-ahead with the devices (Runner.GoAhead). So a
// broker that dies before the start record is on disk leaves nothing
// running that the journal does not know, and a task runs at most once.
//
// When a start cannot be made for a reason that passes (the journal cannot
// be written, the broker is out of descriptors or processes), the task goes
// back to its place in line and the room starts no task until it has
// tried again, with a growing wait; leases are served meanwhile.

// launch starts a granted task: its process (readied, or made now), the
// start record with the process made durable, then the go-ahead with the
// lock descriptors. The room's copies of the descriptors are closed at
// the end: by then the process has them, or nobody will, and the devices
// go back to the line.
func (room *Room) launch(t *Task, fds []int) {
	defer func() {
		for _, fd := range fds {
			closeFD(fd)
		}
	}()
	room.mu.Lock()
	defer room.unlock()
	spec := func() *wire.Spec { return room.specLocked(t.Task) }
	var p Proc
	for try := 0; ; try++ {
		wait := room.run.Prepare(t, spec, try > 0) // the second try: not the readied one, which failed or died while waiting
		room.unlock()
		var err error
		p, err = wait() // here: a goroutine more would be a wake-up more
		room.mu.Lock()
		if err == nil {
			break
		}
		if try == 0 {
			continue
		}
		if passing(err) {
			room.ungrantLocked(t, fmt.Errorf("task %d: %w", t.ID, err), false)
			return
		}
		room.log.Printf("task %d: %v", t.ID, err)
		if err := room.life.End(t.Task, journal.Failed, nil, "not started: "+err.Error()); err != nil {
			room.ungrantLocked(t, fmt.Errorf("task %d: record its failure: %w", t.ID, err), true)
		}
		return
	}
	if t.cancel {
		// Cancelled while it was being granted: it never starts.
		room.run.Release(t, p)
		room.ungrantLocked(t, nil, false)
		room.cancelLocked(t, t.cancelBy)
		return
	}
	pid, start := p.Process()
	if err := room.life.Start(t.Task, pid, start, room.boot, int64(monoNow()/time.Millisecond)); err != nil {
		room.run.Release(t, p) // it exits having run nothing
		room.ungrantLocked(t, fmt.Errorf("task %d: record its start: %w", t.ID, err), true)
		return
	}
	room.pauseWait = 0
	goAhead := room.goAheadLocked(t.Task)
	t.launching = true
	room.unlock()
	testHook(room.log, hookBeforeGoAhead, t.ID)
	err := room.run.GoAhead(t, p, goAhead, fds)
	room.mu.Lock()
	t.launching = false
	if err != nil {
		room.log.Printf("task %d: give the supervisor its go-ahead: %v", t.ID, err)
	}
	if room.run.Gone(p) {
		// Gone before or while starting: goneLocked left it to us, so
		// that its end is recorded after its start.
		room.goneLocked(t, pid)
		return
	}
	room.backstopLocked(t)
	if t.cancel {
		room.stopLocked(t) // cancelled while it was being started
	}
}

// passing tells whether a task's process could not be got ready for a
// reason that passes: the user database cannot be read, the task's
// control group cannot be made, its start time cannot be read, the broker
// is out of descriptors, processes or memory.
func passing(err error) bool {
	for _, e := range []error{ErrLookup, ErrCgroup, ErrStartTime, unix.EMFILE, unix.ENFILE, unix.EAGAIN, unix.ENOMEM, unix.ENOBUFS, unix.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// ungrantLocked puts a task whose start could not be made back in its
// place in line, and, when why is not nil, stops task starts until the
// room has tried again: journal tells that the journal could not be
// written.
func (room *Room) ungrantLocked(t *Task, why error, journal bool) {
	if t.Slot >= 0 && t.Slot < len(room.cpuFree) {
		room.cpuFree[t.Slot] = true
	}
	room.life.Ungrant(t.Task)
	if why != nil {
		room.pauseStartsLocked(why, journal)
	}
	room.requeueLocked(t)
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
// place, and the room tries again after a wait that grows each time.
func (room *Room) pauseStartsLocked(why error, journal bool) {
	if room.paused != nil {
		room.paused.journal = room.paused.journal || journal
		return
	}
	room.paused = &pause{why: why, journal: journal}
	room.pauseWait = min(max(2*room.pauseWait, firstPause), maxPause)
	room.log.Printf("%v; task starts paused (leases go on), trying again in %s", why, quantity.Duration(room.pauseWait))
	room.holdTasksLocked(true)
	time.AfterFunc(room.pauseWait, room.retryStarts)
}

// retryStarts resumes task starts once the journal can be written, or
// waits longer.
func (room *Room) retryStarts() {
	room.mu.Lock()
	defer room.unlock()
	p := room.paused
	if p.journal || room.life.Writable() != nil {
		if err := room.life.Recover(); err != nil {
			room.pauseWait = min(2*room.pauseWait, maxPause)
			if err.Error() != p.why.Error() {
				room.log.Printf("the journal: %v; task starts stay paused", err)
				p.why = err
			}
			time.AfterFunc(room.pauseWait, room.retryStarts)
			return
		}
	}
	room.paused = nil
	room.log.Print("task starts resume")
	room.holdTasksLocked(false)
	room.serveLocked()
}

// holdTasksLocked holds (or releases) every task waiting in line, as
// task starts are paused (resumed). A task being cancelled, or one its
// owner holds, stays held.
func (room *Room) holdTasksLocked(hold bool) {
	for _, w := range room.cpuq.Waiters() {
		if t := taskOf(w); t != nil {
			w.Held = hold || room.heldLocked(t)
		}
	}
	for _, t := range room.jobs {
		if t.inLine && !t.Sub.NoDevice {
			room.table.Hold(t.w, hold || room.heldLocked(t))
		}
	}
}

// specLocked is what t's process is told when it is got ready: what it
// runs, where, as whom, with what limits; the devices and their variables
// come with the go-ahead.
func (room *Room) specLocked(t *journal.Task) *wire.Spec {
	env := slices.Clone(t.Sub.Env)
	if t.Sub.NoDevice {
		env = append(env, npu.HiddenEnv()...)
		threads := strconv.Itoa(room.policy().Tasks.CPUThreads)
		for _, v := range []string{"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"} {
			env = capThreads(env, v, room.policy().Tasks.CPUThreads, threads)
		}
	}
	env = append(env, "NPURUN_TASK_ID="+strconv.FormatUint(t.ID, 10), "NPURUN_SOCKET="+room.socket)
	return &wire.Spec{
		ID: t.ID, UID: t.UID, Argv: t.Argv, Cwd: t.Sub.Cwd, Env: env, Log: t.Log, Umask: t.Sub.Umask,
		TimeSec: t.TimeSec, GraceSec: int64(room.policy().Tasks.KillGrace / time.Second),
		Idle: t.Sub.NoDevice && room.policy().Tasks.IdlePriority, Socket: room.socket, Notify: t.Notify, Name: t.Sub.Name,
	}
}

// goAheadLocked is the go-ahead for a granted task: its devices and their
// variables (the descriptors travel beside it).
func (room *Room) goAheadLocked(t *journal.Task) *wire.Spec {
	g := &wire.Spec{ID: t.ID, Devices: t.Devices}
	if !t.Sub.NoDevice {
		g.Env = room.inv.Env(t.Devices)
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

// goneLocked is called when a task's process, pid, has exited (the
// runner's Host.Gone). It has reported the end before exiting, unless it
// was killed: then the task is lost, and what is left of it is killed, so
// that its lease, time limit and slot do not outlive the process that
// kept them. A process that exits while its task is being started is
// launch's to handle.
func (room *Room) goneLocked(t *Task, pid int) {
	if t.launching || t.State != journal.Running || t.PID != pid {
		return
	}
	room.run.Kill(t)
	if t.State != journal.Running || t.PID != pid {
		return // it reported meanwhile
	}
	reason := "its supervisor ended without reporting; exit status unknown"
	if t.overran {
		reason = fmt.Sprintf("killed by the broker: time limit %s overrun", quantity.Duration(time.Duration(t.TimeSec)*time.Second))
	}
	room.life.EndNow(t.Task, journal.Lost, reason)
}

// stopLocked has a running task stopped: its runner asks it to stop as
// soon as it can take it (Runner.Stop).
func (room *Room) stopLocked(t *Task) {
	t.cancel = true
	if t.State == journal.Running {
		room.run.Stop(t)
	}
}

// overrunLimit is how long past its time limit and grace a task may run
// before the broker, not trusting the submitter's supervisor, kills it.
const overrunLimit = 30 * time.Second

// backstopLocked arms the room's own backstop for t's time limit,
// measured on the monotonic clock from the start recorded in this boot,
// so that a step of the wall clock cannot fool it. It returns how long the
// task may run on (0: no limit).
func (room *Room) backstopLocked(t *Task) time.Duration {
	if t.TimeSec <= 0 {
		return 0
	}
	limit := time.Duration(t.TimeSec)*time.Second + room.policy().Tasks.KillGrace + overrunLimit
	var left time.Duration
	if t.StartMono > 0 && t.Boot == room.boot {
		left = limit - (monoNow() - time.Duration(t.StartMono)*time.Millisecond)
	} else {
		// Recorded by an older broker, without the monotonic clock.
		left = time.Until(time.UnixMilli(t.Started).Add(limit))
	}
	pid := t.PID
	time.AfterFunc(left, func() {
		room.mu.Lock()
		defer room.unlock()
		if t.State != journal.Running || t.PID != pid {
			return
		}
		t.overran = true
		room.log.Printf("task %d overran its time limit; killing what is left of it", t.ID)
		room.run.Kill(t)
	})
	return max(left, time.Nanosecond)
}
