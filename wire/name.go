package wire

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Names that users give and everyone is shown: a task's --name, a
// container's name (told by the runtime, or by a rootless engine's). The
// status table, task-submit list and the broker's log show them as they
// are, so they are checked where they come in, by one rule.

// MaxTaskName and MaxContainerName cap those names, in bytes.
const (
	MaxTaskName      = 200
	MaxContainerName = 256
)

// CheckName tells what is wrong with name, the name of a what (a "task",
// a "container") for a table: at most max bytes of valid UTF-8 without
// control characters (C0, DEL, C1), format characters (bidirectional
// embeddings, overrides and isolates, marks, zero-width ones) or line and
// paragraph separators, any of which would make a table say what it does
// not (text shown in another order, a line that ends mid-row).
func CheckName(what, name string, max int) error {
	if len(name) > max {
		return fmt.Errorf("%s name of %d bytes: at most %d bytes", what, len(name), max)
	}
	if !utf8.ValidString(name) {
		return fmt.Errorf("%s name %q: not UTF-8", what, name)
	}
	for _, r := range name {
		if unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp) {
			return fmt.Errorf("%s name %q: %U is a control or format character (names are printable text)", what, name, r)
		}
	}
	return nil
}
