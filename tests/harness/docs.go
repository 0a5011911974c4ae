package harness

import (
	"regexp"
)

// DocComment is a comment after an example command: two blanks, then #.
var DocComment = regexp.MustCompile(`\s{2,}#.*$`)
