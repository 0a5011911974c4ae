package lease

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/npurun/npurun/broker/refusal"
	"github.com/npurun/npurun/internal/fileid"
	"github.com/npurun/npurun/internal/quantity"
)

// Shares of a device. A device that may be shared (Config.Capacity names
// it) holds either one whole lease, on its lock file npuN.lock as any
// device, or shares: leases that each declared some of its memory
// (Request.Mem, in MiB), packed while their declarations, and what
// processes outside any lease were seen to use (SetExternal), fit its
// capacity (the capacity less the margin: Config.Capacity's values).
//
// Every share is a lease of its own, on a lock file of its own made fresh
// for it, npuN.sK.lock (K: the lowest slot free on the device), and
// removed when the share ends: a descriptor kept from an earlier share
// reaches an unlinked file, never the one a later share holds. The
// device's own lock file stays with the table, locked, while it holds
// shares, so a whole lease begins only once the last share has ended (and
// its gate has closed the device to the users of the ended shares). Each
// share file holds its declaration as text, so a broker's restart finds
// the shares held (a lock it cannot take) and what they declared.
//
// Plan places a share by best fit: on the candidate device with the
// least room left that fits it, so large free spaces stay whole. A waiter
// that cannot be served now closes the devices it would take first to
// new shares (a whole-device waiter: those with shares, least declared
// first, after the free ones it reserves as always; the first share in
// line that waits, once SharePatience requests behind it have started:
// the one with most room), so a stream of small shares never starves it.

// share is one share of a device: a lease's declaration of Mem MiB, on a
// lock file of its own.
type share struct {
	lease *Lease    // nil while it is being handed over
	h     *Handover // the handover it is in, until Commit or Return
	uid   uint32
	slot  int
	mem   int64
	path  string
	file  fileid.ID
	fd    int // the locked descriptor, the handover's until delivered; -1 after
	spare int // a second open, for its watcher; -1 once closed
	ended atomic.Bool
	poke  chan struct{} // Abandon's: its holders are gone (abandon.go)

	// waiting is spare as its watcher waits on it, from Commit (or Open)
	// until the watcher has seen its lock go (Ending); under the table's
	// lock.
	waiting *ending
}

// SharePath is the lock file of share slot k of device id in dir.
func SharePath(dir string, id, k int) string {
	return filepath.Join(dir, "npu"+strconv.Itoa(id)+".s"+strconv.Itoa(k)+".lock")
}

// parseSharePath reads a share lock file's name: its device and slot.
func parseSharePath(name string) (id, slot int, ok bool) {
	rest, found := strings.CutPrefix(name, "npu")
	if !found {
		return 0, 0, false
	}
	rest, found = strings.CutSuffix(rest, ".lock")
	if !found {
		return 0, 0, false
	}
	a, b, found := strings.Cut(rest, ".s")
	if !found {
		return 0, 0, false
	}
	id, err1 := strconv.Atoi(a)
	slot, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil || id < 0 || slot < 0 || strconv.Itoa(id) != a || strconv.Itoa(slot) != b {
		return 0, 0, false
	}
	return id, slot, true
}

// MaxShares bounds the shares one device holds at once.
const MaxShares = 64

// declared is what d's shares declared, with what outside use takes.
func (d *device) declared() int64 {
	var sum int64
	for _, s := range d.shares {
		sum += s.mem
	}
	return sum
}

// shareRoom is what d has left for a new share, -1 if it can take none
// now: not shared, drained, leased whole or being handed over whole, out
// of service, closing after a share, or full of shares.
func (d *device) shareRoom() int64 {
	if d.capacity <= 0 || d.drain != nil || d.granting != nil || d.fd < 0 || d.closing > 0 || len(d.shares) >= MaxShares {
		return -1
	}
	return max(d.capacity-d.declared()-d.external, 0)
}

// freeSlot is the lowest share slot d does not use.
func (d *device) freeSlot() int {
	for k := 0; ; k++ {
		if !slices.ContainsFunc(d.shares, func(s *share) bool { return s.slot == k }) {
			return k
		}
	}
}

// sharers are the users of d's shares, each once.
func (d *device) sharers() []uint32 {
	var out []uint32
	for _, s := range d.shares {
		if !slices.Contains(out, s.uid) {
			out = append(out, s.uid)
		}
	}
	return out
}

// Shareable tells whether device id may hold shares, and its capacity
// for them (the configuration's, less its margin), in MiB.
func (t *Table) Shareable(id int) (int64, bool) {
	if id < 0 || id >= len(t.devs) || t.devs[id] == nil {
		return 0, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.devs[id].capacity, t.devs[id].capacity > 0
}

// Unknown are the devices the configuration shares whose memory is not
// known yet (Config.Unknown), for the owner to ask the vendor's tool
// again and tell SetCapacity.
func (t *Table) Unknown() []int {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []int
	for _, id := range t.ids {
		if t.devs[id].unknown != "" {
			out = append(out, id)
		}
	}
	return out
}

// SetCapacity takes up what the shares of device id, a device of
// Unknown, may declare together now that its memory is known, in MiB
// (its memory less the margin): it takes shares from now on, beside
// those it holds; 0: it is not shared (its memory is no more than the
// margin). The share requests in line that waited for it and that it
// turns out too small for, where the other devices cannot serve them
// either, are taken out of line and returned (as Admit would have refused
// them), for the owner to tell their holders. The owner serves the line
// after.
func (t *Table) SetCapacity(id int, capacity int64) []Refused {
	if id < 0 || id >= len(t.devs) || t.devs[id] == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.devs[id]
	if d.unknown == "" {
		return nil
	}
	d.unknown, d.capacity = "", max(capacity, 0)
	var refused []Refused
	for _, w := range slices.Clone(t.q.Waiters()) {
		if w.Mem == 0 || w.Mem <= d.capacity || !slices.Contains(w.Cand, id) {
			continue
		}
		left := 0
		for _, c := range w.Cand {
			if o := t.devs[c]; o.capacity >= w.Mem || o.unknown != "" {
				left++
			}
		}
		if left >= w.N && (!w.Exact || left == len(w.Cand)) {
			continue
		}
		t.removeLocked(w, false)
		why := refusal.New(ErrDenied, "", "%s asked of %s, which holds %s for shares at most", sizeOf(w.Mem), t.vendor.Format([]int{id}), sizeOf(d.capacity))
		if d.capacity == 0 {
			why = refusal.New(ErrDenied, "npurun without --mem asks for the whole device", "%s is not shared: its memory is no more than the margin kept free ([share] margin)", t.vendor.Format([]int{id}))
		}
		refused = append(refused, Refused{W: w, Why: why})
	}
	return refused
}

// unknownReasonLocked says why share request w waits for a device whose
// memory is not known yet, if it does: fewer of its candidates than it
// wants hold it for sure.
func (t *Table) unknownReasonLocked(w *Waiter) string {
	if w.Mem == 0 {
		return ""
	}
	known := 0
	var b strings.Builder
	for _, id := range w.Cand {
		d := t.devs[id]
		switch {
		case d.capacity >= w.Mem:
			known++
		case d.unknown != "":
			if b.Len() > 0 {
				b.WriteString("; ")
			}
			fmt.Fprintf(&b, "%s takes no share until its memory is known (%s); the broker asks again", t.vendor.Format([]int{id}), d.unknown)
		}
	}
	if known >= w.N {
		return ""
	}
	return b.String()
}

// SetExternal notes what processes outside any lease use on device id, in
// MiB (what the vendor's tool shows them using now, scan by scan): it
// counts against the room for shares. The owner's scan sets it; 0 clears
// it.
func (t *Table) SetExternal(id int, mib int64) {
	if id < 0 || id >= len(t.devs) || t.devs[id] == nil {
		return
	}
	t.mu.Lock()
	roomGrew := mib < t.devs[id].external
	t.devs[id].external = max(mib, 0)
	t.mu.Unlock()
	if roomGrew {
		t.owner.Freed()
	}
}

// makeShareFiles makes a fresh lock file for each share of handover h,
// holding no lock: its descriptors, locked, become h's.
func (t *Table) makeShareFiles(h *Handover) error {
	for i, s := range h.shares {
		f, err := prepareLockWith(s.path, []byte(strconv.FormatInt(s.mem, 10)+"\n"))
		if err == nil {
			if err = f.place(s.path); err != nil {
				f.discard()
			}
		}
		if err != nil {
			return fmt.Errorf("make the lock file of a share of npu %d: %w", s.h.Devices[i], err)
		}
		s.fd, s.spare, s.file = f.locked, f.spare, f.file
		h.fds[i], h.files[i] = f.locked, f.file
	}
	return nil
}

// dropShares undoes the shares of handover h not delivered: their files
// go, their room comes back. It takes the table's lock.
func (t *Table) dropShares(h *Handover) {
	for _, s := range h.shares {
		if s.fd >= 0 || s.spare >= 0 {
			unlinkIf(s.path, s.file)
		}
		closeFD(s.fd)
		closeFD(s.spare)
		s.fd, s.spare = -1, -1
	}
	t.mu.Lock()
	for i, id := range h.Devices {
		d := t.devs[id]
		d.shares = slices.DeleteFunc(d.shares, func(s *share) bool { return s == h.shares[i] })
	}
	t.mu.Unlock()
}

// unlinkIf removes path if it names file still.
func unlinkIf(path string, file fileid.ID) {
	var st unix.Stat_t
	if unix.Lstat(path, &st) == nil && st.Dev == file.Dev && st.Ino == file.Ino {
		unix.Unlink(path)
	}
}

// watchShare waits for share s of device d to be released (its holder's
// process tree gone), then ends it: its file goes, the owner is told, the
// gate closes the device to its user (unless another share of theirs is
// there), and its room is free.
func (t *Table) watchShare(d *device, s *share) {
	t.mu.Lock()
	e := s.waiting
	t.mu.Unlock()
	stale, err := t.waitRelease(s.spare, s.poke, func() bool { return true })
	releaseSeen(d.id)
	if err != nil {
		// Keep its room taken rather than risk packing over it.
		t.log.Printf("npu %d: wait for the release of share %d: %v; its room stays taken", d.id, s.slot, err)
		t.mu.Lock()
		s.waiting = nil // its descriptor stays the watcher's: Ending must not try it
		t.mu.Unlock()
		close(e.over)
		return
	}
	t.mu.Lock()
	t.seen(d, &s.waiting) // its descriptor closes from now on
	t.mu.Unlock()
	if stale != nil {
		t.outlive(d, s.lease, s.spare, stale)
		s.spare = -1
	}
	s.ended.Store(true)
	unlinkIf(s.path, s.file)
	closeFD(s.spare)
	now := time.Now()
	t.mu.Lock()
	l := s.lease
	d.shares = slices.DeleteFunc(d.shares, func(o *share) bool { return o == s })
	d.leases = slices.DeleteFunc(d.leases, func(o *Lease) bool { return o == l })
	d.closing++
	last := true
	for _, id := range l.Devices {
		if o := t.devs[id]; o != nil && slices.Contains(o.leases, l) {
			last = false
		}
	}
	if counts(l.Kind) && l.User != "" {
		if t.held[l.UID]--; t.held[l.UID] <= 0 {
			delete(t.held, l.UID)
		}
	}
	if len(d.shares) == 0 {
		d.freed = now
	}
	keep := d.sharers()
	t.mu.Unlock()
	t.owner.Released(l, d.id, now, last)
	if t.gate != nil {
		t.gate.Close(d.id, keep, nil)
	}
	t.mu.Lock()
	d.closing--
	t.mu.Unlock()
	t.owner.Freed()
	t.over(d, e)
}

// findShares finds the shares held at Open in the lock directory: a share
// file whose lock is taken is a share from before this start (its
// declaration read from it), one whose lock is free is removed. A held
// share file is never removed, whatever the configuration says now: on a
// device this start does not share ([share] no longer names it, or its
// memory is unknown) the share goes on as any other, no new share lands
// beside it, and the device is granted whole once its shares have ended.
// One of a device this broker does not manage is left as it is.
func (t *Table) findShares(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read lock directory %s: %w", dir, err)
	}
	for _, e := range ents {
		id, slot, ok := parseSharePath(e.Name())
		if !ok || !e.Type().IsRegular() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		fd, isFree, err := tryLock(path)
		if err != nil {
			return err
		}
		if isFree {
			unix.Unlink(path)
			unix.Close(fd)
			continue
		}
		if id >= len(t.devs) || t.devs[id] == nil {
			t.log.Printf("npu %d is not among this broker's devices, and a share of it is held (%s): left as it is", id, path)
			unix.Close(fd)
			continue
		}
		d := t.devs[id]
		file, err := fileid.Of(fd)
		if err != nil {
			t.log.Printf("npu %d: share lock file %s: %v; the share is kept until its release", id, path, err)
		}
		var buf [24]byte
		n, _ := unix.Pread(fd, buf[:], 0)
		mem, err := strconv.ParseInt(strings.TrimSpace(string(buf[:max(n, 0)])), 10, 64)
		if err != nil || mem <= 0 {
			// Not knowing what it declared, count the whole device.
			mem = max(d.capacity, 1)
		}
		l := &Lease{Pool: t.pc.Load().poolOf[id], Devices: []int{id}, Files: []fileid.ID{file}, Mem: mem, Since: time.Now(), Adopted: true}
		l.ID = t.newIDLocked(time.Now())
		s := &share{lease: l, slot: slot, mem: mem, path: path, file: file, fd: -1, spare: fd, poke: make(chan struct{}, 1), waiting: newEnding(fd)}
		d.shares = append(d.shares, s)
		d.leases = append(d.leases, l)
		switch {
		case d.unknown != "":
			t.log.Printf("npu %d holds a share of %d MiB from before this start, and its memory is unknown now: no new share on it until it is known, and no whole lease until its shares end", id, mem)
			continue
		case d.capacity <= 0:
			t.log.Printf("npu %d holds a share of %d MiB from before this start, and is not shared now (not in [share]): no new share on it, and no whole lease until its shares end", id, mem)
			continue
		}
		t.log.Printf("npu %d holds a share of %d MiB from before this start; waiting for its release", id, mem)
	}
	return nil
}

// admitShare checks a request for a share of mem MiB of each of w's
// devices: they must be shared, and enough of them large enough for it
// even when empty (a request that could never fit is refused at once),
// against the pools pc. Capacities change (SetCapacity) under the table's
// lock: admitShare takes it, unless locked (Reconfigure holds it).
func (t *Table) admitShare(pc *poolSet, w *Waiter, mem int64, locked bool) error {
	if w.External {
		return refusal.New(ErrBadRequest, "", "pool %q is %s's to allocate, and holds no shares", w.Pool, pc.external[w.Pool])
	}
	if !locked {
		t.mu.Lock()
		defer t.mu.Unlock()
	}
	var fit []int
	var largest int64
	shared, unknown := false, false
	for _, id := range w.Cand {
		d := t.devs[id]
		c := d.capacity
		shared = shared || c > 0 || d.unknown != ""
		largest = max(largest, c)
		if c >= mem || d.unknown != "" {
			// One whose memory is not known yet may hold it: the
			// request waits for it (unknownReasonLocked).
			fit = append(fit, id)
			unknown = unknown || d.unknown != ""
		} else if w.Exact {
			if c <= 0 {
				return refusal.New(ErrDenied, "npurun without --mem asks for the whole device", "%s is not shared", t.vendor.Format([]int{id}))
			}
			return refusal.New(ErrDenied, "", "%s asked of %s, which holds %s for shares at most", sizeOf(mem), t.vendor.Format([]int{id}), sizeOf(c))
		}
	}
	switch {
	case !shared:
		return refusal.New(ErrDenied, "npurun without --mem asks for whole devices", "the devices of pool %q are not shared", w.Pool)
	case len(fit) < w.N && len(fit) == 0:
		return refusal.New(ErrDenied, "", "%s asked, the largest share a device of pool %q holds is %s", sizeOf(mem), w.Pool, sizeOf(largest))
	case len(fit) < w.N:
		return refusal.New(ErrDenied, "", "%s of %s asked, only %d devices of pool %q hold that much", sizeOf(mem), quantity.Count(w.N, "device", "devices"), len(fit), w.Pool)
	}
	w.Cand, w.Mem = fit, mem
	if unknown && t.ask != nil {
		select {
		case t.ask <- struct{}{}:
		default:
		}
	}
	return nil
}

func sizeOf(mib int64) string { return quantity.Size(mib) }

// returnShares is Return for a share's handover: its files go, its room
// comes back, and a device the gate opened is closed to its user again,
// unless another share of theirs is there (one that cannot be closed now
// takes no lease until Gate.Close has closed it). The owner, whose call
// this is, is not told.
func (t *Table) returnShares(h *Handover) {
	t.dropShares(h)
	if !h.opened {
		return
	}
	for _, id := range h.Devices {
		d := t.devs[id]
		t.mu.Lock()
		keep := d.sharers()
		d.closing++
		t.mu.Unlock()
		err := t.gate.Revoke(id, keep)
		if err == nil {
			t.mu.Lock()
			d.closing--
			t.mu.Unlock()
			continue
		}
		// Out of service for shares and whole leases alike until the
		// gate has closed it.
		go func() {
			t.gate.Close(id, keep, err)
			t.mu.Lock()
			d.closing--
			t.mu.Unlock()
			t.owner.Freed()
		}()
	}
}

// Keep is who must keep access to device id when lease l's hold on it
// ends: the users of its other shares (Gate.Revoke's keep).
func (t *Table) Keep(id int, l *Lease) []uint32 {
	if id < 0 || id >= len(t.devs) || t.devs[id] == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []uint32
	for _, s := range t.devs[id].shares {
		if s.lease != l && !slices.Contains(out, s.uid) {
			out = append(out, s.uid)
		}
	}
	return out
}

// ShareMessage is what the holder of share handover h is told: what it
// was granted, and what else its device holds ("granted 12G of npu 3 (2
// other shares, 40G of 63G declared)").
func (t *Table) ShareMessage(h *Handover) string {
	if len(h.Devices) != 1 {
		return fmt.Sprintf("granted %s of each of %s", sizeOf(h.W.Mem), t.vendor.Format(h.Devices))
	}
	id := h.Devices[0]
	t.mu.Lock()
	d := t.devs[id]
	others, declared, capacity := len(d.shares)-1, d.declared(), d.capacity
	t.mu.Unlock()
	return fmt.Sprintf("granted %s of %s (%s, %s of %s declared)", sizeOf(h.W.Mem), t.vendor.Format(h.Devices),
		quantity.Count(others, "other share", "other shares"), sizeOf(declared), sizeOf(capacity))
}

// AdoptShare puts l in the place of found, a share found held at Open
// (its Lease in a Snapshot): l must be on found's device and lock file,
// with its declaration; its holder counts against its devices from now
// on, as any lease's. The owner's records (an accounting log) name l.
func (t *Table) AdoptShare(found, l *Lease) error {
	if len(found.Devices) != 1 || len(l.Devices) != 1 || l.Devices[0] != found.Devices[0] || len(l.Files) != 1 || l.Files[0] != found.Files[0] || l.Mem != found.Mem {
		return fmt.Errorf("adopt share %d: not the share found on its device and file", l.ID)
	}
	id := found.Devices[0]
	if id < 0 || id >= len(t.devs) || t.devs[id] == nil {
		return fmt.Errorf("adopt share %d: no npu %d here", l.ID, id)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.devs[id]
	for _, s := range d.shares {
		if s.lease != found {
			continue
		}
		s.lease, s.uid = l, l.UID
		if i := slices.Index(d.leases, found); i >= 0 {
			d.leases[i] = l
		}
		if counts(l.Kind) && l.User != "" {
			t.held[l.UID]++
		}
		t.lastID = max(t.lastID, l.ID)
		return nil
	}
	return fmt.Errorf("adopt share %d: npu %d holds no such share, or it has ended", l.ID, id)
}
