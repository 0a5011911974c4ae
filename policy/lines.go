package policy

import (
	"strconv"
	"strings"
)

// lineIndex maps table and key paths to the line that defines them. The
// toml library does not expose key positions, and our file is flat, so a
// scan of header lines and `key =` lines is enough.
type lineIndex map[string]int

func pathKey(path []string) string { return strings.Join(path, "\x00") }

func newLineIndex(data []byte) lineIndex {
	idx := make(lineIndex)
	var table []string
	record := func(path []string, line int) {
		for i := 1; i <= len(path); i++ {
			k := pathKey(path[:i])
			if _, ok := idx[k]; !ok {
				idx[k] = line
			}
		}
	}
	for i, line := range strings.Split(string(data), "\n") {
		n := i + 1
		line = strings.TrimSpace(line)
		switch {
		case line == "" || line[0] == '#':
			continue
		case strings.HasPrefix(line, "[["):
			end := strings.Index(line, "]]")
			if end < 0 {
				continue
			}
			table = splitKey(line[2:end])
			record(table, n)
		case line[0] == '[':
			end := closingBracket(line)
			if end < 0 {
				continue
			}
			table = splitKey(line[1:end])
			record(table, n)
		default:
			eq := strings.Index(line, "=")
			if eq <= 0 {
				continue
			}
			key := splitKey(line[:eq])
			if key == nil {
				continue
			}
			record(append(append([]string(nil), table...), key...), n)
		}
	}
	return idx
}

// line returns the line of path, or of its closest defined parent, or 0.
func (idx lineIndex) line(path ...string) int {
	for i := len(path); i > 0; i-- {
		if n, ok := idx[pathKey(path[:i])]; ok {
			return n
		}
	}
	return 0
}

// closingBracket finds the ] that ends a table header, skipping quotes.
func closingBracket(s string) int {
	var quote byte
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == '\\' && quote == '"' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == ']':
			return i
		}
	}
	return -1
}

// splitKey splits a dotted TOML key into its parts, unquoting quoted ones.
// It returns nil for what is not a key.
func splitKey(s string) []string {
	var parts []string
	for s = strings.TrimSpace(s); ; {
		if s == "" {
			return nil
		}
		var part string
		switch s[0] {
		case '"', '\'':
			end := strings.IndexByte(s[1:], s[0])
			if end < 0 {
				return nil
			}
			part = s[1 : end+1]
			if s[0] == '"' {
				if u, err := strconv.Unquote(s[:end+2]); err == nil {
					part = u
				}
			}
			s = strings.TrimSpace(s[end+2:])
		default:
			end := strings.IndexByte(s, '.')
			if end < 0 {
				end = len(s)
			}
			part = strings.TrimSpace(s[:end])
			s = s[end:]
			if part == "" || strings.ContainsAny(part, " \t\"'") {
				return nil
			}
		}
		parts = append(parts, part)
		if s == "" {
			return parts
		}
		if s[0] != '.' {
			return nil
		}
		s = strings.TrimSpace(s[1:])
	}
}
