// Package quantity writes and reads the durations and counts that people
// see (1d6h, 2h27s, 850ms; 1 device, 2 devices), one way for every command,
// log line and the configuration file. It imports only the standard
// library.
package quantity

import (
	"strconv"
	"strings"
	"time"
)

// It is imported by npurun, whose import graph tests/e2e/cli/lean_test.go keeps
// small: the standard library's strconv, strings, errors and time only.

// Day and Week are the units beyond Go's hours.
const (
	Day  = 24 * time.Hour
	Week = 7 * Day
)

// Duration writes d as every message shows a duration: its units from
// days down to seconds, each that is not zero once, in order — 45s, 3h,
// 2h27s, 1d6h, 1d2h3m4s. From one second up d is rounded to the nearest
// second; below, to the millisecond (850ms), or the microsecond below
// that (250µs). Zero is 0s; a negative d has a leading "-".
func Duration(d time.Duration) string {
	if d < 0 {
		if d == -1<<63 {
			d++ // its absolute value does not fit
		}
		return "-" + Duration(-d)
	}
	switch {
	case d == 0:
		return "0s"
	case d < time.Millisecond:
		return strconv.FormatInt(int64(d.Round(time.Microsecond)/time.Microsecond), 10) + "µs"
	case d < time.Second-time.Millisecond/2:
		return strconv.FormatInt(int64(d.Round(time.Millisecond)/time.Millisecond), 10) + "ms"
	}
	if d < 1<<63-1-time.Second/2 {
		d = d.Round(time.Second)
	}
	var b []byte
	for _, u := range units {
		if n := d / u.size; n > 0 {
			b = strconv.AppendInt(b, int64(n), 10)
			b = append(b, u.name...)
			d -= n * u.size
		}
	}
	return string(b)
}

// Approx writes d as Duration does, cut (not rounded) to what a glance
// needs: seconds below a minute (12s), minutes below an hour (40m), hours
// and minutes below a day (2h13m, 2h), days and hours above (3d4h). For
// tables, where a column of ages is read at a glance. Below a second, and
// for a negative d (a clock stepped back), it is 0s.
func Approx(d time.Duration) string {
	switch {
	case d < time.Second:
		return "0s"
	case d < time.Minute:
		return Duration(d.Truncate(time.Second))
	case d < Day:
		return Duration(d.Truncate(time.Minute))
	}
	return Duration(d.Truncate(time.Hour))
}

var units = []struct {
	name string
	size time.Duration
}{
	{"d", Day}, {"h", time.Hour}, {"m", time.Minute}, {"s", time.Second},
}

// parseUnits are the units ParseDuration takes: Go's (ns to h), then days
// and weeks.
var parseUnits = map[string]time.Duration{
	"ns": time.Nanosecond, "us": time.Microsecond, "µs": time.Microsecond, "μs": time.Microsecond,
	"ms": time.Millisecond, "s": time.Second, "m": time.Minute, "h": time.Hour,
	"d": Day, "w": Week,
}

// DurationHelp is what a message about a bad duration can add: what one
// looks like.
const DurationHelp = "a duration such as 45s, 90m, 6h, 1d or 1d12h"

// ParseDuration reads a duration as every command and the configuration
// take one: numbers, each followed by its unit — d (days), h, m, s, ms,
// and w (weeks), us and ns — summed: 1d12h, 90m, 1.5h, 850ms. "0" alone
// is zero. Nothing negative; nothing over what a time.Duration holds
// (292 years). Its errors are *DurationError.
func ParseDuration(s string) (time.Duration, error) {
	bad := func(why string) error {
		return &DurationError{Text: s, Reason: why}
	}
	if s == "0" {
		return 0, nil
	}
	if s == "" {
		return 0, bad("empty")
	}
	if s[0] == '-' {
		return 0, bad("negative")
	}
	rest, total := strings.TrimPrefix(s, "+"), 0.0 // in nanoseconds, checked at the end
	var sum time.Duration
	exact := true
	for rest != "" {
		i := 0
		for i < len(rest) && (rest[i] >= '0' && rest[i] <= '9' || rest[i] == '.') {
			i++
		}
		if i == 0 {
			return 0, bad("a number must come before " + strconv.Quote(unitAt(rest)))
		}
		j := i
		for j < len(rest) && (rest[j] < '0' || rest[j] > '9') && rest[j] != '.' {
			j++
		}
		if j == i {
			return 0, bad("no unit after " + rest[:i] + " (d, h, m, s or ms)")
		}
		num, unitName := rest[:i], rest[i:j]
		unit, ok := parseUnits[unitName]
		if !ok {
			return 0, bad("unknown unit " + strconv.Quote(unitName) + " (d, h, m, s or ms)")
		}
		f, err := strconv.ParseFloat(num, 64)
		if err != nil {
			return 0, bad(strconv.Quote(num) + " is not a number")
		}
		total += f * float64(unit)
		if n, err := strconv.ParseInt(num, 10, 64); err == nil && exact {
			// Whole numbers are summed exactly, as long as they fit.
			if n > (1<<63-1)/int64(unit) || sum > time.Duration(1<<63-1)-time.Duration(n)*unit {
				exact = false
			} else {
				sum += time.Duration(n) * unit
			}
		} else {
			exact = false
		}
		rest = rest[j:]
	}
	if exact {
		return sum, nil
	}
	if total >= 1<<63 {
		return 0, bad("longer than 292 years")
	}
	return time.Duration(total), nil
}

// unitAt is the word of letters at the start of s, for a message.
func unitAt(s string) string {
	for i, r := range s {
		if r >= '0' && r <= '9' || r == '.' {
			return s[:i]
		}
	}
	return s
}

// DurationError is a duration that could not be read, and why.
type DurationError struct{ Text, Reason string }

func (e *DurationError) Error() string {
	return "bad duration " + strconv.Quote(e.Text) + ": " + e.Reason
}

// For is the message with where the text came from: bad duration "1x"
// for --timeout: unknown unit "x" (d, h, m, s or ms).
func (e *DurationError) For(where string) string {
	return "bad duration " + strconv.Quote(e.Text) + " for " + where + ": " + e.Reason
}

// Count writes n with its noun, one for 1 and many otherwise: 1 device,
// 2 devices, 0 devices, 1 process, 3 processes.
func Count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// List writes items after their noun, one for a single item and many
// otherwise: uid 1011, uids 1011, 1012.
func List[T ~int | ~int32 | ~int64 | ~uint32 | ~uint64](one, many string, items []T) string {
	b := []byte(many)
	if len(items) == 1 {
		b = []byte(one)
	}
	for i, it := range items {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(it), 10)
	}
	return string(b)
}
