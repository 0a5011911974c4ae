package broker

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/lease"
	"github.com/npurun/npurun/broker/procscan"
	"github.com/npurun/npurun/broker/status"
	"github.com/npurun/npurun/broker/tasks"
	"github.com/npurun/npurun/wire"
)

// The protocol handlers of the task operations (task-submit's and the
// supervisors'): each reads the request and the peer's credentials, calls
// the task room (package tasks) holding no lock, and answers. What a task
// is, its line, its start and its end are the room's.

// taskOp serves the task operations.
func (s *Server) taskOp(c *conn, req *wire.Request) bool {
	if err := s.tasks.Unavailable((req.Op == wire.OpSubmit || req.Op == wire.OpRequeue) && req.Task != nil && req.Task.Token != ""); err != nil {
		s.answer(c, nil, err)
		return true
	}
	switch req.Op {
	case wire.OpSubmit:
		sub, err := s.tasks.Submit(tasks.Submitter{UID: c.uid, Account: c.acct.forTasks()}, req.Task, c.peerGone)
		if errors.Is(err, tasks.ErrLeft) {
			return false
		}
		s.answer(c, submittedReply(sub), err)
		return !errors.Is(err, tasks.ErrBadRequest) && !errors.Is(err, lease.ErrBadRequest)
	case wire.OpTaskDone:
		err := s.tasks.Done(c.uid, c.pid, req.ID, req.Status)
		s.answer(c, &wire.Reply{Type: wire.TypeOK}, err)
		return !errors.Is(err, tasks.ErrDenied)
	case wire.OpNotStarted:
		err := s.tasks.NotStarted(c.uid, c.pid, req.ID)
		s.answer(c, &wire.Reply{Type: wire.TypeOK}, err)
		return !errors.Is(err, tasks.ErrDenied)
	case wire.OpList:
		return s.list(c, req.All, req.After, tasks.Filter{Ended: req.Ended, Since: req.Since})
	case wire.OpHistory:
		return s.history(c, req.All, req.Since)
	case wire.OpShow:
		ti, err := s.tasks.Show(c.uid, req.ID)
		if err == nil && ti.State == wire.StateRunning {
			ti.Backfill = s.status.TaskBackfill(ti.ID)
		}
		s.answer(c, tasksReply(ti), err)
	case wire.OpWait:
		ti, err := s.tasks.Wait(c, c.uid, req.ID)
		switch {
		case err != nil:
			s.answer(c, nil, err)
		case ti != nil:
			s.answer(c, tasksReply(*ti), nil)
		}
		return !errors.Is(err, tasks.ErrTooMany)
	case wire.OpCancel:
		ti, err := s.tasks.Cancel(c.uid, c.acct.name, req.ID)
		s.answer(c, tasksReply(ti), err)
	case wire.OpHold, wire.OpRelease:
		ti, err := s.tasks.Hold(c.uid, req.ID, req.Op == wire.OpHold)
		s.answer(c, tasksReply(ti), err)
	case wire.OpRequeue:
		sub, err := s.tasks.Requeue(tasks.Submitter{UID: c.uid, Account: c.acct.forTasks()}, req.ID, req.Task, c.peerGone)
		if errors.Is(err, tasks.ErrLeft) {
			return false
		}
		s.answer(c, submittedReply(sub), err)
		return !errors.Is(err, tasks.ErrBadRequest) && !errors.Is(err, lease.ErrBadRequest)
	}
	return true
}

// answer sends rep, or the refusal err.
func (s *Server) answer(c *conn, rep *wire.Reply, err error) {
	if err != nil {
		rep = refusalReply(err)
	}
	s.mu.Lock()
	c.sendLocked(rep)
	s.mu.Unlock()
}

func tasksReply(ti wire.TaskInfo) *wire.Reply {
	return &wire.Reply{Type: wire.TypeTasks, Tasks: []wire.TaskInfo{ti}}
}

func submittedReply(sub *tasks.Submitted) *wire.Reply {
	if sub == nil {
		return nil
	}
	return &wire.Reply{Type: wire.TypeSubmitted, ID: sub.ID, State: sub.State, Existing: sub.Existing,
		Position: sub.Position, Pool: sub.Pool, Reason: sub.Reason}
}

// TaskEnded tells a connection waiting for a task (task-submit wait) of
// its end.
func (c *conn) TaskEnded(ti wire.TaskInfo) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.sendLocked(tasksReply(ti)) != nil {
		c.c.Close() // the client sees the end of the connection, not silence
	}
}

// list serves one page of a listing: the asker's tasks (everyone's with
// all) after id after, oldest first. The task room copies the page under
// its lock; the reply is put together and encoded here, and sent from the
// connection's goroutine. A page is built only once the client has read
// the last one, and what one user's connections leave unread together is
// capped (readyForListing).
func (s *Server) list(c *conn, all bool, after uint64, f tasks.Filter) bool {
	if err := c.readyForListing(); err != nil {
		return false
	}
	buf := listBufs.Get().(*listBuf)
	defer buf.put()
	var next uint64
	var more bool
	var err error
	buf.page, next, more, err = s.tasks.Page(c.uid, all, after, f, buf.page[:0])
	if err != nil {
		s.answer(c, nil, err)
		return true
	}
	return c.sendPage(buf, c.uid, s.policy().Status.ShowsCommand, next, more) == nil
}

// listBuf is what serving a page of a listing takes: the page's tasks
// copied, and its message. A listing of thousands of tasks takes dozens
// of pages; made anew for each, they were most of what the broker
// allocated for it, and the collections this set off in a broker with
// thousands of tasks cost more than the listing itself.
type listBuf struct {
	page []tasks.Listed
	msg  []byte
}

var listBufs = sync.Pool{New: func() any { return &listBuf{msg: make([]byte, 0, wire.MaxMessage)} }}

// put gives b back to listBufs, holding on to none of the tasks it copied.
func (b *listBuf) put() {
	clear(b.page)
	b.page = b.page[:0]
	b.msg = b.msg[:0]
	listBufs.Put(b)
}

// maxHistory bounds the tasks of one history reply: each takes a few
// hundred bytes at most, and they fit in one message.
const maxHistory = 160

// history serves the tasks that the accounting log (the status room's)
// shows ended from since on, of the asker (everyone's with all), and that
// the task room keeps no more (list, with Ended, lists those it keeps):
// their ids, users, pools, devices, starts and ends; the newest
// maxHistory of them, More set when there were others.
func (s *Server) history(c *conn, all bool, since int64) bool {
	if since < 0 || since > time.Now().UnixMilli() {
		s.answer(c, errReply(wire.CodeBadRequest, "history needs a start time in the past", ""), nil)
		return false
	}
	tls, more, err := s.status.TaskHistory(c.uid, all, time.UnixMilli(since), maxHistory)
	if err != nil {
		s.answer(c, errReply("usage-log", err.Error(), ""), nil)
		return true
	}
	rep := &wire.Reply{Type: wire.TypeTasks, More: more, Tasks: []wire.TaskInfo{}}
	for _, tl := range tls {
		if s.tasks.Keeps(tl.Task, tl.Started) {
			continue
		}
		rep.Tasks = append(rep.Tasks, wire.TaskInfo{ID: tl.Task, User: tl.User, UID: tl.UID, State: wire.StateEnded,
			Pool: tl.Pool, Devices: tl.Devices, Started: tl.Started, Ended: tl.Ended, Source: wire.SourceAccounting})
	}
	s.answer(c, rep, nil)
	return true
}

// sendPage encodes a page of a listing (buf's) and sends it as one "tasks" reply,
// as many of its tasks as fit; more and next say where the listing goes
// on. Each task is shown as asker may see it (tasks.Listing, shows saying
// whose commands). Nobody's environment is listed.
func (c *conn) sendPage(buf *listBuf, asker uint32, shows func(asker, owner uint32) bool, next uint64, more bool) error {
	page := buf.page
	msg := append(buf.msg[:0], `{"v":`+strconv.Itoa(wire.Version)+`,"type":"`+wire.TypeTasks+`","tasks":[`...)
	const tail = `],"more":true,"next":18446744073709551615}`
	for i := range page {
		ti := tasks.Listing(&page[i].Task, asker, shows, page[i].Pos)
		if st := page[i].Start; !st.IsZero() {
			ti.Start = st.UnixMilli()
		}
		ti.Env = nil
		mark := len(msg)
		if i > 0 {
			msg = append(msg, ',')
		}
		msg = wire.AppendTaskInfo(msg, &ti) // as encoding/json writes it, faster
		if i > 0 && len(msg)+len(tail) > wire.MaxMessage {
			msg = msg[:mark]
			next, more = page[i-1].Task.ID, true
			break
		}
	}
	msg = append(msg, ']')
	if more {
		msg = append(msg, `,"more":true,"next":`...)
		msg = strconv.AppendUint(msg, next, 10)
	}
	msg = append(msg, '}')
	buf.msg = msg
	return c.sendListing(msg)
}

// peerGone tells whether c's client has closed its end: what it sent may
// still be read, but nobody will read the answer.
func (c *conn) peerGone() bool {
	gone := false
	c.rc.Control(func(fd uintptr) {
		// POLLHUP: closed, not only shut down for writing.
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, _ := unix.Poll(pfd, 0); n > 0 {
			gone = pfd[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0
		}
	})
	return gone
}

// forTasks is a as the task room sees an account.
func (a *account) forTasks() *tasks.Account {
	return &tasks.Account{Name: a.name, Groups: a.groups, GID: a.gid, GIDs: a.gids, Home: a.home, Shell: a.shell,
		Known: a.known, Err: a.unanswered(), ShellErr: a.shellErr}
}

// taskAccounts is the broker's account cache as the task room looks
// accounts up.
type taskAccounts struct{ users *accounts }

func (t taskAccounts) Lookup(uid uint32) *tasks.Account { return t.users.lookup(uid).forTasks() }

// taskRoomOwner is the broker as the task room's owner: it serves the
// line when the room asks, holding no lock of the room's.
type taskRoomOwner Server

func (o *taskRoomOwner) Serve() {
	s := (*Server)(o)
	s.mu.Lock()
	s.scheduleLocked()
	s.mu.Unlock()
}

// claimFatal marks a state directory that another broker holds as fatal
// to the task room's Open (tasks.ErrFatal), its message as it is.
type claimFatal struct{ error }

func (e claimFatal) Unwrap() error        { return e.error }
func (e claimFatal) Is(target error) bool { return target == tasks.ErrFatal }

// claimTasks is the task room's claim of the state directory.
func (s *Server) claimTasks(dir string) error {
	err := s.claimState(dir)
	if errors.Is(err, ErrClaimed) {
		return claimFatal{err}
	}
	return err
}

// describeHolder writes a process holding a lease for the log, as status
// does: its user and command line.
func (s *Server) describeHolder(pi *procscan.Proc) string {
	return fmt.Sprintf("%s: %s", s.status.Name(pi.UID), status.CommandLine(pi))
}
