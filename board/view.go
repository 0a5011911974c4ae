package board

import (
	"bufio"
	"cmp"
	"fmt"
	"hash/fnv"
	"html/template"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/wire"
)

// The page is drawn from a view of the boxes: plain strings and numbers
// that the template (html/template) escapes where they land, the charts
// as SVG shapes with their coordinates worked out here.

var page = template.Must(template.New("page.html").Funcs(template.FuncMap{"f1": f1}).ParseFS(files, "templates/page.html"))

// Geometry of the charts, in SVG user units.
const (
	tlWidth    = 1000.0 // the timeline's width: 24 h
	tlLabel    = 70.0   // its device names' column
	tlRow      = 16.0
	sparkW     = 120.0
	sparkH     = 24.0
	usageWidth = 300.0
	// maxWaitersDrawn bounds the waiters the page lists per line.
	maxWaitersDrawn = 20
	// minBar is the narrowest bar drawn: a lease of a few seconds is
	// seen (a pixel of a 1000-wide day is 86 s).
	minBar = 2.0
	// maxTableRows bounds the leases listed in the table under the
	// timeline: the newest.
	maxTableRows = 200
)

type pageView struct {
	Refresh int // seconds
	Now     string
	Boxes   []boxView
}

type boxView struct {
	Name      string
	URL       string
	Local     bool
	Down      string
	DownSince string
	Vendor    string
	Fetched   string
	Devices   []deviceView
	Lines     []lineView
	Unleased  []unleasedView
	Timeline  timelineView
	Usage     []usageView
	UsageMax  string
	Truncated bool
}

type deviceView struct {
	Name, State, Pool string
	Class             string // one of a fixed set: the row's look
	Holder            string
	Kind              string
	Since             string
	Util, Mem         string
	Note              string // drained, unhealthy, idle, shares
	Commands          []string
	Spark             string // polyline points
	SparkKnown        bool
}

type lineView struct {
	Pool    string
	Count   int
	Waiters []waiterView
	More    int
}

type waiterView struct {
	Position       int
	User, Kind     string
	Wants, Waiting string
	Start, Why     string
}

type unleasedView struct {
	Device, User, Command, Since, Action string
	PID                                  int
}

type timelineView struct {
	Width, Height float64
	Axis          float64 // the y of the hours' labels
	Rows          []tlRowView
	Ticks         []tickView
	Entries       int
	Table         []leaseRowView // the newest leases, for the table under the chart

	// what drawTimeline draws the chart from
	h        *wire.HistoryReport
	hi       int64
	colourOf func(string) string
	clockOf  func(int64) string
}

type tlRowView struct {
	Name string
	Y    float64
	Bars []barView
}

// barView is a bar of the timeline: one lease, or several whose starts
// fall within minBar of each other (N of them).
type barView struct {
	X, W, Y float64
	Idle    []segView
	N       int
	users   []userTime // a merged bar's users and their time, for its colour
	first   int64      // its first start and last end, Unix ms
	last    int64
	entry   int // its (first) lease's index in the history
}

// userTime is a user's time in a merged bar, ms.
type userTime struct {
	user string
	ms   int64
}

// addUser adds ms of user's to a merged bar.
func (b *barView) addUser(user string, ms int64) {
	for i := range b.users {
		if b.users[i].user == user {
			b.users[i].ms += ms
			return
		}
	}
	b.users = append(b.users, userTime{user, ms})
}

// entryKind is how the timeline names a lease's kind.
func entryKind(e *wire.HistoryEntry) string {
	what := e.Kind
	if e.Task != 0 {
		what += " " + strconv.FormatUint(e.Task, 10)
	}
	return cmp.Or(what, "held")
}

// idleOf is how long a lease was found idle, "" for not at all.
func idleOf(e *wire.HistoryEntry) string {
	if e.IdleMS <= 0 {
		return ""
	}
	return quantity.Duration(time.Duration(e.IdleMS) * time.Millisecond)
}

type segView struct{ X, W float64 }

type tickView struct {
	X     float64
	Label string
}

type leaseRowView struct {
	Device, User, Kind, From, To, Idle string
}

type usageView struct {
	User   string
	Hours  string
	Busy   string
	Leases int
	W      float64
	BusyW  float64
	Fill   string
}

func f1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

// drawing bounds the pages drawn at once.
var drawing = make(chan struct{}, 4)

// page serves the page, or with ?part=boxes the panels alone.
func (s *Server) page(w http.ResponseWriter, r *http.Request) {
	part := r.URL.Query().Get("part")
	if part != "" && part != "boxes" {
		http.Error(w, "bad part: want boxes", http.StatusBadRequest)
		return
	}
	select { // a bounded number drawn at once; the others wait their turn
	case drawing <- struct{}{}:
		defer func() { <-drawing }()
	case <-r.Context().Done():
		return
	}
	now := time.Now()
	v := s.view(s.boxes(), now)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	name := "page"
	if part == "boxes" {
		name = "part"
	}
	if err := Render(w, name, v); err != nil {
		s.cfg.Log.Printf("draw the page: %v", err)
	}
}

// Render draws the view v: the page ("page"), or its panels alone
// ("part"). The template draws each panel around its timeline, which
// drawTimeline writes between.
func Render(w io.Writer, name string, v *pageView) error {
	bw := bufio.NewWriterSize(w, 32<<10)
	if err := page.ExecuteTemplate(bw, name, v); err != nil {
		return err
	}
	for i := range v.Boxes {
		box := &v.Boxes[i]
		if err := page.ExecuteTemplate(bw, "box-open", box); err != nil {
			return err
		}
		if box.Down == "" {
			drawTimeline(bw, &box.Timeline)
		}
		if err := page.ExecuteTemplate(bw, "box-close", box); err != nil {
			return err
		}
	}
	if err := page.ExecuteTemplate(bw, name+"-close", v); err != nil {
		return err
	}
	return bw.Flush()
}

// View makes the page's view of boxes at now (for benchmarks and tests).
func (s *Server) View(boxes []*Box, now time.Time) *pageView { return s.view(boxes, now) }

func (s *Server) view(boxes []*Box, now time.Time) *pageView {
	v := &pageView{Refresh: max(1, int(s.cfg.Refresh/time.Second)), Now: now.Format("2006-01-02 15:04:05 MST")}
	for _, b := range boxes {
		v.Boxes = append(v.Boxes, boxOf(b, now))
	}
	return v
}

func boxOf(b *Box, now time.Time) boxView {
	bv := boxView{Name: b.Name, URL: b.URL, Local: b.Local}
	if b.Down != "" || b.Status == nil {
		bv.Down = cmp.Or(b.Down, "no data")
		bv.DownSince = clock(b.DownSince, now) + " (" + ago(b.DownSince, now) + " ago)"
		return bv
	}
	st := b.Status
	bv.Vendor, bv.Truncated = st.Vendor, st.Truncated
	bv.Fetched = clock(b.Fetched, now)
	for _, d := range st.Devices {
		bv.Devices = append(bv.Devices, deviceOf(d, b.Util[strconv.Itoa(d.ID)], now))
	}
	for _, ln := range st.Waiting {
		if ln.Count == 0 {
			continue
		}
		lv := lineView{Pool: cmp.Or(ln.Pool, "(none)"), Count: ln.Count}
		for i, wi := range ln.Waiters {
			if i == maxWaitersDrawn {
				break
			}
			wv := waiterView{Position: wi.Position, User: wi.User, Kind: wi.Kind, Wants: wire.Wanted(wi.N, wi.Mem, devList(wi.Devices)),
				Waiting: ago(wi.Since, now), Why: wi.Why}
			if wi.Start != 0 {
				wv.Start = wire.StartBy(wi.Start, now)
			}
			lv.Waiters = append(lv.Waiters, wv)
		}
		lv.More = ln.Count - len(lv.Waiters)
		bv.Lines = append(bv.Lines, lv)
	}
	for _, u := range st.Unleased {
		bv.Unleased = append(bv.Unleased, unleasedView{Device: cmp.Or(u.Name, u.Node), User: u.User, Command: u.Command,
			Since: ago(u.Since, now), Action: u.Action, PID: u.PID})
	}
	bv.Timeline = timelineOf(st, b.History, b.Idle, now)
	bv.Usage, bv.UsageMax = usageOf(b.Usage)
	return bv
}

func devList(ids []int) string {
	if len(ids) == 0 {
		return ""
	}
	var parts []string
	for _, id := range ids {
		parts = append(parts, strconv.Itoa(id))
	}
	return "device " + strings.Join(parts, ",")
}

// stateClass maps a device's state to the row's class: a fixed set.
func stateClass(state string) string {
	switch state {
	case wire.DeviceFree:
		return "free"
	case wire.DeviceReserved:
		return "reserved"
	case wire.DeviceDrained, wire.DeviceOut:
		return "out"
	}
	return "busy"
}

func deviceOf(d wire.DeviceState, samples []Sample, now time.Time) deviceView {
	dv := deviceView{Name: d.Name, State: d.State, Pool: d.Pool, Class: stateClass(d.State)}
	if d.Since != 0 {
		dv.Since = ago(d.Since, now)
	}
	leases := d.Shares
	if d.Lease != nil && !slices.ContainsFunc(leases, func(l wire.LeaseInfo) bool { return l.ID == d.Lease.ID }) {
		leases = append([]wire.LeaseInfo{*d.Lease}, leases...)
	}
	var users, kinds, notes []string
	for _, l := range leases {
		if !slices.Contains(users, l.User) {
			users = append(users, l.User)
		}
		kind := cmp.Or(l.Kind, "held")
		if l.Task != 0 {
			kind += " " + strconv.FormatUint(l.Task, 10)
		}
		if l.Container != nil && l.Container.Name != "" {
			kind += " (" + l.Container.Name + ")"
		}
		kinds = append(kinds, kind)
		if l.IdleSince != 0 {
			notes = append(notes, "idle "+ago(l.IdleSince, now))
		}
		for i, h := range l.Holders {
			if i == 3 {
				break
			}
			if h.Command != "" {
				dv.Commands = append(dv.Commands, h.User+": "+h.Command)
			}
		}
	}
	if d.ReservedFor != nil {
		users = append(users, "(kept for "+d.ReservedFor.User+")")
	}
	dv.Holder, dv.Kind = strings.Join(users, ", "), strings.Join(kinds, ", ")
	if d.Drain != nil && d.Drain.Drained {
		n := "drained"
		if d.Drain.Reason != "" {
			n += ": " + d.Drain.Reason
		}
		notes = append(notes, n)
	}
	if len(d.Shares) > 0 {
		notes = append(notes, fmt.Sprintf("%d shares, %s of %s declared", len(d.Shares), quantity.Size(d.Declared), quantity.Size(d.Capacity)))
	}
	dv.Note = strings.Join(notes, "; ")
	switch {
	case d.Util != nil:
		dv.Util = strconv.FormatFloat(*d.Util, 'f', 0, 64) + "%"
	case d.UtilUnknown != "":
		dv.Util = "?"
	}
	if d.MemTotal > 0 {
		dv.Mem = quantity.Size(d.MemUsed) + " / " + quantity.Size(d.MemTotal)
	}
	dv.Spark, dv.SparkKnown = spark(samples, now)
	return dv
}

// spark is the sparkline's points: the last hour, 0–100 %.
func spark(samples []Sample, now time.Time) (string, bool) {
	lo := now.Add(-sparkSpan).UnixMilli()
	var b strings.Builder
	known := false
	for _, s := range samples {
		if s.T < lo || s.U < 0 {
			continue
		}
		x := sparkW * float64(s.T-lo) / float64(sparkSpan.Milliseconds())
		y := sparkH - sparkH*min(max(s.U, 0), 100)/100
		fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
		known = true
	}
	return strings.TrimSpace(b.String()), known
}

// colour is a user's colour: the same on every box and every load.
func colour(user string) string {
	h := fnv.New32a()
	h.Write([]byte(user))
	return fmt.Sprintf("hsl(%d,55%%,55%%)", h.Sum32()%360)
}

func timelineOf(st *wire.Board, h *wire.HistoryReport, idle map[uint64][]Gap, now time.Time) timelineView {
	tv := timelineView{Width: tlLabel + tlWidth}
	hi := now.UnixMilli()
	lo := now.Add(-DefaultHistorySince).UnixMilli()
	x := func(t int64) float64 {
		return tlLabel + tlWidth*float64(min(max(t, lo), hi)-lo)/float64(hi-lo)
	}
	rows := map[int]int{}
	for _, d := range st.Devices {
		rows[d.ID] = len(tv.Rows)
		tv.Rows = append(tv.Rows, tlRowView{Name: d.Name, Y: float64(len(tv.Rows)) * tlRow})
	}
	// Users' colours and times of day by the minute, each made once.
	colours := map[string]string{}
	colourOf := func(user string) string {
		c, ok := colours[user]
		if !ok {
			c = colour(user)
			colours[user] = c
		}
		return c
	}
	clocks := map[int64]string{}
	clockOf := func(ms int64) string {
		if ms == 0 {
			return ""
		}
		m := ms / 60000
		c, ok := clocks[m]
		if !ok {
			c = clock(ms, now)
			clocks[m] = c
		}
		return c
	}
	if h != nil {
		tv.Entries = len(h.Entries)
		if len(st.Devices) > 0 {
			for i := range tv.Rows {
				tv.Rows[i].Bars = make([]barView, 0, min(len(h.Entries)/len(st.Devices)+8, int(tlWidth/minBar)+8))
			}
		}
		for k := range h.Entries { // in the order of their starts
			e := &h.Entries[k]
			i, ok := rows[e.Device]
			if !ok {
				i = len(tv.Rows)
				rows[e.Device] = i
				tv.Rows = append(tv.Rows, tlRowView{Name: e.Name, Y: float64(i) * tlRow})
			}
			end := e.End
			if end == 0 {
				end = hi
			}
			if end < lo {
				continue
			}
			if len(h.Entries)-k <= maxTableRows {
				tv.Table = append(tv.Table, leaseRowView{Device: e.Name, User: e.User, Kind: entryKind(e), From: clock(e.Start, now), To: cmp.Or(clock(e.End, now), "now"), Idle: idleOf(e)})
			}
			x0, x1 := x(e.Start), x(end)
			var gaps []segView
			for _, g := range idle[e.Lease] {
				a, b := x(max(g.From, e.Start)), x(min(g.To, end))
				if b > a {
					gaps = append(gaps, segView{X: a, W: b - a})
				}
			}
			row := &tv.Rows[i]
			if n := len(row.Bars); n > 0 && x0-row.Bars[n-1].X < minBar {
				// Too close to the last bar to be seen apart: one bar.
				bar := &row.Bars[n-1]
				bar.W = max(bar.W, x1-bar.X, minBar)
				if bar.N == 1 {
					bar.addUser(h.Entries[bar.entry].User, bar.last-bar.first)
				}
				bar.N++
				bar.addUser(e.User, end-e.Start)
				bar.Idle = append(bar.Idle, gaps...)
				bar.last = max(bar.last, end)
				continue
			}
			row.Bars = append(row.Bars, barView{X: x0, W: max(x1-x0, minBar), Y: row.Y + 2, N: 1, Idle: gaps, first: e.Start, last: end, entry: k})
		}
	}
	slices.Reverse(tv.Table) // newest first
	tv.Axis = float64(len(tv.Rows)) * tlRow
	tv.Height = tv.Axis + 14
	for t := time.UnixMilli(lo).Truncate(time.Hour).Add(time.Hour); t.UnixMilli() < hi; t = t.Add(3 * time.Hour) {
		tv.Ticks = append(tv.Ticks, tickView{X: x(t.UnixMilli()), Label: t.Format("15:04")})
	}
	tv.h, tv.hi, tv.colourOf, tv.clockOf = h, hi, colourOf, clockOf
	return tv
}

// drawTimeline draws the timeline as SVG, straight to the answer. It is
// written here rather than by the template, for speed and memory (a day
// of a busy box is thousands of bars):
// every string in it that is not a number or one of its own words
// (device and user names, kinds) goes through template.HTMLEscapeString,
// which escapes < > & ' " , in a text node or a quoted attribute alike.
func drawTimeline(b *bufio.Writer, tv *timelineView) {
	h, hi, colourOf, clockOf := tv.h, tv.hi, tv.colourOf, tv.clockOf
	var scratch [32]byte
	var names []string // a merged bar's users, reused
	num := func(v float64) { b.Write(strconv.AppendFloat(scratch[:0], v, 'f', 1, 64)) }
	esc := template.HTMLEscapeString
	b.WriteString(`<svg class="timeline" viewBox="0 0 `)
	num(tv.Width)
	b.WriteByte(' ')
	num(tv.Height)
	b.WriteString(`" width="`)
	num(tv.Width)
	b.WriteString(`" height="`)
	num(tv.Height)
	b.WriteString(`" role="img" aria-label="leases of the last 24 hours, one row per device">` + "\n")
	for _, t := range tv.Ticks {
		b.WriteString(`<line x1="`)
		num(t.X)
		b.WriteString(`" x2="`)
		num(t.X)
		b.WriteString(`" y1="0" y2="`)
		num(tv.Axis)
		b.WriteString(`" stroke="#ccc"/>`)
	}
	for _, r := range tv.Rows {
		b.WriteString(`<g class="tlrow" data-device="` + esc(r.Name) + `"><text x="2" y="`)
		num(r.Y)
		b.WriteString(`" dy="12" class="tlname">` + esc(r.Name) + "</text>\n")
		for j := range r.Bars {
			bar := &r.Bars[j]
			e := &h.Entries[bar.entry]
			fill := e.User
			names = names[:0]
			if bar.N > 1 {
				most := int64(-1)
				for _, ut := range bar.users {
					names = append(names, ut.user)
					if ut.ms > most || ut.ms == most && ut.user < fill {
						fill, most = ut.user, ut.ms
					}
				}
				slices.Sort(names)
			}
			b.WriteString(`<rect class="lease" x="`)
			num(bar.X)
			b.WriteString(`" y="`)
			num(bar.Y)
			b.WriteString(`" width="`)
			num(bar.W)
			b.WriteString(`" height="12" fill="`)
			b.WriteString(esc(colourOf(fill)))
			b.WriteString(`"><title>`)
			b.WriteString(esc(e.Name))
			b.WriteString(": ")
			if bar.N == 1 {
				b.WriteString(esc(e.User))
				b.WriteString(", ")
				b.WriteString(esc(entryKind(e)))
				b.WriteString(", ")
				b.WriteString(clockOf(e.Start))
				b.WriteString("–")
				b.WriteString(cmp.Or(clockOf(e.End), "now"))
				if idle := idleOf(e); idle != "" {
					b.WriteString(", idle ")
					b.WriteString(idle)
				}
			} else {
				b.WriteString(strconv.Itoa(bar.N))
				b.WriteString(" leases, ")
				b.WriteString(clockOf(bar.first))
				b.WriteString("–")
				if bar.last < hi {
					b.WriteString(clockOf(bar.last))
				} else {
					b.WriteString("now")
				}
				b.WriteString(" (")
				for k, u := range names {
					if k == 5 {
						b.WriteString(", …")
						break
					}
					if k > 0 {
						b.WriteString(", ")
					}
					b.WriteString(esc(u))
				}
				b.WriteString(")")
			}
			b.WriteString(`</title></rect>`)
			for _, g := range bar.Idle {
				b.WriteString(`<rect class="idle" x="`)
				num(g.X)
				b.WriteString(`" y="`)
				num(bar.Y)
				b.WriteString(`" width="`)
				num(g.W)
				b.WriteString(`" height="12" fill="url(#hatch)"/>`)
			}
		}
		b.WriteString("</g>\n")
	}
	for _, t := range tv.Ticks {
		b.WriteString(`<text x="`)
		num(t.X)
		b.WriteString(`" y="`)
		num(tv.Axis)
		b.WriteString(`" dy="11" class="ticklabel">` + esc(t.Label) + `</text>`)
	}
	b.WriteString("</svg>")
}

func usageOf(u *wire.UsageReport) ([]usageView, string) {
	if u == nil {
		return nil, ""
	}
	type sum struct {
		hours, busy, sampled float64
		leases               int
	}
	by := map[string]*sum{}
	var users []string
	for _, r := range u.Rows {
		if r.User == "" {
			continue
		}
		s := by[r.User]
		if s == nil {
			s = &sum{}
			by[r.User] = s
			users = append(users, r.User)
		}
		s.hours += r.DeviceHours
		s.leases += r.Leases
		if r.Busy != nil {
			s.busy += *r.Busy * r.DeviceHours
			s.sampled += r.DeviceHours
		}
	}
	slices.SortFunc(users, func(a, b string) int { return cmp.Or(cmp.Compare(by[b].hours, by[a].hours), cmp.Compare(a, b)) })
	most := 0.0
	for _, s := range by {
		most = max(most, s.hours)
	}
	var out []usageView
	for _, name := range users {
		s := by[name]
		uv := usageView{User: name, Hours: strconv.FormatFloat(s.hours, 'f', 1, 64), Leases: s.leases, Fill: colour(name), Busy: "–"}
		if most > 0 {
			uv.W = usageWidth * s.hours / most
		}
		if s.sampled > 0 {
			busy := s.busy / s.sampled
			uv.Busy = strconv.FormatFloat(busy, 'f', 0, 64) + "%"
			uv.BusyW = uv.W * busy / 100
		}
		out = append(out, uv)
	}
	return out, strconv.FormatFloat(most, 'f', 1, 64)
}

// clock is a time of day (with the date where it is not today's); "" for 0.
func clock(ms int64, now time.Time) string {
	if ms == 0 {
		return ""
	}
	t := time.UnixMilli(ms)
	if y, m, d := t.Date(); y == now.Year() && m == now.Month() && d == now.Day() {
		return t.Format("15:04")
	}
	return t.Format("Jan 2 15:04")
}

// ago is how long ago ms was, cut to what a glance needs
// (quantity.Approx); "" for none.
func ago(ms int64, now time.Time) string {
	if ms == 0 {
		return ""
	}
	return quantity.Approx(now.Sub(time.UnixMilli(ms)))
}
