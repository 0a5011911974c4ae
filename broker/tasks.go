package broker

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/npurun/npurun/broker/client"
)

// task is a detached task: its submission, resolved at submit time, and
// what became of it. The exported fields are its journal record.
type task struct {
	ID      uint64            `json:"id"`
	UID     uint32            `json:"uid"`
	User    string            `json:"user"`
	Sub     client.Submission `json:"sub"`
	Argv    []string          `json:"argv"`     // resolved: --run is [shell, -c, string]
	Log     string            `json:"log"`      // resolved
	TimeSec int64             `json:"time_sec"` // resolved with the policy's default

	State     string         `json:"state"`
	Submitted int64          `json:"submitted"` // Unix ms
	Started   int64          `json:"started,omitempty"`
	Ended     int64          `json:"ended,omitempty"`
	Devices   []int          `json:"devices,omitempty"`
	Slot      int            `json:"slot"` // CPU slot of a --no-device task, -1 otherwise
	PID       int            `json:"pid,omitempty"`
	PIDStart  uint64         `json:"pid_start,omitempty"` // the supervisor's start time, against pid reuse
	Status    *client.Status `json:"status,omitempty"`
	Reason    string         `json:"reason,omitempty"`

	w        *Waiter     // while pending
	waits    []*conn     // connections waiting for its end
	cancel   bool        // a cancel came while it was running
	durable  bool        // its submission is in the journal: it may be seen
	overran  bool        // the broker killed it for overrunning its time limit
	starting bool        // launch is recording its start
	sup      *supervisor // its supervisor, once started (warm while it waits)
	acct     *account    // the submitter, as looked up at submission
}

// record is one line of the journal.
type record struct {
	Op       string         `json:"op"` // "task": a whole task; "start", "end": changes
	Task     *task          `json:"task,omitempty"`
	ID       uint64         `json:"id,omitempty"`
	Time     int64          `json:"time,omitempty"`
	Devices  []int          `json:"devices,omitempty"`
	Slot     int            `json:"slot,omitempty"`
	PID      int            `json:"pid,omitempty"`
	PIDStart uint64         `json:"pid_start,omitempty"`
	State    string         `json:"state,omitempty"`
	Status   *client.Status `json:"status,omitempty"`
	Reason   string         `json:"reason,omitempty"`
}

func (t *task) ended() bool {
	switch t.State {
	case client.StatePending, client.StateBlocked, client.StateRunning:
		return false
	}
	return true
}

func (t *task) command() string {
	if t.Sub.Shell != "" {
		return t.Sub.Shell
	}
	parts := make([]string, len(t.Sub.Argv))
	for i, a := range t.Sub.Argv {
		parts[i] = shellQuote(a)
	}
	return strings.Join(parts, " ")
}

func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// info is t as asker may see it.
func (t *task) info(full bool, pos int) client.TaskInfo {
	ti := client.TaskInfo{
		ID: t.ID, User: t.User, UID: t.UID, Name: t.Sub.Name, State: t.State,
		N: t.Sub.N, Pool: t.Sub.Pool, NoDevice: t.Sub.NoDevice, Devices: t.Devices,
		After: t.Sub.After, TimeSec: t.TimeSec, Position: pos,
		Submitted: t.Submitted, Started: t.Started, Ended: t.Ended, Reason: t.Reason,
	}
	if len(t.Devices) == 0 && len(t.Sub.Devices) > 0 {
		ti.Devices = t.Sub.Devices
	}
	if t.Status != nil {
		ti.Exit, ti.Signal = t.Status.Exit, t.Status.Signal
		if t.Status.Reason != "" {
			ti.Reason = t.Status.Reason
		}
	}
	if full {
		ti.Command, ti.Cwd, ti.Env, ti.Log = t.command(), t.Sub.Cwd, t.Sub.Env, t.Log
	}
	return ti
}

// taskOp serves the task operations.
func (s *Server) taskOp(c *conn, req *client.Request) bool {
	if s.spool == nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		c.sendLocked(errReply(client.CodeDenied, "this broker runs no detached tasks (it has no state directory)", ""))
		return true
	}
	switch req.Op {
	case client.OpSubmit:
		return s.submit(c, req.Task)
	case client.OpTaskDone:
		return s.taskDone(c, req.ID, req.Status)
	}
	if req.Op == client.OpList {
		s.mu.Lock()
		tasks := s.listLocked(c, req.All)
		s.mu.Unlock()
		return c.sendTasks(tasks) == nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tasks[req.ID]
	if t == nil || !t.durable || (t.UID != c.uid && c.uid != 0) {
		c.sendLocked(errReply(client.CodeNoSuchTask, fmt.Sprintf("no task %d", req.ID), ""))
		return true
	}
	switch req.Op {
	case client.OpShow:
		c.sendLocked(&client.Reply{Type: client.TypeTasks, Tasks: []client.TaskInfo{t.info(true, s.positionLocked(t))}})
	case client.OpWait:
		if t.ended() {
			c.sendLocked(&client.Reply{Type: client.TypeTasks, Tasks: []client.TaskInfo{t.info(true, 0)}})
		} else if !slices.Contains(c.waiting, t) {
			if len(c.waiting) >= maxWaitsPerConn {
				c.sendLocked(errReply(client.CodeTooMany, fmt.Sprintf("one connection waits for at most %d tasks", maxWaitsPerConn), ""))
				return false
			}
			t.waits = append(t.waits, c)
			c.waiting = append(c.waiting, t)
		}
	case client.OpCancel:
		if t.State == client.StatePending || t.State == client.StateBlocked {
			// Taken off the queue now; durable before it is acknowledged.
			// (A crash before then leaves it pending: never acknowledged.)
			reason := "cancelled by " + c.acct.name
			s.endLocked(t, client.StateCancelled, nil, reason, false)
			s.mu.Unlock()
			err := s.spool.Append(&record{Op: "end", ID: t.ID, Time: t.Ended, State: client.StateCancelled, Reason: reason})
			s.mu.Lock()
			if err != nil {
				c.sendLocked(errReply("spool", "the broker could not record the cancel: "+err.Error(), ""))
				return true
			}
		} else if t.State == client.StateRunning {
			s.stopLocked(t)
		}
		c.sendLocked(&client.Reply{Type: client.TypeTasks, Tasks: []client.TaskInfo{t.info(true, 0)}})
	}
	return true
}

// Caps on what one submission and one connection may hold.
const (
	maxEnvBytes     = 32 << 10 // environment, all variables together
	maxCommandBytes = 16 << 10 // argv, or the --run string
	maxPathBytes    = 4096     // cwd, log
	maxReasonBytes  = 1024     // a supervisor's reason
	maxWaitsPerConn = 64
)

// submit validates a submission, makes it durable, then queues it.
func (s *Server) submit(c *conn, sub *client.Submission) bool {
	s.mu.Lock()
	t, rep := s.admitTaskLocked(c, sub)
	if rep != nil {
		c.sendLocked(rep)
		s.mu.Unlock()
		return rep.Code != client.CodeBadRequest
	}
	s.applying++
	s.mu.Unlock()

	// Durable before it is acknowledged or run.
	err := s.spool.Append(&record{Op: "task", Task: t})
	s.mu.Lock()
	defer s.mu.Unlock()
	s.applying--
	if err != nil {
		s.log.Printf("task %d: %v", t.ID, err)
		delete(s.tasks, t.ID)
		c.sendLocked(errReply("spool", "the broker could not record the task: "+err.Error(), ""))
		return true
	}
	// Concurrent submissions may become durable out of id order.
	i, _ := slices.BinarySearch(s.order, t.ID)
	s.order = slices.Insert(s.order, i, t.ID)
	t.durable = true
	s.enqueueLocked(t)
	rep = &client.Reply{Type: client.TypeSubmitted, ID: t.ID}
	switch t.State {
	case client.StatePending:
		rep.Position, rep.Pool = s.positionLocked(t), t.w.Pool
	case client.StateRunning:
		rep.Reason = "started"
		if len(t.Devices) > 0 {
			rep.Reason += " on " + s.inv.Vendor.Format(t.Devices)
		}
	case client.StateBlocked:
		rep.Reason = "waits for task " + joinIDs(t.Sub.After)
	default:
		rep.Reason = t.State + ": " + t.Reason
	}
	c.sendLocked(rep)
	return true
}

// admitTaskLocked checks a submission and resolves it into a task with an
// id, registered but not yet queued.
func (s *Server) admitTaskLocked(c *conn, sub *client.Submission) (*task, *client.Reply) {
	bad := func(format string, args ...any) (*task, *client.Reply) {
		return nil, errReply(client.CodeBadRequest, fmt.Sprintf(format, args...), "")
	}
	switch {
	case sub == nil:
		return bad("submit without a task")
	case (len(sub.Argv) == 0) == (sub.Shell == ""):
		return bad("a task needs either a command or a shell string, not both or neither")
	case !filepath.IsAbs(sub.Cwd):
		return bad("working directory %q is not absolute", sub.Cwd)
	case sub.Log != "" && !filepath.IsAbs(sub.Log):
		return bad("log %q is not absolute", sub.Log)
	case byteSize(sub.Env) > maxEnvBytes:
		return bad("environment of %d bytes, more than %d", byteSize(sub.Env), maxEnvBytes)
	case byteSize(sub.Argv)+len(sub.Shell) > maxCommandBytes:
		return bad("command of %d bytes, more than %d", byteSize(sub.Argv)+len(sub.Shell), maxCommandBytes)
	case len(sub.Cwd) > maxPathBytes || len(sub.Log) > maxPathBytes:
		return bad("path longer than %d bytes", maxPathBytes)
	case sub.TimeSec < 0:
		return bad("negative time limit")
	case sub.NoDevice && (sub.N != 0 || len(sub.Devices) > 0 || sub.Pool != ""):
		return bad("a --no-device task takes no device, count or pool")
	case len(sub.Name) > 200:
		return bad("name longer than 200 bytes")
	}
	if s.unprivileged && c.uid != uint32(os.Geteuid()) {
		return nil, errReply(client.CodeDenied, fmt.Sprintf("this broker runs unprivileged as uid %d and can run tasks for that uid only", os.Geteuid()), "")
	}
	lim := s.cfg.LimitFor(c.acct.name, c.acct.groups)
	limit := time.Duration(sub.TimeSec) * time.Second
	if limit == 0 {
		limit = s.cfg.Tasks.TimeLimit
	}
	if limit == 0 {
		limit = s.cfg.Tasks.MaxTime // a cap applies to tasks that name no limit too
	}
	if max := s.cfg.Tasks.MaxTime; max > 0 && limit > max {
		return nil, errReply(client.CodeDenied, fmt.Sprintf("time limit %s is longer than the %s allowed", limit, max), "")
	}
	if len(s.order) >= s.cfg.Tasks.MaxTasks+s.endedCount {
		return nil, errReply(client.CodeTooMany, fmt.Sprintf("the broker holds %d tasks, its most", s.cfg.Tasks.MaxTasks), "")
	}
	if lim.MaxQueued > 0 && s.queuedTasks[c.uid] >= lim.MaxQueued {
		return nil, errReply(client.CodeDenied, fmt.Sprintf("%s has %d tasks waiting, the limit (%s)", c.acct.name, s.queuedTasks[c.uid], lim.Source), "")
	}
	t := &task{
		UID: c.uid, User: c.acct.name, Sub: *sub, TimeSec: int64(limit / time.Second),
		State: client.StatePending, Submitted: time.Now().UnixMilli(), Slot: -1, acct: c.acct,
	}
	t.Sub.Env = cleanEnv(sub.Env)
	// Check the request now, so that a bad one is refused, not queued.
	if _, rep := s.waiterLocked(t, c.acct); rep != nil {
		return nil, rep
	}
	for _, dep := range sub.After {
		d := s.tasks[dep]
		if d == nil || !d.durable || (d.UID != c.uid && c.uid != 0) {
			return nil, errReply(client.CodeNoSuchTask, fmt.Sprintf("--after %d: no task %d", dep, dep), "")
		}
	}
	if sub.Shell != "" {
		t.Argv = []string{c.acct.shell, "-c", sub.Shell}
	} else {
		t.Argv = slices.Clone(sub.Argv)
	}
	s.nextID++
	t.ID = s.nextID
	t.Log = sub.Log
	if t.Log == "" {
		t.Log = filepath.Join(c.acct.home, ".local/state/npurun/tasks", strconv.FormatUint(t.ID, 10)+".log")
	}
	s.tasks[t.ID] = t
	return t, nil
}

func byteSize(list []string) int {
	n := 0
	for _, s := range list {
		n += len(s) + 1
	}
	return n
}

// leakVars are variables of the submitter's environment a task must not
// inherit: they belong to a lease or a broker of the submitter's session,
// and the task gets its own.
var leakVars = []string{"NPURUN_LEASE", "NPURUN_DEVICES", "NPURUN_SOCKET", "NPURUN_TASK_ID",
	"ASCEND_RT_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"}

func cleanEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		name, _, ok := strings.Cut(kv, "=")
		if ok && name != "" && !slices.Contains(leakVars, name) {
			out = append(out, kv)
		}
	}
	return out
}

// waiterLocked makes the waiter that queues t.
func (s *Server) waiterLocked(t *task, acct *account) (*Waiter, *client.Reply) {
	if t.Sub.NoDevice {
		if len(s.cpuFree) == 0 {
			return nil, errReply(client.CodeDenied, "this broker has no CPU slots for --no-device tasks ([tasks] cpu_slots = 0)", "")
		}
		w := &Waiter{UID: t.UID, N: 1, Cand: s.cpuSlots, Pool: "cpu", IsTask: true, task: t,
			user: acct.name, lim: s.cfg.LimitFor(acct.name, acct.groups), queued: time.Now()}
		return w, nil
	}
	w, rep := s.admitLocked(t.UID, acct, t.Sub.N, t.Sub.Devices, t.Sub.Pool)
	if rep != nil {
		return nil, rep
	}
	w.task, w.IsTask = t, true
	return w, nil
}

// enqueueLocked queues a pending task, or holds it while its dependencies
// run, or fails it if one of them failed.
func (s *Server) enqueueLocked(t *task) {
	for _, dep := range t.Sub.After {
		d := s.tasks[dep]
		switch {
		case d == nil:
			s.endLocked(t, client.StateFailed, nil, fmt.Sprintf("dependency %d is unknown", dep), true)
			return
		case d.State == client.StateDone:
			continue
		case d.ended():
			s.endLocked(t, client.StateFailed, nil, fmt.Sprintf("dependency %d %s", dep, describeEnd(d)), true)
			return
		default:
			if t.State != client.StateBlocked {
				t.State = client.StateBlocked
				s.queuedTasks[t.UID]++
			}
			return
		}
	}
	if t.State == client.StateBlocked {
		s.queuedTasks[t.UID]--
	}
	t.State = client.StatePending
	if t.acct == nil {
		t.acct = s.users.lookup(t.UID) // replayed from the journal, before serving
	}
	w, rep := s.waiterLocked(t, t.acct)
	if rep != nil {
		s.endLocked(t, client.StateFailed, nil, "cannot be queued: "+rep.Message, true)
		return
	}
	t.w = w
	s.queuedTasks[t.UID]++
	if t.Sub.NoDevice {
		s.cpuq.Add(w)
	} else {
		s.q.Add(w)
	}
	s.scheduleLocked()
}

func joinIDs(ids []uint64) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.FormatUint(id, 10)
	}
	return strings.Join(parts, ", ")
}

func describeEnd(t *task) string {
	ti := t.info(false, 0)
	switch {
	case t.State == client.StateCancelled:
		return "was cancelled"
	case ti.Exit != nil:
		return fmt.Sprintf("failed with exit status %d", *ti.Exit)
	case ti.Signal != "":
		return "was killed by " + ti.Signal
	case ti.Reason != "":
		return t.State + ": " + ti.Reason
	}
	return t.State
}

// startTaskLocked starts a granted task: the devices (or CPU slot) are
// its from now on; the journal record and the supervisor follow outside
// the lock. The broker keeps its copies of the lock descriptors only until
// the supervisor has inherited them.
func (s *Server) startTaskLocked(t *task, devices []int, slot ...int) bool {
	fds := make([]int, len(devices))
	for i, id := range devices {
		d := s.devs[id]
		fds[i] = d.fd
		d.fd = -1
		s.releasedLocked(d, t.UID)
	}
	s.taskGrantedLocked(t, devices, fds)
	t.w = nil
	s.queuedTasks[t.UID]--
	t.State, t.Started, t.Devices = client.StateRunning, time.Now().UnixMilli(), devices
	if len(slot) > 0 {
		t.Slot = slot[0]
		s.cpuFree[t.Slot] = false
	}
	s.running[t.UID]++
	go s.launch(t, fds)
	return true
}

// taskDone takes a supervisor's report. Only the task's supervisor may
// make it: the submitter's uid and the supervisor's pid, from SO_PEERCRED.
func (s *Server) taskDone(c *conn, id uint64, st *client.Status) bool {
	s.mu.Lock()
	t := s.tasks[id]
	ok := t != nil && st != nil && c.uid == t.UID &&
		(t.State == client.StateRunning || t.State == client.StateLost) &&
		t.PID != 0 && int(c.pid) == t.PID
	s.mu.Unlock()
	if !ok {
		s.mu.Lock()
		c.sendLocked(errReply(client.CodeDenied, fmt.Sprintf("not the supervisor of a running task %d", id), ""))
		s.mu.Unlock()
		return false
	}
	if len(st.Reason) > maxReasonBytes {
		st.Reason = st.Reason[:maxReasonBytes] + "…"
	}
	state := client.StateFailed
	switch {
	case st.Exit != nil && *st.Exit == 0 && st.Reason == "":
		state = client.StateDone
	case st.Reason == "cancelled":
		state = client.StateCancelled
	}
	s.endTask(t, state, st, "")
	s.mu.Lock()
	c.sendLocked(&client.Reply{Type: client.TypeOK})
	s.mu.Unlock()
	return true
}

// endTask records a task's end durably, then applies it.
func (s *Server) endTask(t *task, state string, st *client.Status, reason string) {
	now := time.Now().UnixMilli()
	s.mu.Lock()
	s.applying++
	s.mu.Unlock()
	err := s.spool.Append(&record{Op: "end", ID: t.ID, Time: now, State: state, Status: st, Reason: reason})
	s.mu.Lock()
	defer s.mu.Unlock()
	s.applying--
	if err != nil {
		s.log.Printf("task %d: %v", t.ID, err)
	}
	s.endLocked(t, state, st, reason, false)
}

// endLocked applies a task's end: its slot and place freed, its waiters
// told, its dependents released or failed. (Its devices free themselves:
// their watchers see the locks go.)
// journal says whether the end still needs its record (it was decided
// under the lock); endTask has written it already.
func (s *Server) endLocked(t *task, state string, st *client.Status, reason string, journal bool) {
	switch t.State {
	case client.StateRunning:
		if s.running[t.UID]--; s.running[t.UID] <= 0 {
			delete(s.running, t.UID)
		}
		if t.Slot >= 0 && t.Slot < len(s.cpuFree) {
			s.cpuFree[t.Slot] = true
		}
	case client.StatePending:
		s.dropSupervisorLocked(t)
		if t.w != nil {
			if t.Sub.NoDevice {
				s.cpuq.Remove(t.w, false)
			} else {
				s.q.Remove(t.w, false)
			}
			t.w = nil
		}
		s.queuedTasks[t.UID]--
	case client.StateBlocked:
		s.queuedTasks[t.UID]--
	case client.StateLost:
		s.endedCount-- // counted when it was lost; counted again below
	default:
		return // already ended
	}
	if s.queuedTasks[t.UID] <= 0 {
		delete(s.queuedTasks, t.UID)
	}
	t.State, t.Ended, t.Reason = state, time.Now().UnixMilli(), reason
	t.Sub.Env = nil // an ended task keeps no environment
	if st != nil {
		t.Status = st
	}
	if journal {
		s.journalEndLocked(t, state, st, reason)
	}
	for _, c := range t.waits {
		if i := slices.Index(c.waiting, t); i >= 0 {
			c.waiting = slices.Delete(c.waiting, i, i+1)
		}
		if c.sendLocked(&client.Reply{Type: client.TypeTasks, Tasks: []client.TaskInfo{t.info(true, 0)}}) != nil {
			c.c.Close() // the client sees the end of the connection, not silence
		}
	}
	t.waits = nil
	s.endedCount++
	s.trimLocked()
	s.compactLocked()
	for _, id := range s.order {
		if d := s.tasks[id]; d != nil && d.State == client.StateBlocked && slices.Contains(d.Sub.After, t.ID) {
			s.enqueueLocked(d)
		}
	}
	s.scheduleLocked()
}

// journalEndLocked records an end that was decided under the lock (a
// dependency failed, a pending task was cancelled) without waiting for it.
func (s *Server) journalEndLocked(t *task, state string, st *client.Status, reason string) {
	if s.loading {
		return
	}
	go func() {
		if err := s.spool.Append(&record{Op: "end", ID: t.ID, Time: t.Ended, State: state, Status: st, Reason: reason}); err != nil {
			s.log.Printf("task %d: %v", t.ID, err)
		}
	}()
}

// compactLocked rewrites the journal from the task table once it has
// grown well past it. Records made durable before their change is applied
// (a submission, a task's end) must not be in flight: the table would
// miss them.
func (s *Server) compactLocked() {
	if s.loading || s.applying > 0 || s.spool.Records() < 4*len(s.tasks)+1000 {
		return
	}
	if err := s.spool.Compact(s.snapshot()); err != nil {
		s.log.Printf("compact the spool: %v", err)
	}
}

// trimLocked forgets the oldest ended tasks beyond what the policy keeps.
func (s *Server) trimLocked() {
	if s.endedCount <= s.cfg.Tasks.KeepEnded {
		return
	}
	keep := s.order[:0]
	for _, id := range s.order {
		t := s.tasks[id]
		if t != nil && t.ended() && s.endedCount > s.cfg.Tasks.KeepEnded {
			delete(s.tasks, id)
			s.endedCount--
			continue
		}
		keep = append(keep, id)
	}
	s.order = keep
}

// stopLocked asks a running task's supervisor to stop it (SIGTERM to the
// group, SIGKILL after the grace). A supervisor still being started gets
// the signal as soon as it exists.
func (s *Server) stopLocked(t *task) {
	t.cancel = true
	if t.PID > 0 && alive(s.proc, t.PID, t.PIDStart) {
		syscall.Kill(t.PID, syscall.SIGTERM)
	}
}

// positionLocked is a pending task's place in its line, 0 otherwise.
func (s *Server) positionLocked(t *task) int {
	if t.w == nil {
		return 0
	}
	q := s.q
	if t.Sub.NoDevice {
		q = s.cpuq
	}
	pos := 0
	for _, w := range q.Waiters() {
		if w.Pool == t.w.Pool {
			pos++
		}
		if w == t.w {
			return pos
		}
	}
	return 0
}

// listLocked returns the asker's tasks (everyone's with all), oldest
// first. Another user's command, directory, environment and log are left
// out unless the asker is root; nobody's environment is listed.
func (s *Server) listLocked(c *conn, all bool) []client.TaskInfo {
	pos := s.positionsLocked()
	var out []client.TaskInfo
	for _, id := range s.order {
		t := s.tasks[id]
		if t == nil || (!all && t.UID != c.uid) {
			continue
		}
		ti := t.info(t.UID == c.uid || c.uid == 0, pos[t.w])
		ti.Env = nil
		out = append(out, ti)
	}
	return out
}

// sendTasks sends tasks in as many "tasks" replies as their size takes,
// from the connection's own goroutine, waiting for the client to read.
// Each task is encoded once, and the replies are put together from the
// pieces.
func (c *conn) sendTasks(tasks []client.TaskInfo) error {
	head := []byte(`{"v":` + strconv.Itoa(client.Version) + `,"type":"` + client.TypeTasks + `","tasks":[`)
	msg := append([]byte(nil), head...)
	n := 0
	for i := range tasks {
		b, err := json.Marshal(&tasks[i])
		if err != nil {
			return err
		}
		if n > 0 && len(msg)+len(b)+len(`],"more":true}`) > client.MaxMessage {
			if err := c.sendRaw(append(msg, `],"more":true}`...)); err != nil {
				return err
			}
			msg, n = append(msg[:0], head...), 0
		}
		if n > 0 {
			msg = append(msg, ',')
		}
		msg = append(msg, b...)
		n++
	}
	return c.sendRaw(append(msg, `]}`...))
}

// positionsLocked is every waiter's place in its pool's line.
func (s *Server) positionsLocked() map[*Waiter]int {
	pos := map[*Waiter]int{}
	for _, q := range []*Queue{s.q, s.cpuq} {
		n := map[string]int{}
		for _, w := range q.Waiters() {
			n[w.Pool]++
			pos[w] = n[w.Pool]
		}
	}
	return pos
}

// forgetWaitsLocked drops a closed connection from the tasks it waits on.
func (s *Server) forgetWaitsLocked(c *conn) {
	for _, t := range c.waiting {
		if i := slices.Index(t.waits, c); i >= 0 {
			t.waits = slices.Delete(t.waits, i, i+1)
		}
	}
	c.waiting = nil
}
