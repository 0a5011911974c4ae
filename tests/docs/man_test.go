package docs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// manPages are the man pages whose SYNOPSIS is a command's usage, and how
// that command prints it.
func manPages(t testing.TB, b *harness.Binaries) []struct {
	page, bin  string
	helpStderr bool     // where --help prints its usage
	moreHelp   []string // other invocations whose flags the page documents
} {
	return []struct {
		page, bin  string
		helpStderr bool
		moreHelp   []string
	}{
		{page: "npurun.1", bin: b.Npurun, helpStderr: true},
		{page: "npubroker.8", bin: b.Broker, helpStderr: false, moreHelp: []string{"serve", "check-config", "status", "usage", "drain", "undrain"}},
		{page: "spank_npurun.8", bin: b.Slurm, helpStderr: true},
		{page: "npuboard.8", bin: harness.Npuboard(t), helpStderr: true},
	}
}

// manHelp runs bin with args and --help and returns what it printed on the
// stream the usage goes to, requiring status 0 and nothing on the other.
func manHelp(t *testing.T, bin string, toStderr bool, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, append(args, "--help")...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s --help: %v\n%s%s", filepath.Base(bin), strings.Join(args, " "), err, &stdout, &stderr)
	}
	help, other := stdout.String(), stderr.String()
	if toStderr {
		help, other = other, help
	}
	if other != "" {
		t.Errorf("%s --help printed on the wrong stream: %q", filepath.Base(bin), other)
	}
	return help
}

// TestManSynopsis: each page's SYNOPSIS lines are the usage lines of the
// command's --help, word for word, in order, and no more.
func TestManSynopsis(t *testing.T) {
	b := harness.Bins(t)
	for _, p := range manPages(t, b) {
		t.Run(p.page, func(t *testing.T) {
			src := manRead(t, p.page)
			got := manSynopsis(src)
			want := manUsage(manHelp(t, p.bin, p.helpStderr))
			if len(want) == 0 {
				t.Fatalf("no usage lines in %s --help", filepath.Base(p.bin))
			}
			if !slices.Equal(got, want) {
				t.Errorf("SYNOPSIS of %s does not match --help\npage:\n  %s\n--help:\n  %s",
					p.page, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
			}
		})
	}
}

// TestManOptions: every long option that --help lists is documented in
// the page.
func TestManOptions(t *testing.T) {
	b := harness.Bins(t)
	flag := regexp.MustCompile(`--[a-z][a-z0-9-]*`)
	for _, p := range manPages(t, b) {
		t.Run(p.page, func(t *testing.T) {
			text := manPlain(manRead(t, p.page))
			help := manHelp(t, p.bin, p.helpStderr)
			for _, sub := range p.moreHelp {
				// Subcommands print their usage on standard error.
				help += manHelp(t, p.bin, true, sub)
			}
			for _, f := range slices.Compact(slices.Sorted(slices.Values(flag.FindAllString(help, -1)))) {
				if !strings.Contains(text, f) {
					t.Errorf("%s does not document %s", p.page, f)
				}
			}
		})
	}
}

// TestManRenders: each page formats without a warning, where groff is
// installed.
func TestManRenders(t *testing.T) {
	if _, err := exec.LookPath("groff"); err != nil {
		t.Skip("groff not installed")
	}
	pages, err := filepath.Glob(filepath.Join(harness.Root(), "man", "*.[1-8]"))
	if err != nil || len(pages) == 0 {
		t.Fatalf("no man pages found: %v", err)
	}
	for _, page := range pages {
		t.Run(filepath.Base(page), func(t *testing.T) {
			out, err := exec.Command("groff", "-man", "-ww", "-z", page).CombinedOutput()
			if err != nil || len(out) > 0 {
				t.Errorf("groff -man -ww -z %s: %v\n%s", page, err, out)
			}
		})
	}
}

func manRead(t *testing.T, page string) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(harness.Root(), "man", page))
	if err != nil {
		t.Fatal(err)
	}
	return string(src)
}

// manUsage returns the lines under "Usage:" in help, up to the first blank
// line, with blanks collapsed.
func manUsage(help string) []string {
	var lines []string
	in := false
	for _, l := range strings.Split(help, "\n") {
		switch {
		case strings.TrimSpace(l) == "Usage:":
			in = true
		case in && strings.TrimSpace(l) == "":
			return lines
		case in:
			lines = append(lines, strings.Join(strings.Fields(l), " "))
		}
	}
	return lines
}

// manSynopsis returns the lines of a page's SYNOPSIS section as they read
// once formatted: one per .SY block, per line broken by .br, .PP and the
// like, or per text line in no-fill mode.
func manSynopsis(src string) []string {
	var (
		lines  []string
		cur    []string
		in     bool
		nofill bool
	)
	flush := func() {
		if s := manPlain(strings.Join(cur, " ")); s != "" {
			lines = append(lines, s)
		}
		cur = nil
	}
	for _, l := range strings.Split(src, "\n") {
		if strings.HasPrefix(l, ".SH") || strings.HasPrefix(l, ".SS") {
			if in {
				break
			}
			in = strings.Contains(l, "SYNOPSIS")
			continue
		}
		if !in || strings.HasPrefix(l, `.\"`) {
			continue
		}
		if !strings.HasPrefix(l, ".") {
			if strings.HasSuffix(l, `\c`) {
				l = strings.TrimSuffix(l, `\c`) + "\x00" // joined to the next without a blank
			}
			cur = append(cur, l)
			if nofill {
				flush()
			}
			continue
		}
		macro, args, _ := strings.Cut(l[1:], " ")
		switch macro {
		case "SY":
			flush()
			cur = append(cur, args)
		case "YS", "br", "PP", "P", "LP", "sp":
			flush()
		case "nf":
			flush()
			nofill = true
		case "fi":
			flush()
			nofill = false
		case "B", "I", "SM", "SB":
			cur = append(cur, strings.Join(manArgs(args), " "))
		case "BR", "RB", "BI", "IB", "IR", "RI":
			cur = append(cur, strings.Join(manArgs(args), ""))
		}
		if nofill && len(cur) > 0 && macro != "SY" {
			flush()
		}
	}
	flush()
	return lines
}

// manArgs splits a macro's arguments as roff does: by blanks, with double
// quotes grouping.
func manArgs(s string) []string {
	var args []string
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		if s[0] == '"' {
			end := strings.Index(s[1:], `"`)
			if end < 0 {
				return append(args, s[1:])
			}
			args = append(args, s[1:end+1])
			s = s[end+2:]
			continue
		}
		end := strings.IndexAny(s, " \t")
		if end < 0 {
			end = len(s)
		}
		args = append(args, s[:end])
		s = s[end:]
	}
	return args
}

var manEscapes = strings.NewReplacer(
	`\fB`, "", `\fI`, "", `\fR`, "", `\fP`, "",
	`\-`, "-", `\&`, "", `\|`, "", `\^`, "", `\(dq`, `"`, `\(aq`, "'",
	`\e`, `\`, `\ `, " ",
)

// manPlain strips the roff escapes of text and collapses its blanks.
func manPlain(text string) string {
	text = strings.ReplaceAll(text, "\x00 ", "")
	text = strings.ReplaceAll(text, "\x00", "")
	return strings.Join(strings.Fields(manEscapes.Replace(text)), " ")
}

// TestManExitStatus: npurun(1), task-submit(1) and npubroker(8) list
// under EXIT STATUS the statuses of the one table the three programs
// share (package exitcode), each those it can give, and no other; and
// each page says the table is shared (issue 27.9).
func TestManExitStatus(t *testing.T) {
	for _, tc := range []struct {
		page string
		want []string
	}{
		{"npurun.1", []string{"1", "2", "69", "75", "77", "126", "127"}},
		{"task-submit.1", []string{"0", "1", "2", "3", "69", "75", "77"}},
		{"npubroker.8", []string{"0", "1", "2", "75", "77", "69"}},
	} {
		data, err := os.ReadFile(filepath.Join(harness.Root(), "man", tc.page))
		if err != nil {
			t.Fatal(err)
		}
		sec := string(data)
		start := strings.Index(sec, "\n.SH EXIT STATUS\n")
		if start < 0 {
			t.Errorf("%s: no EXIT STATUS", tc.page)
			continue
		}
		sec = sec[start+1:]
		if end := strings.Index(sec[1:], "\n.SH "); end >= 0 {
			sec = sec[:end+1]
		}
		got := regexp.MustCompile(`(?m)^\.TP\n\.B (\d+)$`).FindAllStringSubmatch(sec, -1)
		var codes []string
		for _, m := range got {
			codes = append(codes, m[1])
		}
		if !slices.Equal(codes, tc.want) {
			t.Errorf("%s: EXIT STATUS lists %v, want %v", tc.page, codes, tc.want)
		}
		if !strings.Contains(sec, "These values are one table for") {
			t.Errorf("%s: EXIT STATUS does not say the table is shared", tc.page)
		}
	}
}
