package quantity

import (
	"strconv"
	"strings"
)

// Sizes of device memory are counted in MiB, the unit vendors' tools report
// (npu-smi's HBM, nvidia-smi's used_memory), and written in binary units:
// 12G is 12 GiB. A size people write is a number with an optional unit — K,
// M, G, T, each alone or followed by "i", "B" or "iB", case aside (12G,
// 12GiB, 512m, 1.5T) — and a bare number is GiB, as in "npurun --mem 12".

// MaxSize bounds a size: 1 PiB, in MiB.
const MaxSize = 1 << 30

var sizeUnits = map[string]float64{"k": 1.0 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}

// ParseSize reads a size written by a person, in MiB: 12G, 512M, 64GiB,
// 1.5T; a bare number is GiB. Its errors are *SizeError. A size below one
// MiB is rounded up to one; zero is refused (a share declares something).
func ParseSize(s string) (int64, error) {
	bad := func(why string) error { return &SizeError{Text: s, Reason: why} }
	if s == "" {
		return 0, bad("empty")
	}
	i := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
		i++
	}
	if i == 0 {
		if s[0] == '-' {
			return 0, bad("negative")
		}
		return 0, bad("a number must come first")
	}
	f, err := strconv.ParseFloat(s[:i], 64)
	if err != nil {
		return 0, bad(strconv.Quote(s[:i]) + " is not a number")
	}
	unit := strings.ToLower(s[i:])
	unit = strings.TrimSuffix(strings.TrimSuffix(unit, "b"), "i")
	if unit == "" {
		unit = "g"
	}
	mul, ok := sizeUnits[unit]
	if !ok || len(s[i:]) > 3 {
		return 0, bad("unknown unit " + strconv.Quote(s[i:]) + " (K, M, G or T)")
	}
	mib := f * mul
	switch {
	case mib == 0:
		return 0, bad("zero")
	case mib > MaxSize:
		return 0, bad("more than 1P")
	case mib < 1:
		return 1, nil
	}
	// Round up: a declaration is never less than was written.
	n := int64(mib)
	if float64(n) < mib {
		n++
	}
	return n, nil
}

// SizeError is a size that could not be read, and why.
type SizeError struct{ Text, Reason string }

func (e *SizeError) Error() string {
	return "bad size " + strconv.Quote(e.Text) + ": " + e.Reason
}

// For is the message with where the text came from: bad size "12X" for
// --mem: unknown unit "X" (K, M, G or T).
func (e *SizeError) For(where string) string {
	return "bad size " + strconv.Quote(e.Text) + " for " + where + ": " + e.Reason
}

// Size writes a size of mib MiB as messages show it: whole GiB as 12G,
// whole MiB below a GiB as 512M, and otherwise GiB to one decimal (9.8G).
// ParseSize reads back what it writes (to the MiB for whole numbers).
func Size(mib int64) string {
	if mib < 0 {
		return "-" + Size(-mib)
	}
	switch {
	case mib%1024 == 0:
		return strconv.FormatInt(mib/1024, 10) + "G"
	case mib < 1024:
		return strconv.FormatInt(mib, 10) + "M"
	}
	// Tenths of a GiB, rounded to the nearest.
	tenths := (mib*10 + 512) / 1024
	if tenths%10 == 0 {
		return strconv.FormatInt(tenths/10, 10) + "G"
	}
	return strconv.FormatInt(tenths/10, 10) + "." + strconv.FormatInt(tenths%10, 10) + "G"
}
