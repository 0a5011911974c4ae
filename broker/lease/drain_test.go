package lease

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/policy"
)

// TestDrain: a drained device is granted to nobody, exact or counted,
// and shows Drained with its drain; its lease runs on and, ended, leaves
// it drained, not free; a request that only it could serve is told why
// in its reason and reserves nothing (a smaller one behind it is served);
// undrained, it is granted again and the owner hears of it (Freed).
func TestDrain(t *testing.T) {
	o, _ := newTable(t, 3, nil)
	_, ch := o.ask(t, 1, 0, "", []int{2}, policy.Limit{})
	holder := got(t, ch, "holder of npu2")
	since := time.UnixMilli(time.Now().UnixMilli())
	if _, err := o.tbl.Drain(2, Drain{By: "root", Reason: "ECC errors", Since: since}); err != nil {
		t.Fatal(err)
	}
	if _, err := o.tbl.Drain(7, Drain{By: "root"}); !errors.Is(err, ErrNoDevice) || !strings.Contains(err.Error(), "npu 7") {
		t.Errorf("drain of npu 7: %v, want ErrNoDevice naming it", err)
	}
	if _, err := o.tbl.Drain(1, Drain{By: "root", Reason: "two\nlines"}); !errors.Is(err, ErrBadRequest) {
		t.Errorf("drain with a newline in its reason: %v, want ErrBadRequest", err)
	}
	d := o.tbl.Snapshot().Devices[2]
	if d.State != Leased || d.Drain == nil || d.Drain.Reason != "ECC errors" || !d.Drain.Since.Equal(since) {
		t.Errorf("npu2 drained under its lease: %+v, drain %+v; want leased, drained", d, d.Drain)
	}
	wexact, chexact := o.ask(t, 2, 0, "", []int{2}, policy.Limit{})
	wbig, chbig := o.ask(t, 3, 3, "", nil, policy.Limit{})
	_, chsmall := o.ask(t, 4, 1, "", nil, policy.Limit{})
	got(t, chsmall, "small behind a request that waits for a drained device").release()
	holder.release()
	awaitEvent(t, o, fmt.Sprintf("released %d npu2", holder.l.ID))
	awaitEvent(t, o, "freed")
	none(t, o, chexact, "exact request of drained npu2")
	none(t, o, chbig, "request of 3 with npu2 drained")
	snap := o.tbl.Snapshot()
	if d := snap.Devices[2]; d.State != Drained || d.Drain == nil {
		t.Errorf("released drained npu2: state %d, want Drained", d.State)
	}
	for _, d := range snap.Devices[:2] {
		if d.State == Reserved {
			t.Errorf("npu%d reserved for %v, which waits for drained npu2", d.ID, d.For)
		}
	}
	for _, w := range []*Waiter{wexact, wbig} {
		if r := o.tbl.Reason(w); !strings.Contains(r, "npu2 drained by root since") || !strings.Contains(r, "ECC errors") {
			t.Errorf("reason of %d device(s) %v: %q, want npu2's drain", w.N, w.Cand, r)
		}
	}
	got(t, o.askCh(t, 5, 1), "a request of 1 behind the big one, which reserves nothing while it waits for npu2").release()
	if was, err := o.tbl.Undrain(2); !was || err != nil {
		t.Fatalf("undrain: %v, %v", was, err)
	}
	g := got(t, chexact, "exact request of npu2, undrained")
	if g.l.Devices[0] != 2 {
		t.Errorf("exact request got %v", g.l.Devices)
	}
	g.release()
	got(t, chbig, "big once npu2 is back").release()
	if was, err := o.tbl.Undrain(2); was || err != nil {
		t.Errorf("undrain of a device not drained: %v, %v", was, err)
	}
}

// TestDrainFile: drains are kept in the drain file and read back by the
// next Open; a malformed file is an error naming it, never a panic; a
// device the file names that is not managed is left out.
func TestDrainFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "drained.json")
	open := func() (*Table, error) {
		return Open(Config{Dir: filepath.Join(dir, "locks"), IDs: ids(2), Pools: []Pool{{Name: "default"}}, DefaultPool: "default", Vendor: npu.Fake, DrainFile: file})
	}
	tbl, err := open()
	if err != nil {
		t.Fatal(err)
	}
	since := time.UnixMilli(1700000000123)
	if _, err := tbl.Drain(1, Drain{By: "root", Reason: "fan", Since: since}); err != nil {
		t.Fatal(err)
	}
	if _, err := tbl.Drain(1, Drain{By: "root", Since: since.Add(time.Hour)}); err != nil { // again, no reason: the first stands
		t.Fatal(err)
	}
	tbl.closeAll()
	tbl2, err := open()
	if err != nil {
		t.Fatal(err)
	}
	if d := tbl2.Drains()[1]; d.By != "root" || d.Reason != "fan" || !d.Since.Equal(since.Add(time.Hour)) {
		t.Errorf("read back %+v", d)
	}
	tbl2.closeAll()
	for _, bad := range []string{"{", `{"v":2,"drained":[]}`, `{"v":1,"drained":[{"id":1},{"id":1}]}`, `{"v":1,"drained":[{"id":"x"}]}`, `{"v":1,"what":1}`} {
		if err := os.WriteFile(file, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		tbl, err := open()
		if err == nil {
			tbl.closeAll()
			t.Errorf("drain file %s opened", bad)
			continue
		}
		if !errors.Is(err, ErrDrainFile) || !strings.Contains(err.Error(), file) {
			t.Errorf("drain file %s: %v, want ErrDrainFile naming %s", bad, err, file)
		}
	}
	os.Remove(file)
	os.Symlink(filepath.Join(dir, "elsewhere"), file)
	if tbl, err := open(); err == nil || !errors.Is(err, ErrDrainFile) {
		if tbl != nil {
			tbl.closeAll()
		}
		t.Errorf("a drain file that is a symbolic link: %v, want ErrDrainFile", err)
	}
	os.Remove(file)
	os.WriteFile(file, []byte(`{"v":1,"drained":[{"id":9,"by":"root"}]}`), 0o644)
	tbl3, err := open()
	if err != nil {
		t.Fatalf("a drain of a device not managed: %v", err)
	}
	if len(tbl3.Drains()) != 0 {
		t.Errorf("drains %v, want none", tbl3.Drains())
	}
	tbl3.closeAll()
}

// askCh asks for n devices of the default pool for uid, and returns where
// the grant comes.
func (o *owner) askCh(t *testing.T, uid uint32, n int) chan grant {
	t.Helper()
	_, ch := o.ask(t, uid, n, "", nil, policy.Limit{})
	return ch
}
