package tasks

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/tasklife"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
)

// A granted task starts in three steps, the same for every runner: its
// process is got ready (Runner.Prepare: readied while it waited, or made
// now), its start is recorded with that process in the journal (durable,
// or written only for an armed task: tasklife), and only then is the
// process given its go-ahead with the devices (Runner.GoAhead). So a
// broker that dies before the start record is on disk leaves nothing
// running that the journal does not know, and a task runs at most once.
//
// When a start cannot be made for a reason that passes (the journal cannot
// be written, the broker is out of descriptors or processes), the task goes
// back to its place in line and the runtime starts no task until it has
// tried again, with a growing wait; leases are served meanwhile.

// launch starts a granted task: its process (readied, or made now), the
// start record with the process made durable, then the go-ahead with the
// lock descriptors. The runtime's copies of the descriptors are closed at
// the end: by then the process has them, or nobody will, and the devices
// go back to the line.
func (rt *Runtime) launch(t *Task, fds []int) {
	defer func() {
		for _, fd := range fds {
			closeFD(fd)
		}
	}()
	rt.mu.Lock()
	defer rt.unlock()
	spec := func() *wire.Spec { return rt.specLocked(t.Task) }
	var p Proc
	for try := 0; ; try++ {
		wait := rt.run.Prepare(t, spec, try > 0) // the second try: not the readied one, which failed or died while waiting
		rt.unlock()
		var err error
		p, err = wait() // here: a goroutine more would be a wake-up more
		rt.mu.Lock()
		if err == nil {
			break
		}
		if try == 0 {
			continue
		}
		if passing(err) {
			rt.ungrantLocked(t, fmt.Errorf("task %d: %w", t.ID, err), false)
			return
		}
		rt.log.Printf("task %d: %v", t.ID, err)
		if err := rt.life.End(t.Task, tasklife.Failed, nil, "not started: "+err.Error()); err != nil {
			rt.ungrantLocked(t, fmt.Errorf("task %d: record its failure: %w", t.ID, err), true)
		}
		return
	}
	if t.cancel {
		// Cancelled while it was being granted: it never starts.
		rt.run.Release(t, p)
		rt.ungrantLocked(t, nil, false)
		rt.cancelLocked(t, t.cancelBy)
		return
	}
	pid, start := p.Process()
	if err := rt.life.Start(t.Task, pid, start, rt.boot, int64(monoNow()/time.Millisecond)); err != nil {
		rt.run.Release(t, p) // it exits having run nothing
		rt.ungrantLocked(t, fmt.Errorf("task %d: record its start: %w", t.ID, err), true)
		return
	}
	rt.pauseWait = 0
	goAhead := rt.goAheadLocked(t.Task)
	t.launching = true
	rt.unlock()
	testHook(rt.log, hookBeforeGoAhead, t.ID)
	err := rt.run.GoAhead(t, p, goAhead, fds)
	rt.mu.Lock()
	t.launching = false
	if err != nil {
		rt.log.Printf("task %d: give the supervisor its go-ahead: %v", t.ID, err)
	}
	if rt.run.Gone(p) {
		// Gone before or while starting: goneLocked left it to us, so
		// that its end is recorded after its start.
		rt.goneLocked(t, pid)
		return
	}
	rt.backstopLocked(t)
	if t.cancel {
		rt.stopLocked(t) // cancelled while it was being started
	}
}

// passing tells whether a task's process could not be got ready for a
// reason that passes: the user database cannot be read, the task's
// control group cannot be made, its start time cannot be read, the broker
// is out of descriptors, processes or memory.
func passing(err error) bool {
	for _, e := range []error{errLookup, errCgroup, errStartTime, unix.EMFILE, unix.ENFILE, unix.EAGAIN, unix.ENOMEM, unix.ENOBUFS, unix.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// ungrantLocked puts a task whose start could not be made back in its
// place in line, and, when why is not nil, stops task starts until the
// runtime has tried again: journal tells that the journal could not be
// written.
func (rt *Runtime) ungrantLocked(t *Task, why error, journal bool) {
	if t.Slot >= 0 && t.Slot < len(rt.cpuFree) {
		rt.cpuFree[t.Slot] = true
	}
	rt.life.Ungrant(t.Task)
	if why != nil {
		rt.pauseStartsLocked(why, journal)
	}
	rt.requeueLocked(t)
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
// place, and the runtime tries again after a wait that grows each time.
func (rt *Runtime) pauseStartsLocked(why error, journal bool) {
	if rt.paused != nil {
		rt.paused.journal = rt.paused.journal || journal
		return
	}
	rt.paused = &pause{why: why, journal: journal}
	rt.pauseWait = min(max(2*rt.pauseWait, firstPause), maxPause)
	rt.log.Printf("%v; task starts paused (leases go on), trying again in %s", why, quantity.Duration(rt.pauseWait))
	rt.holdTasksLocked(true)
	time.AfterFunc(rt.pauseWait, rt.retryStarts)
}

// retryStarts resumes task starts once the journal can be written, or
// waits longer.
func (rt *Runtime) retryStarts() {
	rt.mu.Lock()
	defer rt.unlock()
	p := rt.paused
	if p.journal || rt.life.Writable() != nil {
		if err := rt.life.Recover(); err != nil {
			rt.pauseWait = min(2*rt.pauseWait, maxPause)
			if err.Error() != p.why.Error() {
				rt.log.Printf("the journal: %v; task starts stay paused", err)
				p.why = err
			}
			time.AfterFunc(rt.pauseWait, rt.retryStarts)
			return
		}
	}
	rt.paused = nil
	rt.log.Print("task starts resume")
	rt.holdTasksLocked(false)
	rt.serveLocked()
}

// holdTasksLocked holds (or releases) every task waiting in line, as
// task starts are paused (resumed). A task being cancelled, or one its
// owner holds, stays held.
func (rt *Runtime) holdTasksLocked(hold bool) {
	for _, w := range rt.cpuq.Waiters() {
		if t := taskOf(w); t != nil {
			w.Held = hold || rt.heldLocked(t)
		}
	}
	for _, t := range rt.jobs {
		if t.inLine && !t.Sub.NoDevice {
			rt.table.Hold(t.w, hold || rt.heldLocked(t))
		}
	}
}

// specLocked is what t's process is told when it is got ready: what it
// runs, where, as whom, with what limits; the devices and their variables
// come with the go-ahead.
func (rt *Runtime) specLocked(t *tasklife.Task) *wire.Spec {
	env := slices.Clone(t.Sub.Env)
	if t.Sub.NoDevice {
		env = append(env, npu.HiddenEnv()...)
		threads := strconv.Itoa(rt.policy().Tasks.CPUThreads)
		for _, v := range []string{"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"} {
			env = capThreads(env, v, rt.policy().Tasks.CPUThreads, threads)
		}
	}
	env = append(env, "NPURUN_TASK_ID="+strconv.FormatUint(t.ID, 10), "NPURUN_SOCKET="+rt.socket)
	return &wire.Spec{
		ID: t.ID, UID: t.UID, Argv: t.Argv, Cwd: t.Sub.Cwd, Env: env, Log: t.Log, Umask: t.Sub.Umask,
		TimeSec: t.TimeSec, GraceSec: int64(rt.policy().Tasks.KillGrace / time.Second),
		Idle: t.Sub.NoDevice && rt.policy().Tasks.IdlePriority, Socket: rt.socket, Notify: t.Notify, Name: t.Sub.Name,
	}
}

// goAheadLocked is the go-ahead for a granted task: its devices and their
// variables (the descriptors travel beside it).
func (rt *Runtime) goAheadLocked(t *tasklife.Task) *wire.Spec {
	g := &wire.Spec{ID: t.ID, Devices: t.Devices}
	if !t.Sub.NoDevice {
		g.Env = rt.inv.Env(t.Devices)
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
func (rt *Runtime) goneLocked(t *Task, pid int) {
	if t.launching || t.State != tasklife.Running || t.PID != pid {
		return
	}
	rt.run.Kill(t)
	if t.State != tasklife.Running || t.PID != pid {
		return // it reported meanwhile
	}
	reason := "its supervisor ended without reporting; exit status unknown"
	if t.overran {
		reason = fmt.Sprintf("killed by the broker: time limit %s overrun", quantity.Duration(time.Duration(t.TimeSec)*time.Second))
	}
	rt.life.EndNow(t.Task, tasklife.Lost, reason)
}

// stopLocked has a running task stopped: its runner asks it to stop as
// soon as it can take it (Runner.Stop).
func (rt *Runtime) stopLocked(t *Task) {
	t.cancel = true
	if t.State == tasklife.Running {
		rt.run.Stop(t)
	}
}

// overrunLimit is how long past its time limit and grace a task may run
// before the broker, not trusting the submitter's supervisor, kills it.
const overrunLimit = 30 * time.Second

// backstopLocked arms the runtime's own backstop for t's time limit,
// measured on the monotonic clock from the start recorded in this boot,
// so that a step of the wall clock cannot fool it. It returns how long the
// task may run on (0: no limit).
func (rt *Runtime) backstopLocked(t *Task) time.Duration {
	if t.TimeSec <= 0 {
		return 0
	}
	limit := time.Duration(t.TimeSec)*time.Second + rt.policy().Tasks.KillGrace + overrunLimit
	var left time.Duration
	if t.StartMono > 0 && t.Boot == rt.boot {
		left = limit - (monoNow() - time.Duration(t.StartMono)*time.Millisecond)
	} else {
		// Recorded by an older broker, without the monotonic clock.
		left = time.Until(time.UnixMilli(t.Started).Add(limit))
	}
	pid := t.PID
	time.AfterFunc(left, func() {
		rt.mu.Lock()
		defer rt.unlock()
		if t.State != tasklife.Running || t.PID != pid {
			return
		}
		t.overran = true
		rt.log.Printf("task %d overran its time limit; killing what is left of it", t.ID)
		rt.run.Kill(t)
	})
	return max(left, time.Nanosecond)
}
