// Package printable makes text that came from users safe to show on a
// terminal or in a log line. It owns one function, String; it imports only
// the standard library and must never depend on the project's other packages.
package printable

import (
	"strings"
	"unicode/utf8"
)

// String replaces control characters (C0, DEL, C1) and bytes that are
// not UTF-8 with '?', so that a user's command line or session origin
// cannot move the reader's cursor or change their terminal. The status
// table's cells and every line of the broker's log go through it.
func String(s string) string {
	clean := true
	for _, r := range s {
		if unsafe(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if unsafe(r) {
			r = '?'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// unsafe says whether r may not be shown as it is: a control character
// (C0, DEL, C1) or the replacement for a byte that is not UTF-8.
func unsafe(r rune) bool {
	return r < 0x20 || r >= 0x7f && r < 0xa0 || r == utf8.RuneError
}
