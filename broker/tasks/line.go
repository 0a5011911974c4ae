package tasks

import (
	"slices"
	"time"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/refusal"
	"github.com/npurun/npurun/broker/tasks/journal"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
)

// Tasks wait in one line with every other request: a device task in the
// lease table's (Plan serves tasks, npurun requests and login sessions
// alike, interleaved across users), a --no-device task in the CPU slots'
// queue, which the room serves with the same Plan. The owner serves
// the table's line (Schedule), holding its lock; the grants of tasks are
// the room's, the others the owner's.

// taskOf is the task a waiter queues; nil for another holder's request.
func taskOf(w *lease.Waiter) *Task {
	t, _ := w.Ref.(*Task)
	return t
}

// waiterLocked makes the waiter that queues t.
func (room *Room) waiterLocked(t *Task) (*lease.Waiter, error) {
	acct := t.acct
	if t.Sub.NoDevice {
		if len(room.cpuFree) == 0 {
			return nil, refusal.New(ErrDenied, "", "this broker has no CPU slots for --no-device tasks ([tasks] cpu_slots = 0)")
		}
		w := &lease.Waiter{Holder: room.taskHolder(t), N: 1, Cand: room.cpuSlots, Pool: cpuPool, Ref: t,
			Limit: room.policy().LimitFor(acct.Name, acct.Groups), Queued: time.Now()}
		return w, nil
	}
	if room.outside != nil {
		if err := room.outside.Refusal(t.Sub.Devices); err != nil {
			return nil, err
		}
	}
	w, err := room.table.Admit(lease.Request{Holder: room.taskHolder(t), N: t.Sub.N, Devices: t.Sub.Devices, Pool: t.Sub.Pool,
		Limit: room.policy().LimitFor(acct.Name, acct.Groups), Mem: t.Sub.Mem})
	if err != nil {
		return nil, err
	}
	w.Ref = t
	return w, nil
}

// taskHolder is the holder of t's lease: its submitter, as recorded, and
// the longest the lease may last (its time limit, then kill_grace's
// SIGTERM to SIGKILL), if it has a limit.
func (room *Room) taskHolder(t *Task) lease.Holder {
	h := lease.Holder{Kind: lease.Task, UID: t.UID, User: t.User, Task: t.ID}
	if t.TimeSec > 0 {
		h.Limit = time.Duration(t.TimeSec)*time.Second + room.policy().Tasks.KillGrace
	}
	return h
}

// settleLocked puts a waiting task where it belongs: in line, or blocked
// behind its --after tasks, or ended (failed) when one of them did not
// succeed or it cannot be queued. While the journal's tasks are taken up
// it only puts the task in line: the line is served once all of them are
// back (a pass per task would give the free devices to the first user's
// tasks before the other users' are in line to interleave with them).
func (room *Room) settleLocked(t *Task) {
	if !room.life.Settle(t.Task) || t.inLine {
		return
	}
	if t.w == nil {
		if t.acct == nil || t.lookupErr != nil {
			t.acct = room.accounts.Lookup(t.UID) // replayed from the journal
		}
		if err := t.acct.Unanswered(); err != nil {
			// Its limits and pools depend on its account: it waits out
			// of line until the user database answers (a name service
			// not up yet at boot, no descriptors left), rather than be
			// judged on a stand-in's.
			room.lookupLaterLocked(t, err)
			return
		}
		t.lookupErr = nil
		w, err := room.waiterLocked(t)
		if err != nil {
			room.life.EndNow(t.Task, journal.Failed, "cannot be queued: "+err.Error())
			return
		}
		t.w = w
	}
	room.addLineLocked(t, false)
	if !room.loading {
		room.serveLocked()
	}
}

// Waits before the accounts of waiting tasks are looked up again, after a
// lookup failed for a reason that passes.
const (
	firstLookupWait = time.Second
	maxLookupWait   = 30 * time.Second
)

// lookupLaterLocked keeps waiting task t out of line until its account can
// be looked up, and arranges for it to be settled again then.
func (room *Room) lookupLaterLocked(t *Task, why error) {
	if t.lookupErr == nil {
		room.log.Printf("task %d: %v; it waits until the user database can be read", t.ID, why)
	}
	t.lookupErr = why
	if room.unresolved == nil {
		room.unresolved = map[uint64]*Task{}
	}
	room.unresolved[t.ID] = t
	if room.lookupSet {
		return
	}
	room.lookupSet = true
	room.lookupWait = min(max(2*room.lookupWait, firstLookupWait), maxLookupWait)
	time.AfterFunc(room.lookupWait, room.lookupAgain)
}

// lookupAgain looks up the accounts of the tasks kept out of line for a
// failed lookup, without the lock, then settles them again.
func (room *Room) lookupAgain() {
	room.mu.Lock()
	room.lookupSet = false
	uids := map[uint32]bool{}
	for _, t := range room.unresolved {
		uids[t.UID] = true
	}
	room.mu.Unlock()
	ok := true
	for uid := range uids {
		if room.accounts.Lookup(uid).Unanswered() != nil {
			ok = false
		}
	}
	room.mu.Lock()
	defer room.unlock()
	if ok {
		room.lookupWait = 0
	}
	todo := room.unresolved
	room.unresolved = nil
	for id, t := range todo {
		if room.jobs[id] == t && t.IsWaiting() && !t.inLine {
			room.settleLocked(t)
		}
	}
}

// requeueLocked puts a task that was taken out of line for its start back
// in the place it had.
func (room *Room) requeueLocked(t *Task) {
	if t.inLine || t.w == nil || !t.IsWaiting() {
		return
	}
	room.addLineLocked(t, true)
}

// addLineLocked puts t's waiter in its line: the lease table's, or the CPU
// slots' queue for a task that needs no device; readd puts it back in the
// place it had. (Waiting tasks are capped by max_queued_tasks, not by
// max_waiting_per_user, which is for npurun's requests: a user's queued
// tasks never lock them out of an interactive npurun.)
func (room *Room) addLineLocked(t *Task, readd bool) {
	t.w.Held = room.heldLocked(t) // not in line yet: nobody else reads it
	t.inLine = true
	switch {
	case t.Sub.NoDevice && readd:
		room.cpuq.Readd(t.w)
	case t.Sub.NoDevice:
		room.cpuq.Add(t.w)
	case readd:
		room.table.Readd(t.w)
	default:
		room.table.Add(t.w)
	}
}

// heldLocked tells whether t's waiter is to be held in its place in line:
// task starts are paused, its cancel is being recorded, or its owner
// holds it (task-submit hold).
func (room *Room) heldLocked(t *Task) bool { return room.paused != nil || t.Busy() || t.Held }

// holdLocked holds t's waiter in its place in line (skipped, reserving
// nothing), or lets it be served again.
func (room *Room) holdLocked(t *Task, held bool) {
	switch {
	case t.w == nil:
	case t.inLine && !t.Sub.NoDevice:
		room.table.Hold(t.w, held)
	default:
		t.w.Held = held
	}
}

// removeLineLocked takes t out of its queue.
func (room *Room) removeLineLocked(t *Task) {
	if !t.inLine {
		return
	}
	if t.Sub.NoDevice {
		room.cpuq.Remove(t.w, false)
	} else {
		room.table.Remove(t.w)
	}
	t.inLine = false
}

// endedLocked is called by the task table when a task has ended, however
// it ended: its place in line, its runner's hold and its slot are let go,
// its watchers are told, and the tasks waiting for it are settled. (Its
// devices free themselves once their locks go: their watchers see it;
// endLeaseLocked ends whoever holds them still.)
func (room *Room) endedLocked(t *journal.Task) {
	room.endLeaseLocked(t.ID) // its lease too, whoever holds its descriptors (taskend.go)
	if j := room.jobs[t.ID]; j != nil {
		delete(room.jobs, t.ID)
		room.removeLineLocked(j)
		room.run.Ended(j)
		if t.Slot >= 0 && t.Slot < len(room.cpuFree) {
			room.cpuFree[t.Slot] = true
		}
		for _, w := range j.waits {
			room.unwatchLocked(w, j)
			room.out.ended = append(room.out.ended, endNote{w: w, info: Info(t, true, 0)})
		}
		j.waits = nil
	}
	for _, d := range room.life.Dependents(t.ID) {
		if j := room.jobs[d.ID]; j != nil && d.State == journal.Blocked {
			room.settleLocked(j)
		}
	}
	if !room.loading {
		room.serveLocked()
	}
}

// Served is what a pass of Schedule leaves its owner to do, in this order:
// record the tasks' leases begun, deliver the other grants, and, where
// Schedule was asked to leave them (here), launch the tasks granted once
// the owner's lock is let go.
type Served struct {
	Begun  []Begun           // the leases of the tasks granted, for the owner's record of grants (status)
	Others []*lease.Handover // the grants of the requests that are not tasks': the owner delivers each, then commits or returns it
	Starts []Start           // with here: the tasks granted, for Launch
	Again  bool              // a task's grant was given back: its devices are free again, and the line may be served again
}

// Begun is a task's lease, begun by handover H.
type Begun struct {
	Lease *lease.Lease
	H     *lease.Handover
}

// Start is a granted task to launch, with its lock descriptors; ready
// tells that its readied start is ready, so that its launch takes no
// process start and no user lookup.
type Start struct {
	t     *Task
	fds   []int
	ready bool
}

// Schedule serves the line, for its owner, which calls it holding its own
// lock: the lease table plans (Table.Schedule); the room starts the
// tasks among its grants (they are recorded as starting and their leases
// begin; the room launches them, or, with here, leaves that to the
// caller: Launch) and returns the others; then the CPU slots go to the
// tasks that need no device, and the first tasks waiting have their
// starts readied.
//
// here is for a caller that launches the tasks granted itself, once it
// has let its lock go: where a lease's end hands its device to the next
// task (the handoff), a goroutine started for the launch costs a wake-up
// on the start's path, 0.1–0.3 ms on a busy machine here.
func (room *Room) Schedule(here bool) Served {
	room.mu.Lock()
	defer room.mu.Unlock()
	var sv Served
	for _, h := range room.table.Schedule(room.running) {
		if t := taskOf(h.W); t != nil {
			if !room.startLocked(t, h, -1, here, &sv) {
				sv.Again = true
			}
			continue
		}
		sv.Others = append(sv.Others, h)
	}
	if room.cpuq.Len() > 0 && slices.Contains(room.cpuFree, true) {
		for _, g := range lease.Plan(room.cpuq.Waiters(), room.cpuFree, room.table.RoomFor(room.cpuq, room.running)) {
			room.cpuq.Remove(g.W, true)
			room.startLocked(taskOf(g.W), nil, g.Devices[0], here, &sv)
		}
	}
	if !room.loading {
		room.warmLocked()
	}
	return sv
}

// Deliver starts the task that handover h grants devices to, devices an
// allocator outside the line picked (a Slurm placeholder's, Config.Outside),
// as Schedule starts the tasks among the line's grants; the owner calls it
// holding its own lock, and records the lease begun (Served.Begun). The task
// is launched in a goroutine of its own. mine tells whether h was a task's
// (else the owner delivers it); Served.Again that its start failed, its
// devices free again.
func (room *Room) Deliver(h *lease.Handover) (sv Served, mine bool) {
	t := taskOf(h.W)
	if t == nil {
		return sv, false
	}
	room.mu.Lock()
	defer room.mu.Unlock()
	if !room.startLocked(t, h, -1, false, &sv) {
		sv.Again = true
	}
	return sv, true
}

// Refuse ends the task waiter w queues, which an allocator outside the
// line refused or gave up (its placeholder refused or ended by Slurm; msg
// says why): it fails, not started. It tells whether w was a task's,
// waiting in line. It is called holding no lock of the owner's.
func (room *Room) Refuse(w *lease.Waiter, msg string) bool {
	t := taskOf(w)
	if t == nil {
		return false
	}
	room.mu.Lock()
	defer room.unlock()
	if t.w != w || !t.inLine {
		return false
	}
	room.removeLineLocked(t)
	room.life.EndNow(t.Task, journal.Failed, "not started: "+msg)
	return true
}

// TimeLimit is the time limit of the task waiter w queues, its --time
// (an allocator outside the line asks it for its placeholder); 0 for
// another holder's request, or a task without one.
func (room *Room) TimeLimit(w *lease.Waiter) time.Duration {
	t := taskOf(w)
	if t == nil {
		return 0
	}
	room.mu.Lock()
	defer room.mu.Unlock()
	return time.Duration(t.TimeSec) * time.Second
}

// startLocked starts a granted task: the devices (or CPU slot) are its
// from now on, and it is starting; its process, its start record and the
// go-ahead follow in launch. h is the lease table's handover of its
// devices (nil for a --no-device task, granted CPU slot slot instead, -1
// otherwise): its lease begins here, and the room keeps its copies of
// the lock descriptors only until the task's process has them.
func (room *Room) startLocked(t *Task, h *lease.Handover, slot int, here bool, sv *Served) bool {
	var devices []int
	if h != nil {
		devices = h.Devices
	}
	if err := room.life.Grant(t.Task, devices, slot, time.Now()); err != nil {
		// Only pending tasks that are not being cancelled are in line
		// unheld: this is a bug. Keep the devices free and the task in
		// its place, held so that the next pass does not grant it again.
		room.log.Printf("%v", err)
		if h != nil {
			room.table.Return(h)
		}
		t.inLine = false // Plan's caller took it out
		room.requeueLocked(t)
		room.holdLocked(t, true)
		return false
	}
	t.inLine = false
	var fds []int
	if h != nil {
		// A restricted account's access, before its supervisor starts (a
		// --no-device task gets none, the control nodes' included).
		if err := room.table.Allow(h); err != nil {
			room.log.Printf("task %d: open npu %s to uid %d: %v", t.ID, npu.FormatIDs(devices), t.UID, err)
		}
		l := room.table.Commit(h)
		fds = h.FDs()
		sv.Begun = append(sv.Begun, Begun{Lease: l, H: h})
	}
	if slot >= 0 {
		room.cpuFree[slot] = false
	}
	if here {
		_, ready := room.run.Warmed(t)
		sv.Starts = append(sv.Starts, Start{t, fds, ready})
	} else {
		go room.launch(t, fds)
	}
	return true
}

// Launch launches starts that Schedule left to its caller: one whose
// start is ready in this goroutine (the caller, a device's release
// watcher, waits for its next release meanwhile: not for a process start
// or a lookup), the others in goroutines of their own.
func (room *Room) Launch(starts []Start) {
	here := -1
	for i, l := range starts {
		if l.ready {
			here = i
		}
	}
	for i, l := range starts {
		if i != here {
			go room.launch(l.t, l.fds)
		}
	}
	if here >= 0 {
		room.launch(starts[here].t, starts[here].fds)
	}
}

// warmLocked has the runner ready the starts of the first task waiting in
// each pool, so that their grants start their commands at once.
func (room *Room) warmLocked() {
	// Called on every scheduling pass, under the lock: with no task waiting
	// (npurun alone) it must cost nothing, and with a long line no more
	// than the walk to each pool's first task.
	if room.life == nil || !room.life.AnyWaiting() || room.paused != nil {
		return
	}
	var few [16]*lease.Waiter
	for _, w := range room.cpuq.FirstTasks(room.table.FirstTasks(few[:0])) {
		t := taskOf(w)
		if warm, _ := room.run.Warmed(t); warm {
			continue
		}
		ready, ok := room.run.Warm(t, func() *wire.Spec { return room.specLocked(t.Task) })
		if !ok {
			return
		}
		go room.warmUp(t, ready)
	}
}

// warmUp readies t's start with ready, then arms t (package journal): its start,
// when it is granted, need not wait for the disk. An arm that cannot be
// recorded leaves t's start to wait for the disk, as any.
func (room *Room) warmUp(t *Task, ready func()) {
	ready()
	room.mu.Lock()
	defer room.unlock()
	if room.life != nil && t.IsWaiting() {
		_ = room.life.Arm(t.Task)
	}
}
