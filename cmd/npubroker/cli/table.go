package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/npurun/npurun/internal/printable"
	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/wire"
)

// Table writes the board for people, fitting the command column to width
// (0: no limit); durations count to now.
//
// Where the broker samples the devices' utilization ([status]
// util_interval), a UTIL column says each device's utilization at the
// last sample and, for a lease, the mean of its devices since its start;
// a lease whose devices every sample has found idle is marked so:
//
//	DEVICE  POOL     STATE   USER   PID   COMMAND           UTIL (now / held)  SINCE
//	npu0    default  leased  alice  4121  python train.py   97% / 88%          2h13m
//	npu1    default  leased  bob    5120  jupyter-lab       0% / 3%            1d4h   idle 26h, reclaim at 16:00
//	npu2    default  free                                   0%
//
//	DEVICE  POOL         STATE     USER     PID    COMMAND                    SINCE
//	npu0    interactive  leased    alice    4121   python train.py            2h13m
//	npu1    interactive  free
//	npu12   queue        task 118  bob      5120   torchrun train.py          40m
//	npu13   queue        reserved  -        -      for task 121 (needs 2)     3m
//	npu14   queue        drained   root     -      ECC errors                 1h
//	WAITING  pool "queue": 2    pool "interactive": 0
//	  1  task 121   carol  2 devices   4m
//	  2  npurun     dave   1 device    1m  waits: dave holds 2 of 2 devices allowed ([limits])
//	UNLEASED USE
//	  npu7   erin   777   python hack.py   /dev/davinci7 open without a lease for 3m
//	DRAINED
//	  npu14  by root since 2026-11-26 09:50  ECC errors
//
// Where a device holds shares (npurun --mem), a MEM column says what each
// share declared and what it uses, as the vendor's tool shows it, and
// each share has a row of its own under its device's:
//
//	DEVICE  POOL   STATE     USER   PID   COMMAND          MEM                SINCE
//	npu3    share  3 shares  alice  4121  python eval.py   12G / 9.8G         3m
//	                         bob    5120  python serve.py  16G / 15.1G        2h
//	                         carol  5200  python ft.py     12G / 13.9G  over! 40m
//
// A device the configuration shares whose memory the vendor's tool could
// not say yet has MEM unknown, and a line of its own at the end:
//
//	MEMORY UNKNOWN
//	  npu3  no new share until the broker knows it: run npu-smi info: exit status 1
func Table(b *wire.Board, width int, now time.Time) string {
	shared := false
	for _, d := range b.Devices {
		shared = shared || d.Capacity > 0 || d.CapacityUnknown != ""
	}
	rows := [][]string{{"DEVICE", "POOL", "STATE", "USER", "PID", "COMMAND", "SINCE"}}
	if shared {
		rows[0] = []string{"DEVICE", "POOL", "STATE", "USER", "PID", "COMMAND", "MEM", "SINCE"}
	}
	if b.Util != nil {
		rows[0] = append(rows[0][:len(rows[0])-1:len(rows[0])-1], "UTIL (now / held)", "SINCE")
	}
	for _, d := range b.Devices {
		if !shared {
			rows = append(rows, utilRow(b, d, d.Lease, deviceRow(b, d, now), now))
			continue
		}
		rows = append(rows, shareRows(b, d, now)...)
	}
	var out strings.Builder
	writeColumns(&out, rows, 5, width)

	out.WriteString("WAITING ")
	pools := 0
	for _, ln := range b.Waiting {
		fmt.Fprintf(&out, " pool %q: %d   ", ln.Pool, ln.Count)
		if ln.Count > 0 {
			pools++
		}
	}
	trimLine(&out)
	var waiters [][]string
	for _, ln := range b.Waiting {
		for _, w := range ln.Waiters {
			row := []string{}
			if pools > 1 {
				row = append(row, ln.Pool)
			}
			row = append(row, strconv.Itoa(w.Position), what(w), w.User, wanted(b, w), quantity.Approx(now.Sub(time.UnixMilli(w.Since))))
			if ln.Pool != "cpu" || w.Start != 0 {
				row = append(row, wire.StartBy(w.Start, now))
			}
			if w.Why != "" {
				row = append(row, "waits: "+w.Why)
			}
			waiters = append(waiters, row)
		}
		if shown := len(ln.Waiters); ln.Count > shown {
			row := []string{}
			if pools > 1 {
				row = append(row, ln.Pool)
			}
			waiters = append(waiters, append(row, "…", fmt.Sprintf("and %d more", ln.Count-shown)))
		}
	}
	if len(waiters) > 0 {
		writeColumns(&out, waiters, -1, width, "  ")
	}

	if len(b.Unleased) > 0 {
		out.WriteString("UNLEASED USE\n")
		var rows [][]string
		for _, u := range b.Unleased {
			how := "open"
			if u.Mapped {
				how = "mapped"
			}
			note := fmt.Sprintf("%s %s without a lease for %s", u.Node, how, quantity.Approx(now.Sub(time.UnixMilli(u.Since))))
			if u.Control {
				note += " (control node; no lease at all)"
			}
			switch u.Action {
			case "term":
				note += "; sent SIGTERM"
			case "kill":
				note += "; sent SIGKILL"
			}
			cmd := orDash(u.Command)
			if u.Container != nil {
				cmd = containerName(u.Container) + ": " + cmd
			}
			rows = append(rows, []string{orDash(u.Name), u.User, strconv.Itoa(u.PID), cmd, note})
		}
		writeColumns(&out, rows, 3, width, "  ")
	}
	var drained [][]string
	for _, d := range b.Devices {
		if dr := d.Drain; dr != nil {
			note := orDash(dr.Reason)
			if d.Lease != nil {
				note += " (its lease runs on to its end)"
			}
			drained = append(drained, []string{d.Name, "by " + dr.By + " since " + time.UnixMilli(dr.Since).Format("2006-01-02 15:04"), note})
		}
	}
	if len(drained) > 0 {
		out.WriteString("DRAINED\n")
		writeColumns(&out, drained, 2, width, "  ")
	}
	var unknown [][]string
	for _, d := range b.Devices {
		if d.CapacityUnknown != "" {
			unknown = append(unknown, []string{d.Name, "no new share until the broker knows it: " + d.CapacityUnknown})
		}
	}
	if len(unknown) > 0 {
		out.WriteString("MEMORY UNKNOWN\n")
		writeColumns(&out, unknown, 1, width, "  ")
	}
	if b.Truncated {
		out.WriteString("(lists cut to fit one message: see --json for what the broker sent)\n")
	}
	return out.String()
}

// deviceRow is one device's line of the table.
func deviceRow(b *wire.Board, d wire.DeviceState, now time.Time) []string {
	row := []string{d.Name, orDash(d.Pool), d.State}
	since := ""
	if d.Since > 0 {
		since = quantity.Approx(now.Sub(time.UnixMilli(d.Since)))
	}
	switch l := d.Lease; {
	case l != nil:
		first := 0
		switch l.Kind {
		case wire.KindTask:
			row[2] = "task " + strconv.FormatUint(l.Task, 10)
		case wire.KindSlurm:
			row[2] = "job " + strconv.FormatUint(uint64(l.SlurmJob), 10)
			// The job's own processes before its step daemons (root's).
			for i, h := range l.Holders {
				if h.UID == l.UID {
					first = i
					break
				}
			}
		}
		// USER is whose lease it is, as --json's user: a Slurm job's
		// user though its holder be slurmstepd (root's), a container
		// lease's user though its processes be the container's root. A
		// holder of another account (not root's: a descriptor passed on)
		// is named after its command.
		pid, cmd := "?", "(no holder found yet)"
		if l.Kind == wire.KindLogin {
			pid, cmd = "-", origin(l)
		}
		if len(l.Holders) > 0 {
			h := l.Holders[first]
			pid, cmd = strconv.Itoa(h.PID), orDash(h.Command)
			if h.UID != l.UID && h.UID != 0 && h.User != "" {
				cmd += " (held by " + h.User + ")"
			}
			if more := len(l.Holders) - 1 + l.MoreHolders; more > 0 {
				cmd += fmt.Sprintf(" (+%d)", more)
			}
		}
		cmd = inContainer(l, cmd)
		if bf := l.Backfill; bf != nil {
			cmd += "; " + wire.Backfilled(bf.EndsBy, bf.Before, bf.Beside, now)
		}
		row = append(row, orDash(l.User), pid, cmd, since)
		if d.Drain != nil {
			row[2] += ", drained"
		}
	case d.Drain != nil:
		row = append(row, orDash(d.Drain.By), "-", orDash(d.Drain.Reason), since)
	case d.ReservedFor != nil:
		w := d.ReservedFor
		row = append(row, "-", "-", fmt.Sprintf("for %s (needs %d)", forWhom(w), w.N), since)
	default:
		row = append(row, "", "", "", "")
	}
	return row
}

// inContainer is the command column of lease l where a container holds
// it: for a lease of kind container, the container's name (and id) before
// its first holder's command; for another kind's (a task's), whose
// holders are in a container, the container's name after.
func inContainer(l *wire.LeaseInfo, cmd string) string {
	c := l.Container
	if c == nil {
		for _, h := range l.Holders {
			if h.Container != nil {
				c = h.Container
				break
			}
		}
	}
	switch {
	case c == nil:
		return cmd
	case l.Kind == wire.KindContainer:
		return "container " + containerName(c) + ": " + cmd
	}
	return cmd + " (container " + c.Short() + ")"
}

// containerName is c as the table names it: "train (3f2a9c1d0b7e)", or
// its short id where its name is not known.
func containerName(c *wire.ContainerRef) string {
	id := (&wire.ContainerRef{ID: c.ID}).Short()
	if c.Name == "" {
		return printable.String(id)
	}
	return printable.String(c.Name) + " (" + id + ")"
}

func origin(l *wire.LeaseInfo) string {
	s := l.Service
	if l.TTY != "" {
		s += " " + l.TTY
	}
	if l.RHost != "" {
		s += " from " + l.RHost
	}
	if s == "" {
		return "login"
	}
	s = strings.TrimSpace(s)
	if l.Claimed {
		s += " (as claimed by " + l.User + ")"
	}
	return s
}

func forWhom(w *wire.WaiterInfo) string {
	switch w.Kind {
	case wire.KindTask:
		return "task " + strconv.FormatUint(w.Task, 10)
	case wire.KindLogin:
		return "the login of " + w.User
	}
	return "npurun of " + w.User
}

func what(w wire.WaiterInfo) string {
	switch w.Kind {
	case wire.KindTask:
		return "task " + strconv.FormatUint(w.Task, 10)
	case wire.KindLogin:
		return "login"
	}
	return "npurun"
}

func wanted(b *wire.Board, w wire.WaiterInfo) string {
	if len(w.Devices) > 0 {
		return wire.Wanted(len(w.Devices), w.Mem, vendorOf(b).Format(w.Devices))
	}
	return wire.Wanted(w.N, w.Mem, "")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// writeColumns writes rows as aligned columns two spaces apart, with
// trailing blanks dropped; column fit (if >= 0) is cut so that each line
// fits width. indent goes before every line.
func writeColumns(out *strings.Builder, rows [][]string, fit, width int, indent ...string) {
	pre := strings.Join(indent, "")
	n := 0
	for _, r := range rows {
		n = max(n, len(r))
	}
	widths := make([]int, n)
	// Cells come from other users (command lines, a session's tty and
	// host): nothing in them may reach the terminal as a control.
	for _, r := range rows {
		for i, c := range r {
			r[i] = printable.String(c)
			widths[i] = max(widths[i], utf8.RuneCountInString(r[i]))
		}
	}
	if fit >= 0 && fit < n && width > 0 {
		others := len(pre)
		for i, w := range widths {
			if i != fit {
				others += w + 2
			}
		}
		widths[fit] = min(widths[fit], max(width-others, 12))
	}
	for _, r := range rows {
		var line strings.Builder
		line.WriteString(pre)
		for i, c := range r {
			if i == fit {
				c = cut(c, widths[i])
			}
			line.WriteString(c)
			if i < len(r)-1 {
				line.WriteString(strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c)+2))
			}
		}
		out.WriteString(strings.TrimRight(line.String(), " "))
		out.WriteByte('\n')
	}
}

// trimLine ends the line being written, without its trailing blanks.
func trimLine(out *strings.Builder) {
	s := strings.TrimRight(out.String(), " ")
	out.Reset()
	out.WriteString(s)
	out.WriteByte('\n')
}

// UsageTable writes a usage report for people.
//
//	USER   KIND    POOL         LEASES  DEVICE-HOURS
//	alice  inline  interactive  12      3.42
//	TOTAL                       12      3.42
//
// Where the broker sampled utilization, BUSY (the device-hours weighted
// by utilization, in percent), IDLE-HOURS (idle device-hours) and
// RECLAIMED (leases the [idle] policy ended) follow:
//
//	USER   KIND    POOL         LEASES  DEVICE-HOURS  BUSY  IDLE-HOURS  RECLAIMED
//	bob    inline  interactive  3       96.00         6%    88.50       2
func UsageTable(rep *wire.UsageReport) string {
	byDevice := rep.By == wire.UsageByDevice
	rows := [][]string{{"USER", "KIND", "POOL", "LEASES", "DEVICE-HOURS"}}
	if byDevice {
		rows = [][]string{{"DEVICE", "POOL", "LEASES", "DEVICE-HOURS"}}
	}
	if rep.Sampled {
		rows[0] = append(rows[0], "BUSY", "IDLE-HOURS", "RECLAIMED")
	}
	leases, hours, idle, reclaimed := 0, 0.0, 0.0, 0
	for _, r := range rep.Rows {
		row := []string{r.User, r.Kind, orDash(r.Pool)}
		if byDevice {
			row = []string{orDash(r.Device), orDash(r.Pool)}
		}
		row = append(row, strconv.Itoa(r.Leases), strconv.FormatFloat(r.DeviceHours, 'f', 2, 64))
		if rep.Sampled {
			row = append(row, percent(r.Busy), strconv.FormatFloat(r.IdleDeviceHours, 'f', 2, 64), strconv.Itoa(r.Reclaimed))
		}
		rows = append(rows, row)
		leases += r.Leases
		hours += r.DeviceHours
		idle += r.IdleDeviceHours
		reclaimed += r.Reclaimed
	}
	total := []string{"TOTAL", "", ""}
	if byDevice {
		total = total[:2]
	}
	total = append(total, strconv.Itoa(leases), strconv.FormatFloat(hours, 'f', 2, 64))
	if rep.Sampled {
		total = append(total, "", strconv.FormatFloat(idle, 'f', 2, 64), strconv.Itoa(reclaimed))
	}
	rows = append(rows, total)
	var out strings.Builder
	fmt.Fprintf(&out, "since %s\n", time.UnixMilli(rep.Since).Format("2006-01-02 15:04"))
	writeColumns(&out, rows, -1, 0)
	return out.String()
}

// shareRows are the rows of device d on a board with shared devices: its
// own row with a MEM column (what its shares declared of what they may),
// or, where it holds shares, one row for each, the first on the device's.
func shareRows(b *wire.Board, d wire.DeviceState, now time.Time) [][]string {
	if len(d.Shares) == 0 {
		row := deviceRow(b, d, now)
		mem := ""
		if d.Capacity > 0 && d.Lease == nil {
			mem = quantity.Size(d.Capacity) + " free"
			if d.External > 0 {
				mem = quantity.Size(max(d.Capacity-d.External, 0)) + " free"
			}
		}
		if d.CapacityUnknown != "" {
			mem = "unknown"
		}
		return [][]string{utilRow(b, d, d.Lease, append(row[:len(row)-1:len(row)-1], mem, row[len(row)-1]), now)}
	}
	var rows [][]string
	for i := range d.Shares {
		l := &d.Shares[i]
		one := d
		one.Shares, one.Lease, one.ReservedFor, one.Since = nil, l, nil, l.Since
		row := deviceRow(b, one, now)
		if i == 0 {
			row[2] = quantity.Count(len(d.Shares), "share", "shares")
			if d.Drain != nil {
				row[2] += ", drained"
			}
		} else {
			row[0], row[1], row[2] = "", "", ""
		}
		mem := quantity.Size(l.Mem)
		if l.Used > 0 || l.Peak > 0 {
			mem += " / " + quantity.Size(l.Used)
		}
		if l.Over {
			mem += "  over!"
		}
		rows = append(rows, utilRow(b, d, l, append(row[:len(row)-1:len(row)-1], mem, row[len(row)-1]), now))
	}
	return rows
}

// utilRow puts the UTIL column in row, the row of device d (and lease
// l, or nil), before its last (SINCE), where the broker samples
// utilization: the device's utilization now and, for a lease, the mean
// of its devices since its start ("97% / 88%"; "-" where unknown), and
// after SINCE, a lease that has been idle since a sample, for how long
// ("idle 26h").
func utilRow(b *wire.Board, d wire.DeviceState, l *wire.LeaseInfo, row []string, now time.Time) []string {
	if b.Util == nil {
		return row
	}
	cell := percent(d.Util)
	if l != nil {
		cell += " / " + percent(l.UtilHeld)
	}
	row = append(row[:len(row)-1:len(row)-1], cell, row[len(row)-1])
	if l != nil && (l.IdleSince > 0 || l.Reclaimed > 0) {
		row = append(row, idleMark(l, now))
	}
	return row
}

// idleMark says of lease l, idle, for how long, and what the [idle]
// policy does about it: "idle 26h", "idle 25h, warned", "idle 25h,
// reclaim at 16:00" (it ends then unless it is used), "idle 26h,
// reclaimed at 16:00" (it is ending).
func idleMark(l *wire.LeaseInfo, now time.Time) string {
	mark := "idle"
	if l.IdleSince > 0 {
		mark += " " + quantity.Approx(now.Sub(time.UnixMilli(l.IdleSince)))
	}
	switch {
	case l.Reclaimed > 0:
		mark += ", reclaimed at " + time.UnixMilli(l.Reclaimed).Format("15:04")
	case l.IdleEnds > 0:
		mark += ", reclaim at " + time.UnixMilli(l.IdleEnds).Format("15:04")
	case l.Warned:
		mark += ", warned"
	}
	return mark
}

// percent is a utilization for people: "97%", "-" where unknown.
func percent(p *float64) string {
	if p == nil {
		return "-"
	}
	return strconv.FormatFloat(*p, 'f', 0, 64) + "%"
}
