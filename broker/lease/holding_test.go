package lease

import (
	"testing"

	"github.com/npurun/npurun/policy"
)

// TestOfTask: the devices a task's lease holds are found by the task's id,
// each with its lease's lock file, and held (Holds) until the lease's
// lock goes; another holder's lease is not the task's.
func TestOfTask(t *testing.T) {
	o, _ := newTable(t, 3, nil)
	const id = 7
	w, err := o.tbl.Admit(Request{Holder: Holder{Kind: Task, UID: 1000, User: "u1000", Task: id}, N: 2})
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan grant, 1)
	w.Ref = ch
	o.mu.Lock()
	o.tbl.Add(w)
	o.serveLocked()
	o.mu.Unlock()
	task := got(t, ch, "the task's lease")
	inline := got(t, askCh(t, o, 2000), "an npurun's lease")

	held := o.tbl.OfTask(id)
	if len(held) != 2 {
		t.Fatalf("task %d holds %d devices, want 2: %+v", id, len(held), held)
	}
	for i, h := range held {
		if h.Lease != task.l || h.Device != task.l.Devices[i] || h.File != fdFile(t, task.fds[i]) {
			t.Errorf("holding %d: %+v; want npu%d of lease %d on the file of its descriptor", i, h, task.l.Devices[i], task.l.ID)
		}
		if !o.tbl.Holds(h.Lease, h.Device) {
			t.Errorf("npu%d: not held by the task's lease while its descriptor is open", h.Device)
		}
	}
	if o.tbl.Holds(task.l, inline.l.Devices[0]) {
		t.Errorf("npu%d, the npurun's, held by the task's lease", inline.l.Devices[0])
	}
	if got := o.tbl.OfTask(id + 1); len(got) != 0 {
		t.Errorf("task %d, which holds nothing, holds %+v", id+1, got)
	}
	// The same devices, found by the lease (HeldBy: a Slurm job's end).
	if by := o.tbl.HeldBy(task.l); len(by) != len(held) || by[0] != held[0] || by[1] != held[1] {
		t.Errorf("HeldBy(the task's lease) = %+v; want %+v", by, held)
	}
	if by := o.tbl.HeldBy(inline.l); len(by) != 1 || by[0].Lease != inline.l || by[0].Device != inline.l.Devices[0] {
		t.Errorf("HeldBy(the npurun's lease) = %+v; want its npu%d alone", by, inline.l.Devices[0])
	}

	task.release()
	awaitEvent(t, o, "released")
	awaitEvent(t, o, "released")
	if got := o.tbl.OfTask(id); len(got) != 0 {
		t.Errorf("after its lease's end, task %d holds %+v", id, got)
	}
	if by := o.tbl.HeldBy(task.l); len(by) != 0 {
		t.Errorf("after its end, the task's lease holds %+v", by)
	}
	for _, h := range held {
		if o.tbl.Holds(h.Lease, h.Device) {
			t.Errorf("npu%d: held by the task's lease after its end", h.Device)
		}
	}
	// Its devices leased again, on fresh lock files: still not the task's.
	next := got(t, askCh2(t, o, 3000), "the next lease")
	for _, h := range held {
		if o.tbl.Holds(h.Lease, h.Device) {
			t.Errorf("npu%d: held by the task's lease once leased again", h.Device)
		}
	}
	next.release()
	inline.release()
}

// askCh2 asks for two devices for uid and returns the channel of its
// grant.
func askCh2(t *testing.T, o *owner, uid uint32) chan grant {
	t.Helper()
	_, ch := o.ask(t, uid, 2, "", nil, policy.Limit{})
	return ch
}

// askCh asks for one device for uid and returns the channel of its grant.
func askCh(t *testing.T, o *owner, uid uint32) chan grant {
	t.Helper()
	_, ch := o.ask(t, uid, 1, "", nil, policy.Limit{})
	return ch
}
