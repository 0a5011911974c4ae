package npu

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// MaxIDs is the largest number of device ids ParseIDs accepts.
const MaxIDs = 4096

// ParseIDs parses a device list such as "0-3,8,10-11" into ascending unique
// ids. Blanks around parts are ignored; "" gives no ids and no error.
func ParseIDs(s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	seen := make(map[int]bool)
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if strings.HasPrefix(part, "-") {
			return nil, fmt.Errorf("negative device id %q", part)
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := parseID(lo)
		if err != nil {
			if isRange {
				return nil, fmt.Errorf("bad range %q", part)
			}
			return nil, fmt.Errorf("bad device id %q", part)
		}
		b := a
		if isRange {
			if b, err = parseID(hi); err != nil || b < a {
				return nil, fmt.Errorf("bad range %q", part)
			}
		}
		if b-a >= MaxIDs {
			return nil, fmt.Errorf("too many device ids in %q (at most %d)", s, MaxIDs)
		}
		for id := a; id <= b; id++ {
			seen[id] = true
		}
		if len(seen) > MaxIDs {
			return nil, fmt.Errorf("too many device ids in %q (at most %d)", s, MaxIDs)
		}
	}
	ids := make([]int, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// parseID accepts decimal digits only: no sign, no blanks inside.
func parseID(s string) (int, error) {
	s = strings.TrimSpace(s)
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("not a device id: %q", s)
	}
	return strconv.Atoi(s)
}

// FormatIDs formats ids as ParseIDs reads them, with runs compacted to
// ranges: "0-3,8". The input need not be sorted.
func FormatIDs(ids []int) string {
	s := sortedUnique(ids)
	var b strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(s[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(s[j]))
		}
		i = j + 1
	}
	return b.String()
}
