package local

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/tasks"
	"github.com/npurun/npurun/wire"
)

// Idle supervisors. Starting a supervisor is starting a process, the
// largest part of a task's start when the line is empty. So once a user's
// task has started, the broker starts one more supervisor for that user,
// in no task yet (`npurun-supervise` with no id), and keeps it idle for
// idleFor; the user's next task, submitted to an empty line or granted
// from it, takes it (spawnLocked) instead of starting one: a sweep's tasks
// find one ready. At most maxIdle are kept, all users together, and one
// per user.
//
// An idle supervisor runs as its user with the groups that user had when
// it was started; a task is given it only if its own account (looked up
// when it was submitted) has the same, else it is let go and one is
// started. Where tasks have control groups, it is born in a group of its
// own, idle-N (its user may ptrace it, and make it start processes: they
// stay in that group, out of the broker's), and moved into its task's
// group (cgroup.procs) before it gets its Spec, so that nothing of the
// task runs outside the group; then whatever else is in idle-N is killed
// and the group removed, as when it is let go. It is moved only while it
// has not exited, so that its pid cannot name another process. Until it
// has a Spec it runs nothing: when it is let go (expired, or of other
// groups than its task's), or the broker exits, its socket closes and it
// exits. Groups idle-N left by a broker killed before it could remove
// them are removed at the next start.

// idleFor is how long an idle supervisor is kept for its user.
const idleFor = 2 * time.Minute

// maxIdle bounds the idle supervisors, all users together.
const maxIdle = 8

// idlePool is the idle supervisors, by uid.
type idlePool struct {
	m      map[uint32]*supervisor
	closed bool   // the broker stops: no more
	next   uint64 // the last idle-N group made
}

// errIdleGone is an idle supervisor that exited before it got its task.
var errIdleGone = errors.New("the idle supervisor exited")

// keepIdleLocked starts an idle supervisor for the user of sup, a
// supervisor that has just started its task, with its credentials, unless
// that user has one or maxIdle are kept already.
func (l *local) keepIdleLocked(sup *supervisor) {
	if l.idle.m[sup.uid] != nil || len(l.idle.m) >= maxIdle || l.host.Paused() || l.idle.closed {
		return
	}
	if l.idle.m == nil {
		l.idle.m = map[uint32]*supervisor{}
	}
	idle := &supervisor{uid: sup.uid, gid: sup.gid, gids: sup.gids, exited: make(chan struct{}), started: make(chan struct{})}
	if l.cg != nil {
		if l.idle.next == 0 {
			// Unique across restarts: a group a killed broker left
			// may still be dying.
			l.idle.next = uint64(time.Now().UnixNano())
		}
		l.idle.next++
		idle.group = l.idle.next
	}
	l.idle.m[idle.uid] = idle
	idle.expire = time.AfterFunc(idleFor, func() {
		l.host.Lock()
		defer l.host.Unlock()
		if l.idle.m[idle.uid] == idle {
			delete(l.idle.m, idle.uid)
			letGo(idle)
		}
	})
	go func() {
		defer close(idle.started)
		cgfd := -1
		if idle.group != 0 {
			fd, err := openGroup(l.cg.idleDir(idle.group))
			if err == nil {
				defer unix.Close(fd)
				cgfd = fd
			}
			idle.err = err
		}
		if idle.err == nil {
			idle.err = l.execSupervisor(idle, 0, cgfd)
		}
		if idle.err != nil {
			close(idle.exited)
			l.host.Lock()
			l.idleGoneLocked(idle)
			l.reapIdleLocked(idle)
			l.host.Unlock()
		}
	}()
}

// reapIdleLocked kills whatever is left in an idle supervisor's own group
// and removes the group, in the background while processes are still
// dying in it.
func (l *local) reapIdleLocked(sup *supervisor) {
	if sup.group == 0 || l.cg == nil {
		return
	}
	d := l.cg.idleDir(sup.group)
	sup.group = 0
	killGroup(d) // at once: nothing of it runs on
	go l.reapGroup(d, nil)
}

// takeIdleLocked takes the idle supervisor of t's user for t, if there is
// one of the same account; one of another is let go.
func (l *local) takeIdleLocked(t *tasks.Task) *supervisor {
	sup := l.idle.m[t.UID]
	if sup == nil {
		return nil
	}
	delete(l.idle.m, t.UID)
	sup.expire.Stop()
	if !l.unpriv {
		a := t.Account()
		if a == nil || !a.Known || a.GID != sup.gid || !slices.Equal(a.GIDs, sup.gids) {
			letGo(sup) // the account changed: its groups would be wrong
			return nil
		}
	}
	if sup.gone() {
		return nil
	}
	return sup
}

// idleGoneLocked forgets an idle supervisor that exited (its user may kill
// it) or could not be started.
func (l *local) idleGoneLocked(sup *supervisor) {
	if l.idle.m[sup.uid] == sup {
		delete(l.idle.m, sup.uid)
		sup.expire.Stop()
	}
}

// letGo closes an idle supervisor's socket, once it is started: it exits
// having run nothing.
func letGo(sup *supervisor) {
	go func() {
		<-sup.started
		if sup.sock != nil {
			sup.sock.Close()
		}
	}()
}

// bindSupervisor gives an idle supervisor t: it is moved into t's control
// group, then given t's Spec. On an error its socket is closed.
func (l *local) bindSupervisor(t *tasks.Task, sup *supervisor, spec *wire.Spec) error {
	<-sup.started
	if sup.err != nil {
		return sup.err
	}
	if l.cg != nil {
		sup.mu.Lock()
		dead := sup.dead
		var err error
		if !dead {
			err = l.cg.enter(t.ID, sup.pid)
		}
		sup.mu.Unlock()
		// What else is in its own group (started by its user through it)
		// is not the task's: it ends here.
		l.host.Lock()
		l.reapIdleLocked(sup)
		l.host.Unlock()
		switch {
		case dead:
			sup.sock.Close()
			return errIdleGone
		case err != nil:
			sup.sock.Close()
			return fmt.Errorf("start supervisor: %w: %w", tasks.ErrCgroup, err)
		}
	}
	return sendSpec(sup, spec)
}

// enter moves process pid into task id's group, making the group if it
// does not exist yet.
func (cg *cgroups) enter(id uint64, pid int) error {
	fd, err := cg.open(id)
	if err != nil {
		return err
	}
	closeFD(fd)
	p := filepath.Join(cg.dir(id), "cgroup.procs")
	if err := writeCgroupFile(p, strconv.Itoa(pid)); err != nil {
		return fmt.Errorf("move the supervisor into %s: %w", cg.dir(id), err)
	}
	return nil
}

// letIdleGo drops the warm supervisors (dropWarm) and lets every idle
// supervisor go, waits up to d for them to exit,
// then kills what is left in their groups and removes the groups, waiting
// up to d more for that: the broker is going, and a removal left to a
// goroutine (reapGroup) would die with it, leaving the groups behind.
func (l *local) letIdleGo(d time.Duration) {
	l.dropWarm(d)
	l.host.Lock()
	l.idle.closed = true
	var all []*supervisor
	var groups []string
	for uid, sup := range l.idle.m {
		delete(l.idle.m, uid)
		sup.expire.Stop()
		letGo(sup)
		all = append(all, sup)
		if sup.group != 0 && l.cg != nil {
			groups = append(groups, l.cg.idleDir(sup.group))
		}
	}
	l.host.Unlock()
	deadline := time.After(d)
wait:
	for _, sup := range all {
		select {
		case <-sup.exited:
		case <-deadline:
			break wait
		}
	}
	for _, g := range groups {
		killGroup(g)
	}
	until := time.Now().Add(d)
	for _, g := range groups {
		// What an exit seen meanwhile started removing is removed here
		// all the same: a group already gone is no error.
		for {
			err := removeGroup(g)
			if err == nil {
				break
			}
			left := time.Until(until)
			if err != unix.EBUSY || left <= 0 {
				l.log.Printf("remove control group %s: %v; the next broker start removes it", g, err)
				break
			}
			if !waitGroupEmpty(g, left) {
				time.Sleep(min(10*time.Millisecond, left))
			}
		}
	}
}

// reapLeftIdle removes the idle supervisors' groups a broker before this
// one left (killed before it could).
func (l *local) reapLeftIdle() {
	for _, n := range l.cg.idleGroups() {
		d := l.cg.idleDir(n)
		killGroup(d)
		go l.reapGroup(d, nil)
	}
}
