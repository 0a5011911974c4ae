package npu

import (
	"bufio"
	"bytes"
	"context"
	"os/exec"
	"strconv"
	"strings"
)

// Memory is each device's memory in MiB as the vendor's tool tells it
// (nvidia-smi --query-gpu=index,memory.total); nil where it cannot say
// (the fake vendor, a tool missing or failing, Ascend: [share] capacity
// says). It is asked once, at the broker's start, for shared devices.
func Memory(v Vendor, npuSmi string, ids []int) map[int]int64 {
	if v != NVIDIA {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), npuSmiTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nvidia-smi", "--query-gpu=index,memory.total", "--format=csv,noheader,nounits").Output()
	if err != nil {
		return nil
	}
	return ParseGPUMemory(out)
}

// ParseGPUMemory reads nvidia-smi --query-gpu=index,memory.total
// --format=csv,noheader,nounits: "0, 81559" a line, MiB.
func ParseGPUMemory(out []byte) map[int]int64 {
	m := map[int]int64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		a, b, ok := strings.Cut(sc.Text(), ",")
		if !ok {
			continue
		}
		id, err1 := strconv.Atoi(strings.TrimSpace(a))
		mib, err2 := strconv.ParseInt(strings.TrimSpace(b), 10, 64)
		if err1 == nil && err2 == nil && id >= 0 && mib > 0 {
			m[id] = mib
		}
	}
	return m
}
