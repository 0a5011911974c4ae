package cli

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/npurun/npurun/tests/harness"
)

// TestFlagErrorsAlike: npurun and task-submit refuse the same mistakes on
// their command lines with the same words (issue 14.5): exit 2, a message
// that names the option, and a hint where one helps; no flag library's
// wording.
func TestFlagErrorsAlike(t *testing.T) {
	b := harness.Bins(t)
	for _, tc := range []struct {
		name             string
		npurun, task     []string
		msg, hint        string // with PROG for the program's name, OPT for the option
		npurunOpt, tsOpt string
	}{
		{"unknown option", []string{"--bogus", "true"}, []string{"--bogus", "--run", "true"},
			"PROG: unknown option --bogus", "PROG: hint: PROG --help lists the options", "", ""},
		{"unknown short option", []string{"-z", "true"}, []string{"-z", "--run", "true"},
			"PROG: unknown option -z", "PROG: hint: PROG --help lists the options", "", ""},
		{"no value", []string{"-n"}, []string{"-n"}, "PROG: option -n needs a value", "", "", ""},
		{"bad count", []string{"-n", "two", "true"}, []string{"-n", "two", "--run", "true"},
			`PROG: bad device count "two" for -n`, "PROG: hint: -n takes a number of devices, such as -n 2", "", ""},
		{"bad duration", []string{"--timeout", "1y", "true"}, []string{"--time", "1y", "--run", "true"},
			`PROG: bad duration "1y" for OPT: unknown unit "y" (d, h, m, s or ms)`,
			"PROG: hint: OPT takes a duration such as 45s, 90m, 6h, 1d or 1d12h", "--timeout", "--time"},
	} {
		for _, prog := range []struct {
			name, bin, opt string
			args           []string
		}{{"npurun", b.Npurun, tc.npurunOpt, tc.npurun}, {"task-submit", b.TaskSubmit, tc.tsOpt, tc.task}} {
			t.Run(tc.name+"/"+prog.name, func(t *testing.T) {
				r := strings.NewReplacer("PROG", prog.name, "OPT", prog.opt)
				code, out := harness.ExitCode(t, exec.Command(prog.bin, prog.args...))
				want := r.Replace(tc.msg) + "\n"
				if tc.hint != "" {
					want += r.Replace(tc.hint) + "\n"
				}
				if code != 2 || out != want {
					t.Errorf("%s %s: exit %d, output\n%q\nwant exit 2, output\n%q", prog.name, strings.Join(prog.args, " "), code, out, want)
				}
			})
		}
	}
}
