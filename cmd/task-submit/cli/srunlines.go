package cli

import "strings"

// srun's own lines about the job, read by hand: as package-level
// regular expressions they were compiled at every task-submit start,
// submissions included, for the one command (__npurun) that reads them.

// srunJob is the job id of srun's line "srun: job ID" + what, as
// "srun: job 12 queued and waiting for resources"; "" for another line.
func srunJob(line, what string) string {
	rest, ok := strings.CutPrefix(line, "srun: job ")
	if !ok {
		return ""
	}
	n := digits(rest)
	if n == 0 || !strings.HasPrefix(rest[n:], what) {
		return ""
	}
	return rest[:n]
}

// srunQueued and srunGranted: the job waits, the job has its allocation.
func srunQueued(line string) string  { return srunJob(line, " queued and waiting for resources") }
func srunGranted(line string) string { return srunJob(line, " has been allocated resources") }

// srunExited is srun's "srun: error: NODE: task N: Exited with exit code
// C": the status npurun passes on itself.
func srunExited(line string) bool {
	rest, ok := strings.CutPrefix(line, "srun: error: ")
	if !ok {
		return false
	}
	node, rest, ok := strings.Cut(rest, ": task ")
	if !ok || node == "" || strings.ContainsAny(node, " \t\n\v\f\r") {
		return false
	}
	n := digits(rest)
	if n == 0 {
		return false
	}
	rest, ok = strings.CutPrefix(rest[n:], ": Exited with exit code ")
	if !ok {
		return false
	}
	n = digits(rest)
	return n > 0 && strings.TrimRight(rest[n:], " \t\n\v\f\r") == ""
}

// srunRefused is srun's saying that the job got no allocation.
func srunRefused(line string) bool {
	rest, ok := strings.CutPrefix(line, "srun: error: ")
	if !ok {
		return false
	}
	line, _, _ = strings.Cut(rest, "\n")
	return strings.HasPrefix(rest, "Unable to allocate resources") ||
		strings.HasPrefix(rest, "Unable to contact slurm controller") ||
		strings.Contains(line, "Socket timed out") ||
		strings.Contains(line, "Immediate execution impossible")
}

// digits is the length of s's leading decimal digits.
func digits(s string) int {
	n := 0
	for n < len(s) && s[n] >= '0' && s[n] <= '9' {
		n++
	}
	return n
}
