package cli

import (
	"os"
	"strings"
)

// readManPage reads man/task-submit.1 from the repository.
func readManPage() (string, error) {
	b, err := os.ReadFile("../../../man/task-submit.1")
	return string(b), err
}

// manSynopsis is the SYNOPSIS of a man page as plain text, one line per
// .SY … .YS block.
func manSynopsis(page string) []string {
	var out []string
	in := false
	var cur []string
	for _, line := range strings.Split(page, "\n") {
		switch {
		case strings.HasPrefix(line, ".SH "):
			in = strings.TrimSpace(strings.TrimPrefix(line, ".SH ")) == "SYNOPSIS"
		case !in:
		case strings.HasPrefix(line, ".SY "):
			cur = []string{strings.TrimSpace(strings.TrimPrefix(line, ".SY "))}
		case line == ".YS":
			out = append(out, strings.Join(cur, " "))
			cur = nil
		case cur != nil && !strings.HasPrefix(line, "."):
			cur = append(cur, plainRoff(line))
		}
	}
	return out
}

// plainRoff drops font escapes and turns roff's \- into -.
func plainRoff(s string) string {
	return strings.NewReplacer(`\fB`, "", `\fI`, "", `\fR`, "", `\fP`, "", `\-`, "-", `\&`, "", `\c`, "").Replace(s)
}
