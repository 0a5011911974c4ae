package cli

import (
	"regexp"
	"testing"
)

// TestSrunLines: the hand readers of srun's lines say what the regular
// expressions they replace said, on srun's lines and near misses.
func TestSrunLines(t *testing.T) {
	queued := regexp.MustCompile(`^srun: job (\d+) queued and waiting for resources`)
	granted := regexp.MustCompile(`^srun: job (\d+) has been allocated resources`)
	exited := regexp.MustCompile(`^srun: error: \S+: task \d+: Exited with exit code \d+\s*$`)
	refused := regexp.MustCompile(`^srun: error: (Unable to allocate resources|Unable to contact slurm controller|.*Socket timed out|.*Immediate execution impossible)`)
	sub := func(re *regexp.Regexp, line string) string {
		if m := re.FindStringSubmatch(line); m != nil {
			return m[1]
		}
		return ""
	}
	for _, line := range []string{
		"srun: job 48213 queued and waiting for resources\n",
		"srun: job 48213 queued and waiting for resources",
		"srun: job 7 has been allocated resources\n",
		"srun: job  7 has been allocated resources\n",
		"srun: job x7 queued and waiting for resources\n",
		"srun: job 7 queued and waiting\n",
		"srun: job 7\n",
		" srun: job 7 queued and waiting for resources\n",
		"srun: error: n1: task 0: Exited with exit code 3\n",
		"srun: error: n1: task 0: Exited with exit code 3  \n",
		"srun: error: n1: task 0: Exited with exit code 3 x\n",
		"srun: error: n1: task 0: Exited with exit code \n",
		"srun: error: n 1: task 0: Exited with exit code 3\n",
		"srun: error: : task 0: Exited with exit code 3\n",
		"srun: error: n1: task 12: Exited with exit code 255",
		"srun: error: n1: task x: Exited with exit code 255\n",
		"srun: error: Unable to allocate resources: Requested node configuration is not available\n",
		"srun: error: Unable to contact slurm controller (connect failure)\n",
		"srun: error: slurm_receive_msg: Socket timed out on send/recv operation\n",
		"srun: error: Unable to allocate resources: Immediate execution impossible, insufficient priority\n",
		"srun: error: something else\n",
		"srun: error: x\nSocket timed out\n",
		"srun: Unable to allocate resources\n",
		"the command's own line\n",
		"",
	} {
		if got, want := srunQueued(line), sub(queued, line); got != want {
			t.Errorf("srunQueued(%q) = %q, want %q", line, got, want)
		}
		if got, want := srunGranted(line), sub(granted, line); got != want {
			t.Errorf("srunGranted(%q) = %q, want %q", line, got, want)
		}
		if got, want := srunExited(line), exited.MatchString(line); got != want {
			t.Errorf("srunExited(%q) = %v, want %v", line, got, want)
		}
		if got, want := srunRefused(line), refused.MatchString(line); got != want {
			t.Errorf("srunRefused(%q) = %v, want %v", line, got, want)
		}
	}
}
