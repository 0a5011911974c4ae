package local

import (
	"errors"
	"fmt"
	"io/fs"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/tasks"
	"github.com/npurun/npurun/wire"
)

// MaxNotices bounds the notify-only supervisors running at once, each
// holding a pidfd while it runs (the broker's descriptor reserve counts
// them); a notice beyond it is not sent (the log says so).
const MaxNotices = 8

// Notice readies a notify-only supervisor for running task t (the
// package's doc): the function returned starts it, unlocked, as t's
// submitter, in t's control group where t has one, and gives it spec,
// whose Notice says what to tell; nothing else is sent to it. Its exit is
// seen as any supervisor's (execSupervisor), and counted off.
func (l *local) Notice(t *tasks.Task, spec *wire.Spec) func() {
	lt := l.of(t)
	if l.supBin == nil || lt.ended || (t.Boot != "" && t.Boot != l.boot) {
		return nil
	}
	if l.notices >= MaxNotices {
		l.log.Printf("task %d: its notify command is not told %q: %d notices run already", t.ID, spec.Notice, MaxNotices)
		return nil
	}
	l.notices++
	id, uid, acct, inGroup := t.ID, t.UID, t.Account(), lt.cgroup && l.cg != nil
	return func() {
		sup := &supervisor{exited: make(chan struct{}), notice: true}
		err := l.startNotice(sup, id, uid, acct, inGroup, spec)
		if sup.pid == 0 {
			l.host.Lock()
			l.notices-- // never started: its exit will not count it off
			l.host.Unlock()
		}
		if err != nil {
			l.log.Printf("task %d: notify command (%s): %v", id, spec.Notice, err)
		}
	}
}

// startNotice starts sup, a notify-only supervisor for task id, and gives
// it spec; its socket is closed after.
func (l *local) startNotice(sup *supervisor, id uint64, uid uint32, acct *tasks.Account, inGroup bool, spec *wire.Spec) error {
	if err := l.credentials(sup, uid, acct); err != nil {
		return err
	}
	cgfd := -1
	if inGroup {
		// The task's group, as it is: one already removed means the task
		// ended meanwhile, and is not made again.
		fd, err := unix.Open(l.cg.dir(id), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("start supervisor: %w: %w", tasks.ErrCgroup, err)
		}
		defer unix.Close(fd)
		cgfd = fd
	}
	if err := l.execSupervisor(sup, id, cgfd); err != nil {
		return err
	}
	if err := sendSpec(sup, spec); err != nil {
		return err
	}
	return sup.sock.Close()
}
