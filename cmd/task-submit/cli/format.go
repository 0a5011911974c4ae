package cli

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/npurun/npurun/internal/quantity"
	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/wire"
)

// submitted is submit's --json output.
type submitted struct {
	ID       uint64 `json:"id"`
	Position int    `json:"position,omitempty"`
	Pool     string `json:"pool,omitempty"`
	State    string `json:"state,omitempty"`
	Token    string `json:"token,omitempty"`    // the submission's
	Existing bool   `json:"existing,omitempty"` // the token named this task already: no other was made
	From     uint64 `json:"from,omitempty"`     // requeue: the ended task it was made from
}

// submittedLine is submit's answer: the id, and the place in line when
// the task waits for devices.
func submittedLine(r *wire.Reply) string {
	if r.Position <= 0 {
		if r.Reason != "" { // "started on npu 0", "waits for task 2", "failed: …"
			return fmt.Sprintf("task %d submitted: %s", r.ID, r.Reason)
		}
		return fmt.Sprintf("task %d submitted", r.ID)
	}
	if r.Pool == "" {
		return fmt.Sprintf("task %d queued (%s in line)", r.ID, wire.Ordinal(r.Position))
	}
	return fmt.Sprintf("task %d queued (%s in line in pool %q)", r.ID, wire.Ordinal(r.Position), r.Pool)
}

// writeJSON writes v as one line of JSON.
func writeJSON(w io.Writer, v any) error {
	e := json.NewEncoder(w)
	e.SetEscapeHTML(false)
	return e.Encode(v)
}

// writeTasksJSON writes list --json's array of tasks as writeJSON does,
// byte for byte, with the hand encoder (wire.AppendTaskInfoNoHTML):
// encoding/json's reflection took a third of list --json's time for
// 10,000 tasks.
func writeTasksJSON(w io.Writer, ts []wire.TaskInfo) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	bw.WriteByte('[')
	var b []byte
	for i := range ts {
		if i > 0 {
			bw.WriteByte(',')
		}
		b = wire.AppendTaskInfoNoHTML(b[:0], &ts[i])
		bw.Write(b)
	}
	bw.WriteString("]\n")
	return bw.Flush()
}

// tableWidth is the width list's table is made to fit, by shortening the
// last column.
const tableWidth = 100

// minCommandWidth is the least room the last column gets however wide
// the others are.
const minCommandWidth = 16

const tablePadding = 2

// writeTable writes list's table. all adds the USER column; now decides
// which times are today's.
func writeTable(w io.Writer, ts []wire.TaskInfo, all bool, now time.Time) error {
	return writeTaskRows(w, ts, all, []string{"STATE", "DEVICES", "SUBMITTED", "STARTED"}, func(t *wire.TaskInfo) []string {
		return []string{stateCell(t), deviceCell(t), timeCell(t.Submitted, now), startCell(t, now)}
	})
}

// writeHistory writes list --ended's table: how each task ended, when it
// started and ended. all adds the USER column.
func writeHistory(w io.Writer, ts []wire.TaskInfo, all bool, now time.Time) error {
	return writeTaskRows(w, ts, all, []string{"END", "DEVICES", "STARTED", "ENDED"}, func(t *wire.TaskInfo) []string {
		return []string{endCell(t), deviceCell(t), startedCell(t, now), timeCell(t.Ended, now)}
	})
}

// writeTaskRows writes a table of tasks: ID, USER where all, then the
// columns head names, each task's cells as cells gives them.
func writeTaskRows(w io.Writer, ts []wire.TaskInfo, all bool, head []string, cells func(*wire.TaskInfo) []string) error {
	return writeTaskRowsLast(w, ts, all, head, cells, nil)
}

// writeTaskRowsLast is writeTaskRows with each row's last cell as last
// gives it (the task and its index in ts) instead of its name or command;
// nil for that.
func writeTaskRowsLast(w io.Writer, ts []wire.TaskInfo, all bool, head []string, cells func(*wire.TaskInfo) []string, last func(*wire.TaskInfo, int) string) error {
	first := []string{"ID"}
	if all {
		first = append(first, "USER")
	}
	rows := [][]string{append(first, head...)}
	for i := range ts {
		t := &ts[i]
		row := []string{strconv.FormatUint(t.ID, 10)}
		if all {
			row = append(row, oneLine(t.User))
		}
		rows = append(rows, append(row, cells(t)...))
	}
	return writeRowsLast(w, rows, ts, last)
}

// sortEnded orders a history by end, oldest first (ties by id).
func sortEnded(ts []wire.TaskInfo) {
	slices.SortStableFunc(ts, func(a, b wire.TaskInfo) int {
		return cmp.Or(cmp.Compare(a.Ended, b.Ended), cmp.Compare(a.ID, b.ID))
	})
}

// stateCell is a task's state in list's table: "held" for a task held in
// its place.
func stateCell(t *wire.TaskInfo) string {
	if t.Held {
		return "held"
	}
	return t.State
}

// endCell is how a task ended in the history's table: "done", "exit 3",
// "SIGKILL", "cancelled", "lost", or "ended" where only the accounting
// log remembers it.
func endCell(t *wire.TaskInfo) string {
	switch {
	case t.State == wire.StateDone:
		return "done"
	case t.Exit != nil && t.State == wire.StateFailed:
		return "exit " + strconv.Itoa(*t.Exit)
	case t.Signal != "" && t.State == wire.StateFailed:
		return t.Signal
	}
	return t.State
}

// writeRows writes a table's rows (the first its head), and after each
// the name or command of its task in ts, shortened to fit tableWidth.
// Its columns are as text/tabwriter lays them out (each cell padded to
// its column's widest, in runes, plus tablePadding; the last cell not
// part of a column), written straight out: tabwriter took a fifth of
// list's time for 10,000 tasks. Cells holding what tabwriter reads as
// more than text (tabs, line breaks, its escape byte) go through
// tabwriter itself; list's cells never do (oneLine, valid UTF-8).
func writeRows(w io.Writer, rows [][]string, ts []wire.TaskInfo) error {
	return writeRowsLast(w, rows, ts, nil)
}

// writeRowsLast is writeRows with each row's last cell from last (nil:
// the name or command).
func writeRowsLast(w io.Writer, rows [][]string, ts []wire.TaskInfo, last func(*wire.TaskInfo, int) string) error {
	widths, lasts := layoutRows(rows, ts, last)
	bw := bufio.NewWriterSize(w, 64<<10)
	if !plainCells(rows, lasts) {
		return writeRowsTabwriter(bw, rows, lasts)
	}
	return writeRowsPadded(bw, rows, widths, lasts)
}

// layoutRows is the width of each column of rows as tabwriter makes it,
// and each row's last cell: its task's name or command, shortened to fit.
func layoutRows(rows [][]string, ts []wire.TaskInfo, last func(*wire.TaskInfo, int) string) (widths []int, lasts []string) {
	if last == nil {
		last = func(t *wire.TaskInfo, _ int) string { return nameOrCommand(t) }
	}
	head := rows[0]
	widths = make([]int, len(head))
	// The last column starts where tabwriter will put it: after every
	// other column at its widest, plus the padding.
	start := 0
	for col := range head {
		width := 0
		for _, row := range rows {
			width = max(width, utf8.RuneCountInString(row[col]))
		}
		widths[col] = width + tablePadding
		start += widths[col]
	}
	room := max(tableWidth-start, minCommandWidth)
	lasts = make([]string, len(rows))
	lasts[0] = "NAME/COMMAND"
	for i := 1; i < len(rows); i++ {
		lasts[i] = truncate(last(&ts[i-1], i-1), room)
	}
	return widths, lasts
}

// plainCells tells whether no cell holds a byte text/tabwriter reads as
// other than text: a tab, a line break, its escape byte.
func plainCells(rows [][]string, lasts []string) bool {
	plain := func(s string) bool {
		for i := 0; i < len(s); i++ {
			switch s[i] {
			case '\t', '\v', '\f', '\n', tabwriter.Escape:
				return false
			}
		}
		return true
	}
	for i, row := range rows {
		for _, cell := range row {
			if !plain(cell) {
				return false
			}
		}
		if !plain(lasts[i]) {
			return false
		}
	}
	return true
}

// writeRowsPadded writes rows as tabwriter would, cells padded with
// spaces to widths, each row's last cell after them, into bw.
func writeRowsPadded(bw *bufio.Writer, rows [][]string, widths []int, lasts []string) error {
	const spaces = "                                                                "
	for i, row := range rows {
		for col, cell := range row {
			bw.WriteString(cell)
			for pad := widths[col] - utf8.RuneCountInString(cell); pad > 0; pad -= len(spaces) {
				bw.WriteString(spaces[:min(pad, len(spaces))])
			}
		}
		bw.WriteString(lasts[i])
		bw.WriteByte('\n')
	}
	return bw.Flush()
}

// writeRowsTabwriter is writeRows through text/tabwriter, into bw.
func writeRowsTabwriter(bw *bufio.Writer, rows [][]string, lasts []string) error {
	// tabwriter writes each cell and each pad on its own: buffered.
	tw := tabwriter.NewWriter(bw, 0, 8, tablePadding, ' ', 0)
	for i, row := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", strings.Join(row, "\t"), lasts[i])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return bw.Flush()
}

// nameOrCommand is what list shows of a task: its name if it has one, else
// its command, else "-" (another user's command, hidden).
func nameOrCommand(t *wire.TaskInfo) string {
	switch {
	case t.Name != "":
		return oneLine(t.Name)
	case t.Command != "":
		return oneLine(t.Command)
	}
	return "-"
}

// deviceCell is the devices granted to a task once it has started, else
// what it asked for: "3,5", "2 wanted", "device 9", "devices 2-3", or "-"
// for none; a share's declaration of each after it: "3 (12G)". (The
// client does not know the vendor, so the noun is npu.Unknown's.)
func deviceCell(t *wire.TaskInfo) string {
	cell := strconv.Itoa(max(t.N, 1)) + " wanted"
	switch {
	case t.NoDevice:
		return "-"
	case len(t.Devices) > 0 && t.Started != 0:
		cell = npu.FormatIDs(t.Devices)
	case len(t.Devices) > 0:
		cell = npu.Unknown.Format(t.Devices)
	}
	if t.Mem > 0 {
		cell += " (" + quantity.Size(t.Mem) + ")" // a share of each
	}
	return cell
}

// timeCell is a time in Unix milliseconds as list shows it: the time of
// day when it is today (in now's location), the date and minute otherwise,
// "-" when unset.
func timeCell(ms int64, now time.Time) string {
	if ms == 0 {
		return "-"
	}
	t := time.UnixMilli(ms).In(now.Location())
	if y, m, d := t.Date(); y == now.Year() && m == now.Month() && d == now.Day() {
		return t.Format("15:04:05")
	}
	return t.Format("Jan 02 15:04")
}

// startedCell is when the task started, "never" for one that ended
// without running (its --after task did not succeed, it was cancelled
// while it waited), "-" while it has not.
func startedCell(t *wire.TaskInfo, now time.Time) string {
	if t.NeverRan {
		return "never"
	}
	return timeCell(t.Started, now)
}

// startCell is list's STARTED: when the task started (startedCell); for
// one pending for devices, when it starts at the latest ("by 14:05:00",
// reckoned by the broker from the time limits of what holds and waits
// ahead), or "unknown" where something ahead has no limit.
func startCell(t *wire.TaskInfo, now time.Time) string {
	switch {
	case t.Started != 0 || t.State != wire.StatePending || t.NoDevice:
		return startedCell(t, now)
	case t.Start == 0:
		return "unknown"
	case t.Start <= now.UnixMilli():
		return "now"
	}
	return "by " + timeCell(t.Start, now)
}

// fullTime is a time in Unix milliseconds as show gives it.
func fullTime(ms int64, loc *time.Location) string {
	return time.UnixMilli(ms).In(loc).Format("2006-01-02 15:04:05 MST")
}

// writeShow writes show's "key: value" lines, times in loc; what is not
// known is left out.
func writeShow(w io.Writer, t *wire.TaskInfo, loc *time.Location) error {
	var b strings.Builder
	line := func(key, value string) {
		if value != "" {
			fmt.Fprintf(&b, "%s: %s\n", key, value)
		}
	}
	line("id", strconv.FormatUint(t.ID, 10))
	line("name", quoteIfNeeded(t.Name))
	line("user", t.User)
	line("state", stateCell(t))
	if t.Command == "" {
		line("command", "-")
	} else {
		line("command", quoteIfNeeded(t.Command))
	}
	line("cwd", quoteIfNeeded(t.Cwd))
	if t.NoDevice {
		line("devices", "none (--no-device)")
	} else {
		line("devices", deviceCell(t))
	}
	line("pool", t.Pool)
	if t.Mem > 0 {
		line("memory", quantity.Size(t.Mem)+" declared (a share of each device)")
	}
	if t.OOMRetries > 0 {
		line("oom retries", strconv.Itoa(t.OOMRetries)+" left")
	}
	if t.RetryOf != 0 {
		line("retry of", "task "+strconv.FormatUint(t.RetryOf, 10)+" (out of device memory)")
	}
	line("after", joinIDs(t.After))
	if t.From != 0 {
		line("requeued from", strconv.FormatUint(t.From, 10))
	}
	if t.TimeSec > 0 {
		line("time limit", quantity.Duration(time.Duration(t.TimeSec)*time.Second))
	}
	line("submitted", fullTime(t.Submitted, loc))
	line("token", t.Token)
	switch {
	case t.NeverRan:
		line("started", "never: it ended without running")
	case t.Started != 0:
		line("started", fullTime(t.Started, loc))
	}
	if bf := t.Backfill; bf != nil {
		line("scheduling", wire.Backfilled(bf.EndsBy, bf.Before, bf.Beside, time.Now()))
	}
	if t.Ended != 0 {
		end := fullTime(t.Ended, loc)
		if t.Started != 0 && t.Ended >= t.Started {
			end += " (after " + quantity.Duration(time.Duration(t.Ended-t.Started)*time.Millisecond) + ")"
		}
		line("ended", end)
	}
	if t.Exit != nil {
		line("exit status", strconv.Itoa(*t.Exit))
	}
	if t.Signal != "" {
		line("signal", t.Signal)
	}
	line("reason", quoteIfNeeded(t.Reason))
	if t.CPUMs > 0 {
		line("cpu time", quantity.Duration(time.Duration(t.CPUMs)*time.Millisecond))
	}
	if t.MemPeak > 0 {
		line("memory peak", formatBytes(t.MemPeak))
	}
	if t.Mem > 0 && t.DevPeak > 0 {
		line("device memory peak", quantity.Size(t.DevPeak)+" of "+quantity.Size(t.Mem)+" declared: "+declaration(t.Mem, t.DevPeak))
	}
	line("log", quoteIfNeeded(t.Log))
	if t.Position > 0 {
		line("position", wire.Ordinal(t.Position)+" in line")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// ended reports whether a task has ended, for good.
func ended(t *wire.TaskInfo) bool {
	switch t.State {
	case wire.StatePending, wire.StateBlocked, wire.StateRunning:
		return false
	}
	return true
}

// describeEnd says how a task ended, to follow "task 118 ": "succeeded",
// "failed: exit 3", "failed: killed by SIGKILL (time limit 1h0m0s
// reached)", "cancelled", "lost (…)".
func describeEnd(t *wire.TaskInfo) string {
	how := wire.EndHow(t.Exit, t.Signal, "")
	reason := oneLine(t.Reason)
	switch t.State {
	case wire.StateDone:
		return "succeeded"
	case wire.StateFailed:
		failed := "failed"
		if t.NeverRan && how == "" {
			failed = "failed without running"
		}
		if end := wire.EndHow(t.Exit, t.Signal, reason); end != "" {
			return failed + ": " + end
		}
		return failed
	case wire.StateCancelled, wire.StateLost:
		base := t.State
		var notes []string
		switch {
		case strings.HasPrefix(reason, t.State):
			base = reason // "cancelled by root"
		case reason != "":
			notes = append(notes, reason)
		}
		if how != "" {
			notes = append(notes, how)
		}
		if len(notes) == 0 {
			return base
		}
		return base + " (" + strings.Join(notes, "; ") + ")"
	}
	return "is " + t.State
}

// waitStatus is wait's exit status for an ended task: the task's own
// (128+N for signal N), and 1 for any end but success that would
// otherwise read as 0 (never ran, lost, cancelled yet exited 0).
func waitStatus(t *wire.TaskInfo) int {
	s := t.ExitStatus()
	if s < 0 || s > 255 {
		s = 1
	}
	if s == 0 && t.State != wire.StateDone {
		s = 1
	}
	return s
}

// holdLine is the answer of hold and release, from the task as the
// broker left it.
func holdLine(t *wire.TaskInfo) string {
	switch {
	case t.Held && t.Position > 0:
		return fmt.Sprintf("task %d held (%s in line); 'task-submit release %d' lets it start", t.ID, wire.Ordinal(t.Position), t.ID)
	case t.Held:
		return fmt.Sprintf("task %d held; 'task-submit release %d' lets it start", t.ID, t.ID)
	case t.Position > 0:
		return fmt.Sprintf("task %d released (%s in line)", t.ID, wire.Ordinal(t.Position))
	}
	return fmt.Sprintf("task %d released: %s", t.ID, t.State)
}

// cancelLine is cancel's answer, from the task as the broker left it.
func cancelLine(t *wire.TaskInfo) string {
	switch {
	case t.State == wire.StateRunning || (t.Started != 0 && t.Ended == 0):
		return fmt.Sprintf("task %d: SIGTERM sent; SIGKILL follows after the grace period", t.ID)
	case t.State == wire.StateCancelled && t.Started == 0:
		return fmt.Sprintf("task %d cancelled", t.ID)
	case t.State == wire.StateCancelled:
		return fmt.Sprintf("task %d was already %s", t.ID, describeEnd(t))
	case ended(t):
		return fmt.Sprintf("task %d had already ended: %s", t.ID, describeEnd(t))
	}
	return fmt.Sprintf("task %d is still %s", t.ID, t.State)
}

// truncate shortens s to n characters, the last of them "…".
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// oneLine makes s safe for one line of a terminal: each run of control
// characters (newlines, tabs, escapes) becomes one space.
func oneLine(s string) string {
	if !strings.ContainsFunc(s, unicode.IsControl) {
		return s
	}
	return strings.TrimSpace(strings.Join(strings.FieldsFunc(s, unicode.IsControl), " "))
}

// quoteIfNeeded leaves s as it is unless it holds control characters
// (a multi-line --run, an escape sequence), which it quotes.
func quoteIfNeeded(s string) string {
	if strings.ContainsFunc(s, unicode.IsControl) {
		return strconv.Quote(s)
	}
	return s
}

func joinIDs(ids []uint64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatUint(id, 10)
	}
	return strings.Join(s, ",")
}

// formatBytes writes a size in binary units: "512 B", "3.4 MiB".
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// declaration judges a share's declaration of mem MiB against the peak its
// processes were seen to use: too low if they used more, too high if less
// than half of it.
func declaration(mem, peak int64) string {
	switch {
	case peak > mem:
		return "declared too low (its neighbours' room was used; declare " + quantity.Size(peak+peak/4) + ")"
	case 2*peak < mem:
		return "declared too high (" + quantity.Size(peak+peak/4) + " would do)"
	}
	return "about right"
}
