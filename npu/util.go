package npu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Util is what the vendor's tool says a device is doing: its compute
// utilization, in percent, and its memory in use and in all, in MiB
// (-1 where the tool does not say).
type Util struct {
	Percent  float64
	MemUsed  int64
	MemTotal int64
}

// ErrNoTool is the vendor's tool missing: there is nothing to ask, as
// opposed to a tool that fails.
var ErrNoTool = errors.New("no such tool")

// noTool marks err, from running bin, ErrNoTool where bin is not there.
func noTool(err error) error {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %v", ErrNoTool, err)
	}
	return err
}

// Utilization reads the compute utilization and memory of the devices
// ids (physical), within ctx: the one round a sample takes. A device the
// tool did not answer for is in errs, by id, with why (the tool failed,
// hung, or printed what does not parse): its utilization is unknown.
//
//   - Ascend: `npu-smi info -t usages -i CARD -c CHIP` for each device,
//     its chip as npu-smi's chip map names it (ParseNPUSmiUsages).
//   - NVIDIA: one `nvidia-smi --query-gpu=minor_number,utilization.gpu,
//     memory.used,memory.total --format=csv,noheader,nounits` for all
//     (ParseGPUUtil).
//   - Fake: the file npuN in tools.FakeUtilDir for device N
//     (ReadFakeUtil); no directory configured: errs says so for all.
//
// Where the vendor's tool is not there at all, every device's error is
// ErrNoTool.
func (inv *Inventory) Utilization(ctx context.Context, ids []int, tools Tools) (map[int]Util, map[int]error) {
	got := map[int]Util{}
	errs := map[int]error{}
	fail := func(err error) {
		for _, id := range ids {
			if _, ok := got[id]; !ok {
				if _, ok := errs[id]; !ok {
					errs[id] = err
				}
			}
		}
	}
	switch inv.Vendor {
	case Ascend:
		bin := inv.npuSmi(tools)
		for _, id := range ids {
			card, chip := inv.chipOf(id)
			args := []string{"info", "-t", "usages", "-i", strconv.Itoa(card), "-c", strconv.Itoa(chip)}
			out, err := runTool(ctx, bin, args...)
			if err = noTool(err); errors.Is(err, ErrNoTool) {
				fail(err)
				break
			}
			if err == nil {
				var u Util
				if u, err = ParseNPUSmiUsages(out); err == nil {
					got[id] = u
					continue
				}
				err = fmt.Errorf("read %s %s: %w", bin, strings.Join(args, " "), err)
			}
			errs[id] = err
			if ctx.Err() != nil {
				fail(err) // the round's time is up: the others are unknown too
				break
			}
		}
	case NVIDIA:
		bin := tools.nvidiaSmi()
		out, err := runTool(ctx, bin, "--query-gpu=minor_number,utilization.gpu,memory.used,memory.total", "--format=csv,noheader,nounits")
		if err != nil {
			fail(noTool(err))
			break
		}
		all, bad := ParseGPUUtil(out)
		for _, id := range ids {
			switch u, ok := all[id]; {
			case ok:
				got[id] = u
			case bad[id] != "":
				errs[id] = fmt.Errorf("%s says %q for its utilization", bin, bad[id])
			default:
				errs[id] = fmt.Errorf("gpu %d is not in %s's answer", id, bin)
			}
		}
	case Fake:
		if tools.FakeUtilDir == "" {
			fail(errors.New("no utilization for the fake vendor without [devices] fake_util"))
			break
		}
		for _, id := range ids {
			u, err := ReadFakeUtil(filepath.Join(tools.FakeUtilDir, "npu"+strconv.Itoa(id)))
			if err != nil {
				errs[id] = err
			} else {
				got[id] = u
			}
		}
	default:
		fail(fmt.Errorf("no utilization for vendor %q", inv.Vendor))
	}
	return got, errs
}

// chipOf is the card and chip npu-smi names physical device id by: from
// npu-smi info -m's chip map where it said, else (one chip a card, as the
// 910B's) the logical id's card, chip 0, as the health checks ask.
func (inv *Inventory) chipOf(id int) (card, chip int) {
	if c, ok := inv.Chips[id]; ok {
		return c.NPU, c.Chip
	}
	if l, ok := inv.Logical[id]; ok {
		return l, 0
	}
	return id, 0
}

// The keys of npu-smi info -t usages that say a chip's compute
// utilization, by driver: the AI cores' (and vector cores'), and the
// whole chip's where newer drivers print it. A chip is as busy as the
// busiest of those it prints.
var npuSmiComputeKeys = []string{
	"aicore usage rate(%)", "ai core usage rate(%)", "aicore usage rate (%)",
	"aivector usage rate(%)", "ai vector usage rate(%)",
	"npu utilization(%)", "npu real-time utilization(%)", "chip usage rate(%)",
}

// ParseNPUSmiUsages reads the answer of `npu-smi info -t usages -i CARD
// -c CHIP`: "Key : value" lines, the keys padded, their names as the
// driver has them (vendor-utilization.md lists those seen). The compute
// utilization is the highest of the AI core, AI vector and whole-chip
// figures printed (Aicore Usage Rate(%), AI Core Usage Rate(%), AICore
// Usage Rate(%), Aivector Usage Rate(%), NPU Utilization(%), NPU
// Real-time Utilization(%), Chip Usage Rate(%)): an answer with none of
// them does not parse. Memory is HBM where the chip has it (HBM Usage(MB)
// or HBM Used(MB), else HBM Usage Rate(%) of HBM Capacity(MB)), else
// Memory Usage Rate(%) of Memory Capacity(MB), else DDR (DDR Usage
// Rate(%) or Memory Usage Rate(%) of DDR Capacity(MB)), as the 310
// series prints it; -1 where it does not say. Values such as "NA" count as not printed.
func ParseNPUSmiUsages(out []byte) (Util, error) {
	vals := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		key = strings.ToLower(strings.Join(strings.Fields(key), " "))
		v, ok := parsePercent(strings.TrimSpace(val), math.Inf(1))
		if !ok {
			continue
		}
		vals[key] = v
	}
	if err := sc.Err(); err != nil {
		return Util{}, err
	}
	u := Util{Percent: -1, MemUsed: -1, MemTotal: -1}
	for _, k := range npuSmiComputeKeys {
		if v, ok := vals[k]; ok && v > u.Percent {
			u.Percent = v
		}
	}
	if u.Percent < 0 {
		return Util{}, errors.New("no compute utilization (Aicore Usage Rate(%), NPU Utilization(%) or the like) in the answer")
	}
	u.Percent = min(u.Percent, 100)
	mem := func(capacity string, used []string, rates []string) bool {
		total, ok := vals[capacity]
		if !ok || total <= 0 {
			return false
		}
		u.MemTotal = int64(total)
		for _, k := range used {
			if v, ok := vals[k]; ok {
				u.MemUsed = int64(v)
				return true
			}
		}
		for _, k := range rates {
			if v, ok := vals[k]; ok {
				u.MemUsed = int64(math.Round(total * min(v, 100) / 100))
				return true
			}
		}
		return true
	}
	_ = mem("hbm capacity(mb)", []string{"hbm usage(mb)", "hbm used(mb)"}, []string{"hbm usage rate(%)"}) ||
		mem("memory capacity(mb)", []string{"memory usage(mb)", "memory used(mb)"}, []string{"memory usage rate(%)"}) ||
		mem("ddr capacity(mb)", []string{"ddr usage(mb)", "ddr used(mb)"}, []string{"ddr usage rate(%)", "memory usage rate(%)"})
	return u, nil
}

// ParseGPUUtil reads nvidia-smi --query-gpu=minor_number,utilization.gpu,
// memory.used,memory.total --format=csv,noheader,nounits: "0, 97, 30120,
// 81559" a line, by minor number (the physical id). A GPU whose
// utilization is "[N/A]" or "[Not Supported]" (some parts, MIG mode) is
// in bad with what was printed; memory so printed is -1.
func ParseGPUUtil(out []byte) (got map[int]Util, bad map[int]string) {
	got, bad = map[int]Util{}, map[int]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ",")
		if len(f) != 4 {
			continue
		}
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		id, err := strconv.Atoi(f[0])
		if err != nil || id < 0 {
			continue
		}
		pct, ok := parsePercent(f[1], 100)
		if !ok {
			bad[id] = f[1]
			continue
		}
		u := Util{Percent: pct, MemUsed: -1, MemTotal: -1}
		if n, err := strconv.ParseInt(f[2], 10, 64); err == nil && n >= 0 {
			u.MemUsed = n
		}
		if n, err := strconv.ParseInt(f[3], 10, 64); err == nil && n > 0 {
			u.MemTotal = n
		}
		got[id] = u
	}
	return got, bad
}

// maxFakeUtil bounds what is read of a fake utilization file.
const maxFakeUtil = 4096

// ReadFakeUtil reads a fake vendor's utilization file: one line "UTIL"
// or "UTIL USED TOTAL", the utilization in percent, the memory in MiB,
// as the tests write it. A missing file, or one that does not parse, is
// an error: the device's utilization is unknown.
func ReadFakeUtil(path string) (Util, error) {
	// Not a link, and not a FIFO the sampler would wait on for ever.
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return Util{}, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return Util{}, fmt.Errorf("%s: not a regular file", path)
	}
	var ok bool
	buf := make([]byte, maxFakeUtil)
	n, _ := f.Read(buf)
	line, _, _ := strings.Cut(string(buf[:n]), "\n")
	fields := strings.Fields(line)
	u := Util{MemUsed: -1, MemTotal: -1}
	bad := func() (Util, error) { return Util{}, fmt.Errorf("%s: want \"UTIL [USED TOTAL]\", got %q", path, line) }
	if len(fields) != 1 && len(fields) != 3 {
		return bad()
	}
	if u.Percent, ok = parsePercent(fields[0], 100); !ok {
		return bad()
	}
	if len(fields) == 3 {
		used, err1 := strconv.ParseInt(fields[1], 10, 64)
		total, err2 := strconv.ParseInt(fields[2], 10, 64)
		if err1 != nil || err2 != nil || used < 0 || total <= 0 {
			return bad()
		}
		u.MemUsed, u.MemTotal = used, total
	}
	return u, nil
}

// parsePercent reads a figure of the tools (a trailing "%" allowed): a
// number from 0 to max, never NaN (strconv takes "nan", and a NaN would
// reach status's JSON, which cannot encode it). One reading for npu-smi,
// nvidia-smi and the fake vendor's files.
func parsePercent(s string, max float64) (float64, bool) {
	v, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
	if err != nil || math.IsNaN(v) || v < 0 || v > max {
		return 0, false
	}
	return v, true
}
