package policy

import (
	"fmt"
	"strings"
)

// Error is one problem in a configuration file.
type Error struct {
	File string // the file name as given to Parse
	Line int    // 1-based; 0 when unknown
	Key  string // "[pools] queue", "[limits]", or "" for a syntax error
	Msg  string
}

func (e Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem found in a configuration file, in line order.
type Errors []Error

func (es *Errors) Error() string {
	lines := make([]string, len(*es))
	for i, e := range *es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap returns each problem as an error.
func (es *Errors) Unwrap() []error {
	errs := make([]error, len(*es))
	for i, e := range *es {
		errs[i] = e
	}
	return errs
}
