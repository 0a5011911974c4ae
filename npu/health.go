package npu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Health is what a device's vendor tool says of its health.
type Health struct {
	Unhealthy bool   // the tool says the device is not fit for work
	Words     string // the tool's words, for a drain's reason or the log: "" where it says all is well
}

// Tools names the vendor's programs and files that CheckHealth, Memory
// and ProcessMemory ask.
type Tools struct {
	NPUSmi    string // Ascend: "" means the Inventory's, or npu-smi in PATH
	NVIDIASmi string // NVIDIA: "" means nvidia-smi in PATH
	FakeFile  string // the fake vendor's health file ([devices] fake_health)

	FakeUtilDir string // the fake vendor's utilization files, npuN each ([devices] fake_util)
}

// maxToolOutput bounds what is read of a health tool's answer.
const maxToolOutput = 1 << 20

// maxHealthWords bounds the words kept of a tool's answer for one device.
const maxHealthWords = 400

// CheckHealth asks the vendor's tool about the health of the devices ids
// (physical), within ctx, and returns what it says of each device it
// answered for. A device the tool did not answer for is in errs, by id,
// with why: the tool failed, hung or printed what does not parse. Such a
// device is not taken for unhealthy: a tool that is missing, hung or
// changed its layout must not take every device out of service.
//
//   - Ascend: `npu-smi info -t health -i CARD` for each card (npu-smi's
//     NPU ID: a card of several chips answers for all of them). Its
//     "Health Status" (or "Health") line says OK, Warning, Alarm, Critical
//     ...: OK and Warning are fit for work (a warning is a minor alarm,
//     in the words), anything else is not. The error code and information
//     lines that follow are part of the words.
//   - NVIDIA: one `nvidia-smi --query-gpu=minor_number,...` for all: a GPU
//     with uncorrected volatile ECC errors or a retired page pending is
//     unhealthy; a managed GPU missing from an answer that lists others
//     (nvidia-smi says such a GPU is lost) too.
//   - Fake: the lines "ID STATUS [WORDS...]" of the health file, STATUS
//     read as npu-smi's; a device not in it, or no file, is healthy.
func (inv *Inventory) CheckHealth(ctx context.Context, ids []int, tools Tools) (map[int]Health, map[int]error) {
	switch inv.Vendor {
	case Ascend:
		bin := tools.NPUSmi
		if bin == "" {
			bin = inv.NPUSmi
		}
		if bin == "" {
			bin = "npu-smi"
		}
		return inv.ascendHealth(ctx, ids, bin)
	case NVIDIA:
		bin := tools.NVIDIASmi
		if bin == "" {
			bin = "nvidia-smi"
		}
		out, err := runTool(ctx, bin, nvidiaHealthArgs...)
		got, perr := ParseNVIDIAHealth(out, ids)
		if perr != nil && err == nil {
			err = perr
		}
		return got, allErr(ids, got, err)
	case Fake:
		got, err := ReadFakeHealth(tools.FakeFile, ids)
		return got, allErr(ids, got, err)
	}
	return nil, allErr(ids, nil, fmt.Errorf("no health check for vendor %q", inv.Vendor))
}

// allErr gives err to each id that got has no answer for.
func allErr(ids []int, got map[int]Health, err error) map[int]error {
	if err == nil && len(got) == len(ids) {
		return nil
	}
	errs := map[int]error{}
	for _, id := range ids {
		if _, ok := got[id]; !ok {
			if err == nil {
				err = errors.New("not in the answer")
			}
			errs[id] = err
		}
	}
	return errs
}

// runTool runs a vendor tool within ctx and returns its standard output
// (at most maxToolOutput bytes), with its standard error's first line in
// the error where it fails.
func runTool(ctx context.Context, bin string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	var out, errb limitedBuffer
	out.max, errb.max = maxToolOutput, 4096
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = npuSmiTimeout
	err := cmd.Run()
	what := bin + " " + strings.Join(args, " ")
	switch {
	case ctx.Err() != nil:
		return out.Bytes(), fmt.Errorf("run %s: no answer in time", what)
	case err != nil:
		if first, _, _ := strings.Cut(strings.TrimSpace(errb.String()), "\n"); first != "" {
			return out.Bytes(), fmt.Errorf("run %s: %w: %s", what, err, first)
		}
		return out.Bytes(), fmt.Errorf("run %s: %w", what, err)
	}
	return out.Bytes(), nil
}

// limitedBuffer keeps the first max bytes written to it and drops the
// rest. It has no ReadFrom, which io.Copy would use past Write's cap.
type limitedBuffer struct {
	buf bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *limitedBuffer) Bytes() []byte  { return b.buf.Bytes() }
func (b *limitedBuffer) String() string { return b.buf.String() }

// ascendHealth asks npu-smi about each card of ids, one run per card.
func (inv *Inventory) ascendHealth(ctx context.Context, ids []int, bin string) (map[int]Health, map[int]error) {
	byCard := map[int][]int{}
	var order []int
	for _, id := range ids {
		c, ok := inv.Chips[id]
		card := c.NPU
		if !ok {
			// npu-smi did not say: one chip per card, numbered as the
			// logical ids (Atlas 800T A2 and most 910B boxes).
			if card, ok = inv.Logical[id]; !ok {
				card = id
			}
		}
		if _, seen := byCard[card]; !seen {
			order = append(order, card)
		}
		byCard[card] = append(byCard[card], id)
	}
	got := map[int]Health{}
	errs := map[int]error{}
	for _, card := range order {
		out, err := runTool(ctx, bin, "info", "-t", "health", "-i", strconv.Itoa(card))
		var h Health
		if err == nil {
			h, err = ParseNPUSmiHealth(out)
			if err != nil {
				err = fmt.Errorf("read %s info -t health -i %d: %w", bin, card, err)
			}
		}
		for _, id := range byCard[card] {
			if err != nil {
				errs[id] = err
			} else {
				got[id] = h
			}
		}
	}
	if len(errs) == 0 {
		errs = nil
	}
	return got, errs
}

// ParseNPUSmiHealth reads the answer of `npu-smi info -t health -i N`:
// "Key : Value" lines, of which the health one ("Health Status", or
// "Health" in some drivers) says OK, Warning, Alarm, Critical ... and the
// error code and information lines ("NA" when none) say why.
func ParseNPUSmiHealth(out []byte) (Health, error) {
	var status string
	var words []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		lk := strings.ToLower(key)
		switch {
		case strings.HasPrefix(lk, "health") && status == "":
			status = val
			words = append(words, key+": "+val)
		case strings.HasPrefix(lk, "error") && val != "" && !strings.EqualFold(val, "NA") && !strings.EqualFold(val, "N/A"):
			words = append(words, key+": "+val)
		}
	}
	if err := sc.Err(); err != nil {
		return Health{}, err
	}
	if status == "" {
		return Health{}, errors.New("no \"Health Status : ...\" line in the answer")
	}
	return statusHealth(status, strings.Join(words, "; ")), nil
}

// statusHealth is the health that an npu-smi status word means: OK and
// Warning are fit for work (a Warning keeps its words, for the log),
// anything else (Alarm, Critical, Error, ...) is not.
func statusHealth(status, words string) Health {
	switch strings.ToLower(status) {
	case "ok", "healthy":
		return Health{}
	case "warning":
		return Health{Words: clip(words)}
	}
	return Health{Unhealthy: true, Words: clip(words)}
}

// clip bounds a tool's words to maxHealthWords bytes of one line, on a
// rune boundary, with control characters made spaces.
func clip(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) <= maxHealthWords {
		return s
	}
	n := maxHealthWords
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// nvidiaHealthArgs asks nvidia-smi, for every GPU, its minor number (the
// N of /dev/nvidiaN, the physical id here) and the counters that say it
// is unfit: uncorrected ECC errors since the driver loaded, a retired
// page waiting for a reset.
var nvidiaHealthArgs = []string{"--query-gpu=minor_number,ecc.errors.uncorrected.volatile.total,retired_pages.pending", "--format=csv,noheader,nounits"}

// ParseNVIDIAHealth reads the answer of nvidia-smi's health query
// (nvidiaHealthArgs) for the GPUs ids: one CSV row per GPU; "[N/A]" and
// "[Not Supported]" are no finding. A GPU of ids missing from an answer
// that lists another is unhealthy (nvidia-smi leaves out a GPU it has
// lost); with no rows at all there is no answer.
func ParseNVIDIAHealth(out []byte, ids []int) (map[int]Health, error) {
	rows := map[int][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	var lost []string // lines that are not rows: nvidia-smi's words for a GPU it cannot reach
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) != 3 {
			lost = append(lost, line)
			continue
		}
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		minor, err := strconv.Atoi(f[0])
		if err != nil {
			lost = append(lost, line)
			continue
		}
		rows[minor] = f[1:]
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		if len(lost) > 0 {
			return nil, fmt.Errorf("no GPU in the answer: %s", clip(lost[0]))
		}
		return nil, errors.New("no GPU in the answer")
	}
	got := make(map[int]Health, len(ids))
	for _, id := range ids {
		f, ok := rows[id]
		if !ok {
			w := fmt.Sprintf("nvidia-smi does not list the GPU of /dev/nvidia%d", id)
			if len(lost) > 0 {
				w += ": " + lost[0]
			}
			got[id] = Health{Unhealthy: true, Words: clip(w)}
			continue
		}
		var words []string
		if n, err := strconv.ParseUint(f[0], 10, 64); err == nil && n > 0 {
			words = append(words, fmt.Sprintf("%d uncorrected ECC errors (volatile)", n))
		}
		if strings.EqualFold(f[1], "Yes") {
			words = append(words, "a retired page is pending (reset the GPU)")
		}
		got[id] = Health{Unhealthy: len(words) > 0, Words: clip(strings.Join(words, "; "))}
	}
	return got, nil
}

// ReadFakeHealth reads the fake vendor's health file for ids: lines "ID
// STATUS [WORDS...]", "#" comments and blank lines skipped; STATUS is read
// as npu-smi's (OK, Warning, Alarm, Critical ...). A device not listed is
// healthy, as is every device when the file does not exist.
func ReadFakeHealth(path string, ids []int) (map[int]Health, error) {
	got := make(map[int]Health, len(ids))
	for _, id := range ids {
		got[id] = Health{}
	}
	if path == "" {
		return got, nil
	}
	data, err := readBounded(path)
	if errors.Is(err, os.ErrNotExist) {
		return got, nil
	}
	if err != nil {
		return nil, err
	}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			return nil, fmt.Errorf("%s:%d: want \"ID STATUS [WORDS]\", got %q", path, i+1, line)
		}
		id, err := strconv.Atoi(strings.TrimPrefix(f[0], "npu"))
		if err != nil || id < 0 {
			return nil, fmt.Errorf("%s:%d: bad device id %q", path, i+1, f[0])
		}
		if _, ours := got[id]; !ours {
			continue
		}
		words := "Health Status: " + f[1]
		if len(f) > 2 {
			words += "; " + strings.Join(f[2:], " ")
		}
		got[id] = statusHealth(f[1], words)
	}
	return got, nil
}

// readBounded reads at most maxToolOutput bytes of path.
func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxToolOutput))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return data, nil
}
