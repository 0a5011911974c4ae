package procscan

import (
	"errors"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// ErrNotTheirs is SignalAs's refusal of a process whose effective uid is
// no longer the one the caller judged it by.
var ErrNotTheirs = errors.New("the process runs as another user now")

// Signal sends sig to process pid if it is still the process that started
// at start, through a pidfd so that a pid reused in between is never hit.
func (s *Scanner) Signal(pid int, start uint64, sig unix.Signal) error {
	fd, err := s.pidfd(pid, start)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.PidfdSendSignal(fd, sig, nil, 0)
}

// SignalAs sends sig to process pid as user uid would: only if it is
// still the process that started at start, its effective uid is still
// uid (ErrNotTheirs if not: it became another user's, through a
// set-user-ID program say), and uid itself may signal it. That last the
// kernel decides as the signal is sent, on a thread of the caller's whose
// real and effective uid are uid for the moment (kill(2): the sender's
// real or effective uid is the target's real or saved uid), so that a
// process that became another user's just before the signal is not hit
// unless uid could hit it too.
func (s *Scanner) SignalAs(pid int, start uint64, uid uint32, sig unix.Signal) error {
	fd, err := s.pidfd(pid, start)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	p, err := s.fs.Proc(pid)
	if err != nil {
		return err
	}
	st, err := p.NewStatus()
	if err != nil {
		return err
	}
	if uint32(st.UIDs[1]) != uid {
		return fmt.Errorf("%w (uid %d, not %d)", ErrNotTheirs, st.UIDs[1], uid)
	}
	if uid == 0 {
		return unix.PidfdSendSignal(fd, sig, nil, 0)
	}
	return sendAs(fd, uid, sig)
}

// pidfd opens a pidfd of pid, and checks that pid is still the process
// that started at start.
func (s *Scanner) pidfd(pid int, start uint64) (int, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, err
	}
	if s.Start(pid) != start {
		unix.Close(fd)
		return -1, unix.ESRCH
	}
	return fd, nil
}

// sendAs sends sig through the pidfd fd from a thread of its own whose
// real and effective uid are uid (its saved uid stays root's, to come
// back by). The thread is locked to its goroutine and never unlocked
// unless root's uids are back: a goroutine that ends locked takes its
// thread with it. The raw system call changes the calling thread alone
// (the C library's and Go's setresuid change every thread).
func sendAs(fd int, uid uint32, sig unix.Signal) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if _, _, errno := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), ^uintptr(0)); errno != 0 {
			runtime.UnlockOSThread() // nothing changed
			done <- fmt.Errorf("take uid %d: %w", uid, errno)
			return
		}
		err := unix.PidfdSendSignal(fd, sig, nil, 0)
		unix.RawSyscall(unix.SYS_SETRESUID, 0, 0, ^uintptr(0))
		if r, e, sv := unix.Getresuid(); r == 0 && e == 0 && sv == 0 {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}
