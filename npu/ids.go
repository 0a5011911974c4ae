package npu

import (
	"errors"
	"strconv"
	"strings"
)

// MaxIDs bounds how many device ids one list may name.
const MaxIDs = 4096

// ParseIDs reads a device list in the configuration file's syntax: ids and
// ranges separated by commas, such as "0-3,8". The result is ascending and
// without repeats. It accepts what the policy package accepts for [devices]
// ids (that package keeps its own copy: it imports nothing of the project);
// an empty list is an error here.
func ParseIDs(s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("no device ids")
	}
	seen := make(map[int]bool)
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			return nil, errors.New("empty item between commas")
		}
		if strings.HasPrefix(part, "-") {
			return nil, errors.New("negative device id " + strconv.Quote(part))
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, okA := atoi(lo)
		b, okB := a, true
		if isRange {
			b, okB = atoi(hi)
		}
		switch {
		case !isRange && !okA:
			return nil, errors.New(strconv.Quote(part) + " is not a device id")
		case isRange && (!okA || !okB):
			return nil, errors.New(strconv.Quote(part) + " is not a range of device ids")
		case b < a:
			return nil, errors.New("range " + strconv.Quote(part) + " runs backwards")
		case b-a >= MaxIDs:
			return nil, errors.New("more than " + strconv.Itoa(MaxIDs) + " device ids")
		}
		for id := a; id <= b; id++ {
			seen[id] = true
		}
		if len(seen) > MaxIDs {
			return nil, errors.New("more than " + strconv.Itoa(MaxIDs) + " device ids")
		}
	}
	ids := make([]int, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	return sortedUnique(ids), nil
}

// atoi reads a non-negative decimal number, spaces around it allowed.
func atoi(s string) (int, bool) {
	s = strings.TrimSpace(s)
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// FormatIDs formats ids as the configuration file writes them, with runs
// compacted to ranges: "0-3,8". The input need not be sorted. This is the
// list inside every device list shown to people; Vendor.Format adds the
// noun.
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

// JoinIDs writes ids as they are, in their order, separated by commas and
// without ranges: "2,0,1". This is the syntax of the variables that select
// devices (NPURUN_DEVICES, CUDA_VISIBLE_DEVICES, ASCEND_RT_VISIBLE_DEVICES),
// where the order is the numbering the program sees, and of the container
// handover's reply. FormatIDs is the one for people.
func JoinIDs(ids []int) string {
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(id))
	}
	return b.String()
}

// Unknown is the vendor of a device list whose vendor a client cannot
// know (before the broker's grant tells it).
const Unknown Vendor = ""

// Noun is what people call one of the vendor's devices: "gpu" for NVIDIA,
// "npu" for Ascend and the test vendor, "device" when the vendor is not
// known.
func (v Vendor) Noun() string {
	switch v {
	case NVIDIA:
		return "gpu"
	case Ascend, Fake:
		return "npu"
	}
	return "device"
}

// Format writes a device list for people, the one way every message of
// npurun, task-submit and npubroker shows one: "npu 0-3,5", "gpu 2",
// "devices 0-3,5" (vendor not known).
func (v Vendor) Format(ids []int) string {
	noun := v.Noun()
	if noun == "device" && len(sortedUnique(ids)) != 1 {
		noun = "devices"
	}
	return noun + " " + FormatIDs(ids)
}
