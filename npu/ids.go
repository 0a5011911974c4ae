package npu

import (
	"strconv"
	"strings"
)

// FormatIDs formats ids as the configuration file writes them, with runs
// compacted to ranges: "0-3,8". The input need not be sorted.
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
