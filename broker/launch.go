package broker

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/client"
	"github.com/npurun/npurun/npu"
)

// A task runs under a supervisor, `npubroker supervise ID`, started as the
// submitter in a session of its own. Its standard input is a SOCK_SEQPACKET
// socket to the broker carrying two messages: the Spec, sent at once, and,
// once the task is granted and its start is durable in the journal, the
// go-ahead: the devices, their variables and their lock descriptors
// (SCM_RIGHTS). A supervisor that sees the socket close first exits having
// run nothing. So the first tasks in line get their supervisors started
// while they wait ("warm"), and a grant costs one message, not a process
// start; and a broker that dies before the start record is on disk leaves
// nothing running that the journal does not know.

// maxWarm bounds the supervisors started ahead of their grant.
const maxWarm = 8

// supervisor is a task's supervisor process.
type supervisor struct {
	pid    int
	start  uint64        // its start time, against pid reuse
	sock   *os.File      // the broker's end of its standard input
	exited chan struct{} // closed once it has exited and been reaped
	err    error         // why it could not be started
	ready  chan struct{} // closed once started (or failed)
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
	// Called on every scheduling pass: with no task waiting (npurun alone)
	// it must cost nothing.
	if s.warm >= maxWarm || len(s.queuedTasks) == 0 {
		return
	}
	for _, q := range []*Queue{s.q, s.cpuq} {
		seen := map[string]bool{}
		for _, w := range q.Waiters() {
			if w.task == nil || seen[w.Pool] {
				continue
			}
			seen[w.Pool] = true
			if t := w.task; t.sup == nil && s.warm < maxWarm {
				s.warm++
				t.sup = s.spawnLocked(t)
			}
		}
	}
}

// spawnLocked starts t's supervisor in the background and returns it; its
// ready channel says when it exists.
func (s *Server) spawnLocked(t *task) *supervisor {
	sup := &supervisor{ready: make(chan struct{}), exited: make(chan struct{})}
	spec := s.specLocked(t)
	acct := t.acct
	go func() {
		defer close(sup.ready)
		sup.err = s.startSupervisor(t, sup, spec, acct)
		if sup.err != nil {
			close(sup.exited)
		}
	}()
	return sup
}

// startSupervisor starts `npubroker supervise ID` as the submitter and
// gives it its Spec.
func (s *Server) startSupervisor(t *task, sup *supervisor, spec *client.Spec, acct *account) error {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("start supervisor: %w", err)
	}
	child := os.NewFile(uintptr(pair[1]), "supervisor")
	defer child.Close()
	sup.sock = os.NewFile(uintptr(pair[0]), "supervisor")
	cmd := exec.Command(s.self, "supervise", strconv.FormatUint(t.ID, 10))
	cmd.Args[0] = "npubroker"
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdin = child
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if !s.unprivileged {
		if acct == nil || !acct.known {
			acct = s.users.lookup(t.UID)
		}
		if !acct.known {
			sup.sock.Close()
			return fmt.Errorf("uid %d is not in the user database now: its groups are unknown", t.UID)
		}
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: t.UID, Gid: acct.gid, Groups: acct.gids}
	}
	if err := cmd.Start(); err != nil {
		sup.sock.Close()
		return fmt.Errorf("start supervisor: %w", err)
	}
	sup.pid = cmd.Process.Pid
	sup.start = procStart(s.proc, sup.pid)
	go func() {
		cmd.Wait()
		close(sup.exited)
		s.supervisorGone(t, sup.pid)
	}()
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
			sup.sock.Close()
		}
	}()
}

// launch starts a granted task: its supervisor (warm, or started now), the
// start record with the supervisor's pid made durable, then the go-ahead
// with the lock descriptors. The broker's copies of the descriptors are
// closed at the end: by then the supervisor has them, or nobody will.
func (s *Server) launch(t *task, fds []int) {
	defer func() {
		for _, fd := range fds {
			closeFD(fd)
		}
	}()
	s.mu.Lock()
	sup := t.sup
	if sup != nil {
		t.sup = nil
		s.warm--
	}
	for try := 0; ; try++ {
		if sup == nil {
			sup = s.spawnLocked(t)
		}
		s.mu.Unlock()
		<-sup.ready
		s.mu.Lock()
		if sup.err == nil && !sup.gone() {
			break
		}
		if try > 0 || sup.err != nil {
			s.mu.Unlock()
			err := sup.err
			if err == nil {
				err = fmt.Errorf("its supervisor exited before the start")
			}
			s.log.Printf("task %d: %v", t.ID, err)
			s.endTask(t, client.StateFailed, nil, "not started: "+err.Error())
			return
		}
		sup.sock.Close() // a warm supervisor that died while waiting: start another
		sup = nil
	}
	t.PID, t.PIDStart, t.starting = sup.pid, sup.start, true
	rec := &record{Op: "start", ID: t.ID, Time: t.Started, Devices: t.Devices, Slot: t.Slot, PID: sup.pid, PIDStart: sup.start}
	goAhead := s.goAheadLocked(t)
	s.mu.Unlock()

	err := s.spool.Append(rec)
	if err == nil {
		var b []byte
		if b, err = json.Marshal(goAhead); err == nil {
			err = client.SendMsg(int(sup.sock.Fd()), b, fds, 0)
		}
	}
	sup.sock.Close()

	s.mu.Lock()
	t.starting = false
	cancel := t.cancel
	s.mu.Unlock()
	select {
	case <-sup.exited:
		// Gone before or while starting: supervisorGone left it to us, so
		// that its end is journaled after its start.
		s.supervisorGone(t, sup.pid)
		return
	default:
	}
	if err != nil {
		s.log.Printf("task %d: %v", t.ID, err)
	}
	s.enforceLimit(t, sup.pid)
	if cancel {
		syscall.Kill(sup.pid, syscall.SIGTERM) // cancelled while it was being started
	}
}

// specLocked is what t's supervisor is told when it starts; the devices
// and their variables come with the go-ahead.
func (s *Server) specLocked(t *task) *client.Spec {
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
		ID: t.ID, Argv: t.Argv, Cwd: t.Sub.Cwd, Env: env, Log: t.Log,
		TimeSec: t.TimeSec, GraceSec: int64(s.cfg.Tasks.KillGrace / time.Second),
		Idle: t.Sub.NoDevice && s.cfg.Tasks.IdlePriority, Socket: s.socket,
	}
}

// goAheadLocked is the go-ahead for a granted task: its devices and their
// variables (the descriptors travel beside it).
func (s *Server) goAheadLocked(t *task) *client.Spec {
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

// supervisorGone is called when a task's supervisor has exited. It has
// reported the end before exiting, unless it was killed: then the task is
// lost, and what is left of it in the supervisor's session is killed, so
// that its lease, time limit and slot do not outlive the supervisor that
// kept them. A supervisor that exits while its task is being started is
// launch's to handle.
func (s *Server) supervisorGone(t *task, pid int) {
	s.mu.Lock()
	gone := t.State == client.StateRunning && t.PID == pid && !t.starting
	overran := t.overran
	s.mu.Unlock()
	if !gone {
		return
	}
	killSession(s.proc, pid, t.UID)
	reason := "its supervisor ended without reporting; exit status unknown"
	if overran {
		reason = fmt.Sprintf("killed by the broker: time limit %s overrun", time.Duration(t.TimeSec)*time.Second)
	}
	s.endTask(t, client.StateLost, nil, reason)
}

// overrunLimit is how long past its time limit and grace a task may run
// before the broker, not trusting the submitter's supervisor, kills it.
const overrunLimit = 30 * time.Second

// enforceLimit arms the broker's own backstop for t's time limit.
func (s *Server) enforceLimit(t *task, pid int) {
	if t.TimeSec <= 0 {
		return
	}
	deadline := time.UnixMilli(t.Started).Add(time.Duration(t.TimeSec)*time.Second + s.cfg.Tasks.KillGrace + overrunLimit)
	time.AfterFunc(time.Until(deadline), func() {
		s.mu.Lock()
		running := t.State == client.StateRunning && t.PID == pid
		if running {
			t.overran = true
		}
		s.mu.Unlock()
		if running {
			s.log.Printf("task %d overran its time limit; killing its session", t.ID)
			killSession(s.proc, pid, t.UID)
		}
	})
}
